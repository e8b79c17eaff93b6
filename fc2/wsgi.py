"""WSGI entry point: gunicorn fc2.wsgi, and runserver through settings.WSGI_APPLICATION."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fc2.settings")
application = get_wsgi_application()
