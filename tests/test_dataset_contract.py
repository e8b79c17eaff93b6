"""The dataset contract (examples/README.md, "Dataset"), checked when a file is uploaded — from its .npy headers, never
by loading it — and again when a job is submitted with an upload stored before: a file that breaks it is refused at
every door (the wizard, the API, submit_job) with what it lacks, before any cluster is paid for, and leaves no file."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command

from fc2.models import Dataset, Job
from fc2.services import datasets
from tests.helpers import Api, code_form, good_npz, step_url

X, Y = np.zeros((30, 8, 8, 1), "float32"), np.arange(30) % 10
GOOD = {"x_train": X[:20], "y_train": Y[:20], "x_test": X[20:], "y_test": Y[20:]}


def npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def without(name: str) -> dict:
    return {key: value for key, value in GOOD.items() if key != name}


# The arrays of an .npz → a piece of the refusal.
BROKEN = [
    ({"points": X}, "the .npz lacks x_train (the training examples), y_train (their labels), x_test (the test "
     "examples), y_test (their labels); it holds points. The contract: a dataset is an .npz (numpy.savez) with"),
    (without("x_train"), "the .npz lacks x_train (the training examples); it holds x_test, y_test, y_train"),
    (without("y_test"), "the .npz lacks y_test (their labels)"),
    ({**GOOD, "x_train": np.zeros(20, "float32")}, "x_train is shaped (20,): it needs one row per example"),
    ({**GOOD, "x_test": np.full((10, 2), "a")}, "x_test holds <U1 values: the examples must be numbers"),
    ({**GOOD, "y_train": Y[:20].astype("float32")}, "y_train holds float32 values: the labels must be whole numbers"),
    ({**GOOD, "y_train": Y[:20].reshape(4, 5)}, "y_train is shaped (4, 5): it needs one label per example"),
    ({**GOOD, "y_test": Y[:9]}, "x_test holds 10 examples but y_test 9 labels"),
    ({**GOOD, "x_train": np.zeros((0, 8, 8, 1), "float32"), "y_train": Y[:0]}, "x_train holds no example"),
    ({**GOOD, "x_test": np.zeros((10, 8, 8, 3), "float32")},
     "x_train's examples are shaped (8, 8, 1) but x_test's (8, 8, 3)"),
    ({**GOOD, "x_train": np.array([None] * 20, dtype=object)}, "x_train.npy in the .npz holds Python objects"),
]  # fmt: skip


@pytest.mark.parametrize("arrays, message", BROKEN, ids=[row[1][:40] for row in BROKEN])
def test_an_npz_that_breaks_the_contract_is_refused_with_what_it_lacks(arrays, message):
    with pytest.raises(datasets.DatasetError) as refused:
        datasets.describe_npz(io.BytesIO(npz(**arrays)))
    assert message in str(refused.value)


# What the contract takes: an (n, h, w) image set, tabular rows, (n, 1) labels, unsigned labels.
KEPT = [
    (GOOD, (30, 64)),
    ({**GOOD, "x_train": X[:20, ..., 0], "x_test": X[20:, ..., 0]}, (30, 64)),
    ({**GOOD, "x_train": np.ones((20, 5)), "x_test": np.ones((10, 5))}, (30, 5)),
    ({**GOOD, "y_train": Y[:20].reshape(20, 1).astype("uint8")}, (30, 64)),
]


@pytest.mark.parametrize("arrays, described", KEPT)
def test_an_npz_that_keeps_the_contract_is_described(arrays, described):
    assert datasets.describe_npz(io.BytesIO(npz(**arrays))) == described


def test_a_zip_bomb_is_refused_from_its_directory_before_anything_is_unpacked():
    """Written as benchmarks/upload_npz_bomb.py writes one (a small file declaring a huge x_train), smaller."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("x_train.npy", npz_header((2**22,)) + bytes(2**24))
    with pytest.raises(datasets.DatasetError, match="looks like a zip bomb"):
        datasets.describe_npz(io.BytesIO(buffer.getvalue()))


def npz_header(shape: tuple[int, ...]) -> bytes:
    from numpy.lib import format as npy_format

    header = io.BytesIO()
    npy_format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return header.getvalue()


def stored(settings) -> list[Path]:
    root = Path(settings.MEDIA_ROOT) / "datasets"
    return sorted(p for p in root.rglob("*") if p.is_file() and "builtin" not in p.parts)


NOT_THE_CONTRACT = ("points.npz", npz(points=X))


def test_the_wizard_refuses_a_text_file_and_a_foreign_npz_beside_the_file(client, alice, bundle, settings):
    client.force_login(alice)
    assert client.post(step_url("code"), code_form(bundle=bundle)).status_code == 302

    text = client.post(step_url("data"), {"source": "upload", "file": SimpleUploadedFile("points.csv", b"x,y\n1,2\n")})
    foreign = client.post(step_url("data"), {"source": "upload", "file": SimpleUploadedFile(*NOT_THE_CONTRACT)})

    assert text.status_code == foreign.status_code == 400
    assert text.context["form"].errors["file"] == [
        f"points.csv is not an .npz file: {datasets.CONTRACT}",
    ]
    assert "the .npz lacks x_train (the training examples)" in foreign.context["form"].errors["file"][0]
    assert stored(settings) == [] and not Dataset.objects.filter(kind=Dataset.Kind.UPLOAD).exists()


def test_the_api_answers_400_with_the_reason_and_stores_nothing(client, alice, settings):
    api = Api(client, alice)

    refused = api.post("/api/datasets", files={"file": SimpleUploadedFile(*NOT_THE_CONTRACT)})
    taken = api.post("/api/datasets", files={"file": good_npz()})

    assert refused.status_code == 400
    assert "the .npz lacks x_train (the training examples)" in refused.json()["fields"]["file"][0]
    assert taken.status_code == 201 and len(stored(settings)) == 1


def test_submit_job_refuses_an_upload_stored_before_the_contract_was_checked(alice, example_wheel, settings):
    """A dataset stored by an earlier release, a text file: refused at submission, exit non-zero, no job."""
    old = Dataset(owner=alice, kind=Dataset.Kind.UPLOAD, name="legacy")
    old.file.save("legacy.csv", SimpleUploadedFile("legacy.csv", b"x,y\n1,2\n"), save=False)
    old.path = old.file.path
    old.save()
    args = ("--bundle", str(example_wheel), "--dataset", "legacy", "--user", "alice", "--provider", "local")

    err = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("submit_job", *args, stdout=io.StringIO(), stderr=err)

    assert exited.value.code != 0
    assert "dataset 'legacy' cannot be used: the .npz file is not a zip archive" in err.getvalue()
    assert not Job.objects.exists()
