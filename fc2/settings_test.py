"""Settings for the test suite: fc2.settings in development mode (DEBUG on, a throwaway key).

A settings module rather than a conftest.py, because pytest-django imports the settings before any conftest runs. The
values go into os.environ, not only into these settings, so that the processes tests start (Celery workers,
manage.py, the platform's own subprocesses) load the same way. DEBUG is forced rather than defaulted: the tests are
written for development mode (plain static files, no HTTPS-only cookies), whatever the calling shell exports.
"""

import os

os.environ["DEBUG"] = "true"
os.environ.setdefault("SECRET_KEY", "tests-only-insecure-key")
# No test polls an instance metadata service (a spot notice is raised through the agent's file instead).
os.environ.setdefault("FC2_AWS_METADATA_URL", "")
# `make test` runs several TensorFlow clusters at once on a few cores, where a short run's code (a profiling run's, a
# trial's) has taken over a minute to start; only code that never ends waits this long.
os.environ.setdefault("FC2_RUN_START_S", "300")

# Under pytest-xdist (`make test`'s parallel part) each worker process gets a data directory of its own under
# FC2_VAR_DIR: the shared cache that every test clears, the filesystem broker, the SQLite test database. Set once, in
# the worker: the processes its tests start inherit both variables and so the same directory.
_worker = os.environ.get("PYTEST_XDIST_WORKER")
if _worker and os.environ.get("FC2_TEST_WORKER") != _worker:
    _base = os.environ.get("FC2_VAR_DIR") or os.path.join(os.path.dirname(os.path.dirname(__file__)), "var")
    os.environ["FC2_VAR_DIR"] = os.path.join(_base, f"xdist-{_worker}")
    os.environ["FC2_TEST_WORKER"] = _worker

from fc2.settings import *  # noqa: E402, F403
