"""Settings for the test suite: fc2.settings in development mode (DEBUG on, a throwaway key).

A settings module rather than a conftest.py, because pytest-django imports the settings before any conftest runs. The
values go into os.environ, not only into these settings, so that the processes tests start (Celery workers,
manage.py, the platform's own subprocesses) load the same way. DEBUG is forced rather than defaulted: the tests are
written for development mode (plain static files, no HTTPS-only cookies), whatever the calling shell exports.
"""

import os

os.environ["DEBUG"] = "true"
os.environ.setdefault("SECRET_KEY", "tests-only-insecure-key")

from fc2.settings import *  # noqa: E402, F403
