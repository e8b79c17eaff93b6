"""The recommender's admin: catalogues and their types, and performance records — where an operator finds, corrects,
deletes or promotes (makes the platform's) a user's record."""

from django.contrib import admin, messages
from django.http import HttpRequest

from recommender import service
from recommender.models import Catalog, InstanceType, PerformanceRecord, PerformanceRecordQuerySet


class InstanceTypeInline(admin.TabularInline):
    model = InstanceType
    extra = 0


@admin.register(Catalog)
class CatalogAdmin(admin.ModelAdmin):
    list_display = ("name", "version", "provider", "region", "updated_at")
    inlines = [InstanceTypeInline]


@admin.register(InstanceType)
class InstanceTypeAdmin(admin.ModelAdmin):
    list_display = ("name", "catalog", "role", "hourly_price", "vcpu", "ecu", "memory_gib", "gpus", "network_mbps")
    list_filter = ("catalog", "role")
    search_fields = ("name",)
    list_editable = ("hourly_price", "network_mbps")


@admin.register(PerformanceRecord)
class PerformanceRecordAdmin(admin.ModelAdmin):
    """The measurements the algorithms and the model learn from: an operator finds, corrects or deletes a bad one here
    (the recommender's answers follow within its memo's few seconds, recommender/service.py)."""

    # What tells one run from another, few enough columns to fit a 1366 px screen beside the filters.
    list_display = (
        "workload",
        "strategy",
        "instance_type",
        "workers",
        "batch_size",
        "latency_ms",
        "epoch_time_s",
        "source",
        "owner",
    )
    list_filter = ("source", "strategy", ("owner", admin.EmptyFieldListFilter), "workload")
    search_fields = ("workload", "instance_type", "ps_type", "origin", "owner__username")
    date_hierarchy = "created_at"
    readonly_fields = ("created_at", "updated_at", "promoted_from", "unusable")
    list_select_related = ("owner",)
    list_per_page = 50
    actions = ["promote"]

    @admin.action(description="Promote to the platform's records (every user's answers read them)")
    def promote(self, request: HttpRequest, queryset: PerformanceRecordQuerySet) -> None:
        promoted, left = service.promote(queryset)
        self.message_user(request, f"{promoted} records promoted to the platform's.")
        if left:
            self.message_user(
                request, f"{left} left as they were: a figure out of its bound, or marked unusable.", messages.WARNING
            )
