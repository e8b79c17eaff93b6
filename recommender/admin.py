from django.contrib import admin

from recommender.models import Catalog, InstanceType


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
