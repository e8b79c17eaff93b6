"""What a newcomer meets first: a README that points only inside the repository and says what is true, and a `make run`
that keeps the demo passwords where they can be found and prints no warning nobody could act on."""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import sys
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from fc2.management.commands.setup_platform import passwords_file, save_passwords
from fc2.models import workload_name
from tests.conftest import PROJECT_DIR

README = (PROJECT_DIR / "README.md").read_text()
MAKEFILE = (PROJECT_DIR / "Makefile").read_text()


# --- the demo accounts' passwords -------------------------------------------------------------------------------------


@pytest.fixture
def var_dir(settings, tmp_path):
    settings.VAR_DIR = tmp_path / "var"
    settings.VAR_DIR.mkdir()
    return settings.VAR_DIR


def setup_platform() -> str:
    out = StringIO()
    call_command("setup_platform", stdout=out)
    return out.getvalue()


def saved_passwords() -> dict[str, str]:
    lines = passwords_file().read_text().splitlines()
    return dict(line.split(" ") for line in lines if not line.startswith("#"))


@pytest.mark.django_db
def test_setup_writes_the_passwords_to_a_file_only_its_owner_reads(var_dir):
    printed = setup_platform()

    path = var_dir / "demo-passwords.txt"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    passwords = saved_passwords()
    assert set(passwords) == {"admin", "researcher"}
    for username, password in passwords.items():
        assert get_user_model().objects.get(username=username).check_password(password)
        assert password not in printed  # the terminal scrolls; the file stays
    assert f"their passwords are in {path}" in printed
    assert "changepassword" in path.read_text()


@pytest.mark.django_db
def test_a_second_setup_keeps_the_file_and_a_recreated_account_replaces_only_its_line(var_dir):
    setup_platform()
    first = saved_passwords()

    assert "demo accounts" not in setup_platform()
    assert saved_passwords() == first

    get_user_model().objects.filter(username="researcher").delete()
    setup_platform()
    again = saved_passwords()
    assert again["admin"] == first["admin"] and again["researcher"] != first["researcher"]
    assert stat.S_IMODE(passwords_file().stat().st_mode) == 0o600


def test_an_existing_file_open_to_others_is_replaced_by_one_that_is_not(tmp_path):
    path = tmp_path / "demo-passwords.txt"
    path.write_text("admin old\n")
    path.chmod(0o644)

    save_passwords(path, {"researcher": "new"})

    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().splitlines()[1:] == ["admin old", "researcher new"]


def run_recipe() -> str:
    return MAKEFILE.split("\nrun: setup\n", 1)[1].split("\n\n", 1)[0]


def test_make_run_says_where_the_passwords_are_just_before_the_servers_start():
    recipe = run_recipe()

    assert recipe.index("demo-passwords.txt") < recipe.index("manage.py serve")
    assert "demo-passwords.txt" in README


# --- warnings nobody could act on -------------------------------------------------------------------------------------


def warning_filter(recipe: str) -> str:
    """The PYTHONWARNINGS a Makefile recipe gives its command."""
    (value,) = re.findall(r'PYTHONWARNINGS=("[^"]*")', recipe)
    return shlex.split(value)[0]


def celery_warning_filter() -> str:
    return warning_filter(run_recipe())


def warnings_shown(filter_: str, code: str) -> str:
    env = {**os.environ, "PYTHONWARNINGS": filter_}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stderr


def test_the_worker_s_root_warning_alone_is_silenced():
    # The platform runs as root because the job sandbox needs it; Celery's advice (--uid) would refuse every local job.
    root_warning = "from celery.platforms import _warn_or_raise_security_error as w; w(0, 0, 0, 0, False)"
    assert "superuser privileges" in warnings_shown("default", root_warning)
    assert warnings_shown(celery_warning_filter(), root_warning) == ""
    assert "another" in warnings_shown(celery_warning_filter(), "import warnings; warnings.warn('another')")


def test_the_worker_accepts_no_pickle_so_root_is_only_discouraged_not_dangerous():
    from fc2.celery import app

    assert list(app.conf.accept_content) == ["json"] and app.conf.task_serializer == "json"


def test_the_embedded_broker_names_its_host(settings):
    # Without one, kombu warns "No hostname was supplied" at every connection, in the worker and in submit_job.
    from kombu import Connection

    assert Connection(settings.CELERY_BROKER_URL).hostname


# --- README truths ----------------------------------------------------------------------------------------------------


def test_the_readme_points_to_nothing_outside_the_repository():
    assert "../" not in README
    for link in re.findall(r"\]\(([^)#]+)\)", README):
        if "://" not in link:
            assert (PROJECT_DIR / link).exists(), link
    assert "](docs/DESIGN.md)" in README


def test_the_design_and_style_it_cites_are_in_the_repository():
    for name in ("DESIGN.md", "STYLE.md"):
        text = (PROJECT_DIR / "docs" / name).read_text()
        assert "../shared" not in text
    assert "## Contracts other tools rely on" in (PROJECT_DIR / "docs" / "DESIGN.md").read_text()


def test_the_readme_mentions_port_and_host_as_the_makefile_has_them():
    assert "HOST ?=" in MAKEFILE and "PORT ?=" in MAKEFILE
    assert re.search(r"make run PORT=\S+ HOST=\S+", README)


@pytest.mark.django_db
def test_the_readme_names_the_example_job_s_workload_as_the_code_does(bundle, digits):
    assert "<distribution>:<dataset name>" in README
    assert f"`{workload_name(bundle, digits)}`" in README
    assert f"import_perf_data my-runs.csv --format anwar2021 --workload {workload_name(bundle, digits)}" in README


def test_installing_filters_only_setuptools_caution_about_editable_installs():
    install = MAKEFILE.split("$(BIN)/.installed: pyproject.toml\n", 1)[1].split("\n\n", 1)[0]
    caution = "import warnings; warnings.warn('Editable installation.\\n!!\\nPlease be careful with folders')"
    assert "Editable installation" in warnings_shown("default", caution)
    assert warnings_shown(warning_filter(install), caution) == ""


def test_the_examples_build_with_the_setuptools_the_venv_gets():
    # `make examples` builds without isolation, with the venv's setuptools; one older than the examples ask for warns.
    import tomllib

    from packaging.requirements import Requirement

    dev = tomllib.loads((PROJECT_DIR / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    (pinned,) = [Requirement(r) for r in dev if Requirement(r).name == "setuptools"]
    example = tomllib.loads((PROJECT_DIR / "examples" / "digits_cnn" / "pyproject.toml").read_text())
    (wanted,) = [Requirement(r) for r in example["build-system"]["requires"] if Requirement(r).name == "setuptools"]
    (version,) = [spec.version for spec in pinned.specifier if spec.operator == "=="]
    assert wanted.specifier.contains(version)


@pytest.mark.django_db
def test_setup_names_each_sample_file_once_with_its_strategy(var_dir):
    lines = [line for line in setup_platform().splitlines() if line.startswith("performance records")]

    assert len(lines) == len(set(lines)) >= 3
    assert "performance records lab-digits-grid (mirrored) from lab-digits-grid.csv: " in "\n".join(lines)
    assert "performance records lab-digits-grid (ps) from lab-digits-ps-grid.csv: " in "\n".join(lines)
