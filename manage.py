#!/usr/bin/env python
"""Django's command-line utility for the FC² platform."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fc2.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:  # a setting missing or wrong: one line saying what to set, not a traceback
        sys.exit(f"error: {exc}")
