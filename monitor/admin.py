from django.contrib import admin

from monitor.models import NodeSample


@admin.register(NodeSample)
class NodeSampleAdmin(admin.ModelAdmin):
    list_display = ("node", "at", "cpu_percent", "memory_mb", "gpu_percent", "bytes_sent", "bytes_recv", "step")
    list_filter = ("node__job",)
