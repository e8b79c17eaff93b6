"""WSGI entry point (gunicorn fc2.wsgi; runserver through settings.WSGI_APPLICATION): Django, behind which the
recommender's repeated GETs and small POSTs are answered again without its request handling (fc2/answer_cache.py)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fc2.settings")
django_application = get_wsgi_application()

from fc2.answer_cache import AnswerCache  # noqa: E402 (needs the settings django.setup() loaded)

application = AnswerCache(django_application)
