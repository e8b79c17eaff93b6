"""What a bundle stored before migration 0027 requires, read from its wheel: its framework and CUDA-only dependency
(issue 46), which an upload reads since, and which a bundle stored before kept blank until its wheel came again.

Each wheel is read by the upload's own validator (fc2.bundles.validate_wheel), as its row names it (file name, main
script, size). A file that is missing, unreadable, no longer passes, or is not the one stored (another SHA-256)
leaves its row as it is: a blank framework is what the job service treats as unknown (the job says which)."""

from django.db import migrations

from fc2.bundles import validate_wheel


def read_requirements(apps, schema_editor):
    CodeBundle = apps.get_model("fc2", "CodeBundle")
    # Only a row blank in both may be unread: one read since 0027 with neither framework nor CUDA dependency reads the
    # same again.
    for bundle in CodeBundle.objects.filter(framework="", cuda_requirement="").iterator():
        try:
            with bundle.wheel.open("rb") as wheel:
                info = validate_wheel(wheel, bundle.filename, bundle.main_script, max_bytes=bundle.size_bytes)
        except (OSError, ValueError):  # (BundleError is a ValueError, as is a row with no file)
            continue
        if info.sha256 == bundle.sha256 and (info.framework or info.cuda_requirement):
            CodeBundle.objects.filter(pk=bundle.pk).update(
                framework=info.framework, cuda_requirement=info.cuda_requirement
            )


class Migration(migrations.Migration):
    dependencies = [("fc2", "0029_checkpoint_step")]

    operations = [migrations.RunPython(read_requirements, migrations.RunPython.noop)]
