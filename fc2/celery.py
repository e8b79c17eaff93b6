"""The Celery application: configured from Django settings (CELERY_*), tasks found in every installed app."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fc2.settings")

app = Celery("fc2")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
