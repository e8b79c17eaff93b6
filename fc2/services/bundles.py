"""Storing code bundles: validate first, then write the file and the row together — or neither."""

from __future__ import annotations

from typing import TYPE_CHECKING, BinaryIO

from django.core.files import File

from fc2.bundles import validate_wheel
from fc2.models import CodeBundle
from fc2.services.files import atomic_with_files, track

if TYPE_CHECKING:
    from django.contrib.auth.models import User


def store_bundle(owner: User, fileobj: BinaryIO, filename: str, main_script: str = "main.py") -> CodeBundle:
    """Validate the wheel (BundleError if refused) and store it; within `atomic_with_files`, a later failure of the
    caller's transaction removes the file again. The same wheel (by sha256) with the same main script uploaded again by
    the same owner is the bundle already stored: one library entry, one file (what its METADATA requires read again,
    for a bundle stored before the platform read it whose file migration 0030 could not read)."""
    info = validate_wheel(fileobj, filename, main_script)
    existing = CodeBundle.objects.filter(owner=owner, sha256=info.sha256, main_script=info.main_script).first()
    if existing is not None:
        read = {"framework": info.framework, "cuda_requirement": info.cuda_requirement}
        if any(getattr(existing, name) != value for name, value in read.items()):
            CodeBundle.objects.filter(pk=existing.pk).update(**read)
            existing.refresh_from_db(fields=list(read))
        return existing
    bundle = CodeBundle(
        owner=owner,
        name=info.distribution,
        filename=filename,
        distribution=info.distribution,
        version=info.version,
        main_script=info.main_script,
        size_bytes=info.size_bytes,
        sha256=info.sha256,
        framework=info.framework,
        cuda_requirement=info.cuda_requirement,
    )
    with atomic_with_files():
        bundle.wheel.save(filename, File(fileobj, name=filename), save=False)
        track(bundle.wheel)
        bundle.save()
    return bundle
