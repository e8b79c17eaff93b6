from django.contrib import admin

from fc2.models import Artifact, CodeBundle, Dataset, Job, JobEvent, Node


@admin.register(CodeBundle)
class CodeBundleAdmin(admin.ModelAdmin):
    list_display = ("id", "distribution", "version", "main_script", "owner", "size_bytes", "created_at")
    list_filter = ("owner",)
    search_fields = ("distribution", "filename", "sha256")


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "kind", "owner", "size_mb", "features", "rows", "created_at")
    list_filter = ("kind",)
    search_fields = ("name", "url", "path")


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    readonly_fields = ("at", "state", "message")


class NodeInline(admin.TabularInline):
    model = Node
    extra = 0
    fields = ("name", "role", "address", "status", "exit_code", "step", "loss", "last_report_at")
    readonly_fields = fields


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("id", "owner", "state", "provider", "strategy", "workers", "created_at", "finished_at")
    list_filter = ("state", "provider", "strategy")
    search_fields = ("owner__username", "failure_reason")
    readonly_fields = ("token_hash", "cluster")
    inlines = [NodeInline, JobEventInline]


@admin.register(JobEvent)
class JobEventAdmin(admin.ModelAdmin):
    list_display = ("job", "at", "state", "message")
    list_filter = ("state",)


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("job", "name", "role", "address", "status", "last_report_at")
    list_filter = ("status", "role")


@admin.register(Artifact)
class ArtifactAdmin(admin.ModelAdmin):
    list_display = ("job", "name", "size_bytes", "created_at")
