from django.contrib import admin

from monitor.models import LossPoint, NodeSample


@admin.register(NodeSample)
class NodeSampleAdmin(admin.ModelAdmin):
    list_display = ("node", "at", "cpu_percent", "memory_mb", "gpu_percent", "bytes_sent", "bytes_recv")
    list_filter = ("node__job",)


@admin.register(LossPoint)
class LossPointAdmin(admin.ModelAdmin):
    list_display = ("node", "at", "printed_at", "epoch", "step", "loss")
    list_filter = ("node__job",)
