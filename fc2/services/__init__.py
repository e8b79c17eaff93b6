"""Business operations as plain functions; views, commands and Celery tasks are thin callers of these."""
