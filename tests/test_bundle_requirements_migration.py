"""Bundles stored before the platform read what a wheel requires (migration fc2 0030): each stored wheel is read again
by the upload's validator and its framework and CUDA-only dependency filled in; a missing, unreadable or replaced file
leaves its row as it was."""

from __future__ import annotations

import hashlib

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from fc2.models import CodeBundle
from harness.wheels import FILENAME, make_wheel
from tests.helpers import migrate
from tests.test_frameworks import requiring

BEFORE = [("fc2", "0029_checkpoint_step")]


def wheel_bytes(tmp_path, *requirements: str) -> bytes:
    return make_wheel(tmp_path, requiring(*requirements)).read_bytes()


@pytest.mark.django_db(transaction=True)
def test_stored_bundles_get_the_framework_their_wheel_requires(tmp_path, alice):
    torch, cuda = wheel_bytes(tmp_path, "torch>=2"), wheel_bytes(tmp_path, "torch==2.3.0+cu121")
    tensorflow, neither = wheel_bytes(tmp_path, "tensorflow-cpu"), wheel_bytes(tmp_path, "numpy")
    # name -> (what its row says the wheel was, the file stored under it: None for none at all)
    stored = {
        "torch": (torch, torch),
        "cuda": (cuda, cuda),
        "tensorflow": (tensorflow, tensorflow),
        "neither": (neither, neither),
        "missing": (torch, None),
        "unreadable": (torch, b"not a zip at all"),
        "replaced": (tensorflow, torch),  # the file on disk is no longer the wheel validated
    }
    leaves = MigrationExecutor(connection).loader.graph.leaf_nodes()
    try:
        old = migrate(BEFORE).loader.project_state(BEFORE).apps.get_model("fc2", "CodeBundle")
        pks = {}
        for name, (validated, on_disk) in stored.items():
            path = f"bundles/{alice.pk}/{name}/{FILENAME}"
            if on_disk is not None:
                path = default_storage.save(path, ContentFile(on_disk))
            pks[name] = old.objects.create(
                owner_id=alice.pk, name=name, wheel=path, filename=FILENAME, distribution="demo", version="1.0",
                main_script="demo/main.py", size_bytes=len(validated), sha256=hashlib.sha256(validated).hexdigest(),
            ).pk  # fmt: skip
    finally:
        migrate(leaves)

    read = {
        name: tuple(CodeBundle.objects.values_list("framework", "cuda_requirement").get(pk=pk))
        for name, pk in pks.items()
    }
    assert read == {
        "torch": ("pytorch", ""),
        "cuda": ("pytorch", "torch==2.3.0+cu121"),
        "tensorflow": ("tensorflow", ""),
        "neither": ("", ""),
        "missing": ("", ""),
        "unreadable": ("", ""),
        "replaced": ("", ""),
    }
