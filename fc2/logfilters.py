"""Logging filters that keep the platform's logs to what someone may act on (settings.LOGGING uses them).

- PeriodicTasks: Celery logs three INFO lines for every task it runs (beat's "Sending due task", the worker's
  "received" and "succeeded in"); for the sweep, every few seconds, they were a quarter of `make run`'s log. The
  periodic tasks' lines are dropped; a job step's lines, and any warning or error (a periodic task that fails), stay.
- LateReports: a node's report answered 409 (its job has ended: the agent stops reporting, monitor/agent.py) is the
  normal end of a late report, not a warning: the development server logs its request line at INFO like any other
  answer (the view already keeps it out of django.request's warnings, fc2/api.py). Any other 4xx or 5xx keeps its
  level.

Both are built from settings alone: this module imports nothing of Django's models (logging is set up first).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping

REPORT_LINE = re.compile(r"^POST /api/(?:v1/)?jobs/\d+/report[?\s]")  # v1, or its alias (older agents)


class PeriodicTasks(logging.Filter):
    """Drops Celery's INFO lines about the given tasks (as beat and the worker name them)."""

    def __init__(self, tasks: Iterable[str]) -> None:
        super().__init__()
        self.tasks = frozenset(tasks)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO:
            return True
        args = record.args
        # The worker's lines carry a context dict with the task's name; beat's, (entry name, task name).
        names = [args.get("name")] if isinstance(args, Mapping) else list(args or ())
        return not any(name in self.tasks for name in names if isinstance(name, str))


class LateReports(logging.Filter):
    """The development server's request line for a 409 to a node's report, at INFO like any answer."""

    def filter(self, record: logging.LogRecord) -> bool:
        # django.server logs (request line, status, size) with the status also in status_code; 4xx at WARNING.
        request_line = record.args[0] if isinstance(record.args, tuple) and record.args else ""
        if getattr(record, "status_code", None) == 409 and REPORT_LINE.search(str(request_line)):
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True
