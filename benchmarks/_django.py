"""Django set up inside a benchmark's own process, one way for every script that calls the platform's code in-process.

The platform's settings (fc2.settings) on a var dir of the benchmark's own, so that nothing of the developer's var/
is touched, and by default on the SQLite database in it, so that a DATABASE_URL left in the shell is never migrated
or written by a benchmark. DEBUG is on unless the caller's environment says otherwise (as `make benchmark` sets it):
off, the settings want a SECRET_KEY. What a script needs beyond that (its own database, a provider's variables) it
passes as parameters.

Not a benchmark: the scripts import it as they import each other, `from benchmarks._django import setup_django`,
once the project is on sys.path.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def setup_django(var_dir: Path | None = None, *, database_url: str | None = None, **environ: str) -> Path:
    """Set Django up and return the FC2_VAR_DIR it runs on: `var_dir`, or a new scratch directory when None (left for
    the script to remove, or not). `database_url` is the database it uses, None for the var dir's SQLite; `environ`
    are further variables the settings read, set as given (over the caller's).

    Django is set up once a process: a later call (a helper that sets up on demand, called again) changes nothing
    and returns the var dir already in use.
    """
    from django.apps import apps

    if apps.ready:
        from django.conf import settings

        return Path(settings.VAR_DIR)
    var_dir = var_dir or Path(tempfile.mkdtemp(prefix="fc2-bench-"))
    os.environ.update(FC2_VAR_DIR=str(var_dir), DJANGO_SETTINGS_MODULE="fc2.settings")
    os.environ.setdefault("DEBUG", "1")
    os.environ.update(environ)
    if database_url is None:
        os.environ.pop("DATABASE_URL", None)
    else:
        os.environ["DATABASE_URL"] = database_url
    import django

    django.setup()
    return var_dir
