"""The admin: uploads may be corrected; jobs, and what the pipeline and the nodes write (their samples and loss points
too, registered here since monitor/ knows no fc2), are shown, never edited.

A job's state moves only through fc2.services.pipeline, whose steps claim a job by a conditional update on its state: a
form that moved it (or rewrote its token, cluster or lease) would start or orphan work behind the pipeline's back.
"""

from django.contrib import admin
from django.contrib.admin.widgets import AdminFileWidget
from django.db import models
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from fc2.models import ApiToken, Artifact, CodeBundle, Dataset, Job, JobEvent, Node, ReapedCluster
from monitor.models import LossPoint, NodeSample


class StoredFileInput(AdminFileWidget):
    """The admin's file input naming the stored file without a link to it: nothing is served under MEDIA_URL (a
    job's artifacts download through its page, which checks who asks)."""

    template_name = "fc2/admin/stored_file_input.html"


class ReadOnly:
    """Rows the platform writes (nodes, artifacts, events, samples, losses): to look at, and to go with their job when
    it is deleted."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


class RecordAdmin(ReadOnly, admin.ModelAdmin):
    pass


class RecordInline(ReadOnly, admin.TabularInline):
    extra = 0
    can_delete = False


@admin.register(CodeBundle)
class CodeBundleAdmin(admin.ModelAdmin):
    list_display = ("id", "distribution", "version", "main_script", "owner", "size_bytes", "created_at")
    list_filter = ("owner",)
    search_fields = ("distribution", "filename", "sha256")
    formfield_overrides = {models.FileField: {"widget": StoredFileInput}}


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "kind", "owner", "size_mb", "features", "rows", "created_at")
    list_filter = ("kind",)
    search_fields = ("name", "url", "path")
    # As the wizard's URL field: a URL typed without a scheme is https (Django 6's default; 5.x warns on its own).
    formfield_overrides = {
        models.URLField: {"assume_scheme": "https"},
        models.FileField: {"widget": StoredFileInput},
    }


class JobEventInline(RecordInline):
    model = JobEvent
    fields = ("at", "state", "message")


class NodeInline(RecordInline):
    model = Node
    fields = ("name", "role", "address", "status", "exit_code", "step", "loss", "last_report_at")


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    # Dates as "2026-11-26 21:50" (not "Nov. 26, 2026, 9:50 p.m."): the list fits a 1366 px screen beside its filters.
    list_display = ("id", "owner", "state", "provider", "strategy", "workers", "submitted", "finished")
    list_filter = ("state", "provider", "strategy")
    search_fields = ("owner__username", "failure_reason")
    inlines = [NodeInline, JobEventInline]
    exclude = ("token_hash",)  # even a hash of the agents' secret stays off the page; token_set says if there is one

    def get_readonly_fields(self, request, obj=None) -> list[str]:
        return [field.name for field in Job._meta.concrete_fields if field.name not in ("id", *self.exclude)] + [
            "token_set"
        ]

    def has_change_permission(self, request, obj=None) -> bool:
        # Shown, never edited: the request is kept as it came (its recommend step and a re-run read it), and the
        # pipeline alone moves the state, token, cluster and lease. A job to run otherwise is a new job (Re-run).
        return False

    def has_add_permission(self, request) -> bool:
        return False  # a job starts through jobs.submit (wizard, API, submit_job), which sends it down the pipeline

    @admin.display(boolean=True, description="token set")
    def token_set(self, job: Job) -> bool:
        return bool(job.token_hash)

    @admin.display(description="Submitted", ordering="created_at")
    def submitted(self, job: Job) -> str:
        return short_time(job.created_at)

    @admin.display(description="Finished", ordering="finished_at")
    def finished(self, job: Job) -> str:
        return short_time(job.finished_at)


def short_time(moment) -> str:
    """A moment in the site's time zone to the minute, "–" for none."""
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M") if moment else "–"


@admin.register(JobEvent)
class JobEventAdmin(RecordAdmin):
    list_display = ("job", "at", "state", "message")
    list_filter = ("state",)


@admin.register(Node)
class NodeAdmin(RecordAdmin):
    list_display = ("job", "name", "role", "address", "status", "last_report_at")
    list_filter = ("status", "role")


@admin.register(NodeSample)
class NodeSampleAdmin(RecordAdmin):
    list_display = ("node", "at", "cpu_percent", "memory_mb", "gpu_percent", "bytes_sent", "bytes_recv")
    list_filter = ("node__job",)


@admin.register(LossPoint)
class LossPointAdmin(RecordAdmin):
    list_display = ("node", "at", "printed_at", "epoch", "step", "loss")
    list_filter = ("node__job",)


@admin.register(Artifact)
class ArtifactAdmin(RecordAdmin):
    list_display = ("job", "name", "size_bytes", "not_kept", "created_at")
    fields = ("job", "node", "name", "original_name", "download", "size_bytes", "not_kept", "created_at")
    readonly_fields = ("download",)

    @admin.display(description="File")
    def download(self, artifact: Artifact) -> str:
        """The job page's download link (the stored file's own path is not served); none for an output not kept."""
        if artifact.not_kept:
            return "—"
        return format_html(
            '<a href="{}">{}</a>', reverse("artifact-download", args=[artifact.job_id, artifact.pk]), artifact.name
        )


@admin.register(ReapedCluster)
class ReapedClusterAdmin(RecordAdmin):
    list_display = ("cluster_name", "provider", "region", "job_number", "resource_count", "by", "reaped_at")
    list_filter = ("provider", "by")
    search_fields = ("cluster_name",)
    date_hierarchy = "reaped_at"

    @admin.display(description="resources removed")
    def resource_count(self, reaping: ReapedCluster) -> int:
        return len(reaping.resources)


@admin.register(ApiToken)
class ApiTokenAdmin(RecordAdmin):
    """Every user's personal API tokens: who, what for, when made, last used, expiring and revoked. Never a secret
    (none is kept) nor its hash. An admin revokes one with the action; tokens are made by their users."""

    list_display = ("name", "user", "prefix", "status", "created_at", "last_used_at", "expires_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("name", "user__username", "prefix")
    fields = ("user", "name", "prefix", "status", "created_at", "last_used_at", "expires_at", "revoked_at")
    readonly_fields = fields
    actions = ["revoke"]

    @admin.display(description="status")
    def status(self, token: ApiToken) -> str:
        return token.status

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset) -> None:
        revoked = sum(token.revoke() for token in queryset)
        self.message_user(request, f"{revoked} token{'s' if revoked != 1 else ''} revoked.")
