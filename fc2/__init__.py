"""The FC² platform: accounts, bundles, datasets, jobs and their pipeline, pages and the reporting API."""

from fc2.celery import app as celery_app

__all__ = ["celery_app"]
