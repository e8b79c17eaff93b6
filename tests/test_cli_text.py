"""Commands' output without --json is for people: lines that say what was done, never a JSON dump."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def said(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_cluster_up_list_down_and_reap_speak_in_lines():
    up = said("cluster", "up", "--provider", "local", "--worker-type", "local", "--workers", "1", "--name", "by-hand")
    try:
        assert up.startswith("cluster by-hand on local (ps): 3 nodes\n  ps-0  ps")
        listed = said("cluster", "list", "--provider", "local")
        assert "cluster by-hand on local (ps): 3 nodes" in listed
    finally:
        down = said("cluster", "down", "by-hand", "--provider", "local")
    assert down.startswith("removed cluster by-hand on local: ")
    assert said("cluster", "list", "--provider", "local") == "no clusters\n"
    assert said("cluster", "reap", "--provider", "local", "--all") == "no leftover cluster on local\n"
    for text in (up, listed, down):
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)
