"""What hostile or clumsy input costs before it is refused: request bodies over their endpoint's limit, .npz files
that declare more than they hold, non-finite resource samples and over-long artifact names — each refused (or made
safe) with its reason, nothing stored, nothing spooled."""

from __future__ import annotations

import io
import json
import select
import socket
import struct
import time
import zipfile
from pathlib import Path
from unittest import mock
from urllib.parse import urlsplit

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from numpy.lib import format as npy_format

from fc2.bundles import MB
from fc2.models import Artifact, CodeBundle, Dataset, Job, Node
from fc2.services import datasets
from fc2.services.artifacts import artifact_name
from fc2.services.reports import Report, apply_report
from harness.wheels import FILENAME, GOOD, make_wheel
from monitor.models import LossPoint, NodeSample

GIB = 1024 * MB
BOUNDARY = "fc2testboundary"
MULTIPART = f"multipart/form-data; boundary={BOUNDARY}"


def step_url(step: str) -> str:
    return reverse("job-new-step", args=[step])


def media_files(settings) -> list[Path]:
    """Files under MEDIA_ROOT other than the materialised built-in datasets."""
    return [p for p in Path(settings.MEDIA_ROOT).rglob("*") if p.is_file() and "builtin" not in p.parts]


# --- request bodies ---------------------------------------------------------------------------------------------------


class EndlessUpload(io.RawIOBase):
    """A multipart body that never ends: a few form fields, then one file of `fill` bytes forever; counts what the
    server reads, so a test can tell how far it got."""

    def __init__(self, file_field: str = "wheel", filename: str = FILENAME, fields: dict | None = None) -> None:
        parts = [
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
            for name, value in (fields or {"source": "upload", "main_script": "main.py"}).items()
        ]
        parts.append(
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{file_field}"; filename="{filename}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        )
        self._head = "".join(parts).encode()
        self.read_bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        size = len(buffer)
        head = self._head[self.read_bytes : self.read_bytes + size]
        buffer[: len(head)] = head
        buffer[len(head) : size] = b"x" * (size - len(head))
        self.read_bytes += size
        return size


def post_endless(client, url: str, declared: int, body: EndlessUpload, **headers):
    """POST `body` declaring `declared` bytes, as a client whose file is bigger than any limit would."""
    environ = {"CONTENT_TYPE": MULTIPART, "CONTENT_LENGTH": str(declared), "wsgi.input": body}
    return client.generic("POST", url, **environ, **headers)


@pytest.fixture
def spool(settings, tmp_path) -> Path:
    """Where Django spools uploads to disk, made to catch every file above 64 KB."""
    settings.FILE_UPLOAD_TEMP_DIR = tmp_path / "spool"
    settings.FILE_UPLOAD_TEMP_DIR.mkdir()
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 64 * 1024
    return settings.FILE_UPLOAD_TEMP_DIR


@pytest.mark.parametrize(
    "url", [step_url("code"), step_url("data"), reverse("login"), reverse("job-list"), reverse("job-new")]
)
def test_anonymous_large_post_is_refused_unread(client, db, url, spool):
    body = EndlessUpload()

    response = post_endless(client, url, 300 * MB, body)

    assert response.status_code == 413
    assert response.content.decode() == (
        "Refused: the request is 300 MB, above the 5 MB limit for a request from someone not signed in.\n"
    )
    assert body.read_bytes == 0
    assert not list(spool.iterdir())


def test_gib_wheel_is_refused_from_its_content_length(client, alice, settings, spool):
    settings.FC2_MAX_BUNDLE_MB = 50
    client.force_login(alice)
    body = EndlessUpload()

    response = post_endless(client, step_url("code"), GIB, body)

    assert response.status_code == 413
    assert "the request is 1 GB, above the 55 MB limit for a wheel" in response.content.decode()
    assert body.read_bytes == 0


@pytest.mark.parametrize(
    ("step", "field", "setting", "reason"),
    [
        ("code", "wheel", "FC2_MAX_BUNDLE_MB", "the wheel is larger than the 1 MB limit"),
        ("data", "file", "FC2_MAX_DATASET_MB", "the dataset file is larger than 1 MB"),
    ],
)
def test_upload_is_cut_off_as_it_passes_the_limit(client, alice, bundle, settings, spool, step, field, setting, reason):
    """Content-Length within the body limit (the file's limit and the other fields' allowance), the file itself over
    its own: the stream stops within a chunk of the limit, the spooled part is deleted, nothing is stored."""
    setattr(settings, setting, 1)
    client.force_login(alice)
    if step == "data":
        session = client.session
        session["fc2_wizard"] = {"code": {"bundle": bundle.pk, "parameters": {}}}
        session.save()
    before = media_files(settings)
    body = EndlessUpload(field, fields={"source": "upload"})

    response = post_endless(client, step_url(step), MB + settings.DATA_UPLOAD_MAX_MEMORY_SIZE, body)

    assert response.status_code == 413
    assert response.content.decode() == f"Refused: {reason}.\n"
    assert MB < body.read_bytes <= MB + 4 * 64 * 1024
    assert not list(spool.iterdir())
    assert CodeBundle.objects.count() == 1 and not Dataset.objects.filter(kind="upload").exists()
    assert media_files(settings) == before


@pytest.mark.parametrize(
    ("url", "field", "reason"),
    [
        (step_url("data"), "wheel", "a dataset upload takes no file in the field 'wheel'"),
        (step_url("resource"), "wheel", "this page takes no file in the field 'wheel'"),
        (reverse("job-list"), "file", "this page takes no file in the field 'file'"),
    ],
)
def test_file_where_the_page_takes_none_is_refused_unspooled(client, alice, bundle, spool, url, field, reason):
    client.force_login(alice)
    body = EndlessUpload(field, fields={"source": "upload"})

    response = post_endless(client, url, 2 * MB, body)

    assert response.status_code == 413
    assert response.content.decode() == f"Refused: {reason}.\n"
    assert body.read_bytes < 256 * 1024
    assert not list(spool.iterdir())


def test_report_without_token_is_refused_unread_as_json(client, job):
    body = EndlessUpload("artifact", "model.keras", fields={"report": "{}"})

    response = post_endless(client, reverse("api-job-report", args=[job.pk]), 100 * MB, body)

    assert response.status_code == 413
    assert response.json() == {
        "error": "the request is 100 MB, above the 5 MB limit for a report without a bearer token"
    }
    assert body.read_bytes == 0


def test_report_artifacts_are_cut_off_at_their_limit(client, job, settings, spool):
    settings.FC2_MAX_ARTIFACT_MB = 1
    body = EndlessUpload("artifact", "model.keras", fields={"report": "{}"})
    url = reverse("api-job-report", args=[job.pk])

    response = post_endless(client, url, 3 * MB, body, headers={"Authorization": "Bearer whatever"})

    assert response.status_code == 413
    assert response.json() == {"error": "artifacts exceed 1 MB"}
    assert body.read_bytes <= MB + 4 * 64 * 1024
    assert not list(spool.iterdir())


def test_live_server_answers_before_the_body_is_sent(live_server):
    """Over a real socket: a client declaring 300 MB gets its 413 after sending no more than the socket buffers."""
    address = urlsplit(live_server.url)
    sent = 0
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        sock.sendall(
            f"POST {step_url('code')} HTTP/1.1\r\nHost: {address.netloc}\r\nContent-Type: {MULTIPART}\r\n"
            f"Content-Length: {300 * MB}\r\n\r\n".encode()
        )
        chunk = b"x" * (64 * 1024)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            readable, writable, _ = select.select([sock], [sock], [], 1)
            if readable:
                break
            if writable and sent < 300 * MB:
                sent += sock.send(chunk)
        answer = read_response(sock)
        # Stop sending and go: the server throws away what is still on its way without reading it into memory.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    assert answer.startswith("HTTP/1.1 413 ")
    assert "the request is 300 MB, above the 5 MB limit" in answer
    assert sent < 32 * MB


def read_response(sock: socket.socket) -> str:
    """One HTTP response, read by its Content-Length (the server keeps the connection open to drain the body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(4096)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))[15:])
    while len(body) < length:
        body += sock.recv(4096)
    return (head + b"\r\n\r\n" + body).decode()


# --- .npz datasets ----------------------------------------------------------------------------------------------------


def npz_file(members: dict[str, bytes]) -> io.BytesIO:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    buffer.seek(0)
    return buffer


def npy_header(shape: tuple[int, ...], dtype: str = "<f4") -> bytes:
    """An .npy header declaring `shape` of `dtype`, with no data after it."""
    buffer = io.BytesIO()
    npy_format.write_array_header_1_0(buffer, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def good_npz() -> io.BytesIO:
    buffer = io.BytesIO()
    x, y = np.zeros((30, 8, 8, 1), "float32"), np.arange(30) % 10
    np.savez(buffer, x_train=x[:20], y_train=y[:20], x_test=x[20:], y_test=y[20:])
    buffer.seek(0)
    return buffer


def zeros_bomb(size: int) -> io.BytesIO:
    """An .npz whose x_train is `size` bytes of zeros: deflate packs it 1000:1."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf, zf.open("x_train.npy", "w", force_zip64=True) as f:
        f.write(npy_header((size // 4,)))
        zeros = bytes(MB)
        for _ in range(size // MB):
            f.write(zeros)
    buffer.seek(0)
    return buffer


def test_npz_shapes_come_from_the_headers_alone():
    upload = good_npz()
    upload.read(10)

    with mock.patch.object(np, "load", side_effect=AssertionError("np.load must not be called")):
        described = datasets.describe_npz(upload)

    assert described == (30, 64)
    assert upload.tell() == 0


def test_npz_of_other_arrays_is_refused():  # (the dataset contract: tests/test_dataset_contract.py)
    with pytest.raises(datasets.DatasetError, match="^the .npz lacks x_train"):
        datasets.describe_npz(npz_file({"weights.npy": npy(np.ones(3))}))


HOSTILE_NPZ = [
    pytest.param(
        lambda: npz_file({"x_train.npy": b"hello"}),
        "x_train.npy in the .npz is not a readable .npy array (EOF: reading magic string, expected 8 bytes got 5)",
        id="member-not-npy",
    ),
    pytest.param(
        lambda: npz_file({"x_train": b"just some bytes in the zip"}),
        "x_train in the .npz is not a readable .npy array (the magic string is not correct; expected "
        "b'\\x93NUMPY', got b'just s')",
        id="member-no-suffix",
    ),
    pytest.param(
        lambda: npz_file({"x_train.npy": npy_header((2**40,))}),
        "x_train.npy in the .npz declares 4 TB of data but holds 0 bytes",
        id="declares-4-TiB",
    ),
    pytest.param(
        lambda: npz_file({"x_train.npy": npy_header((-5, 2))}),
        "x_train.npy in the .npz declares 0 bytes of data but holds 0 bytes",
        id="negative-shape",
    ),
    pytest.param(
        lambda: npz_file({"x_train.npy": npy(np.array([1, "a"], dtype=object))}),
        "x_train.npy in the .npz holds Python objects, which the platform does not load",
        id="pickled-objects",
    ),
    pytest.param(
        lambda: npz_file(
            {
                "x_train.npy": npy(np.float32(1.0)),
                "y_train.npy": npy(np.arange(1)),
                "x_test.npy": npy(np.ones((1, 2))),
                "y_test.npy": npy(np.arange(1)),
            }
        ),
        "x_train is shaped (): it needs one row per example",
        id="scalar",
    ),
    pytest.param(
        lambda: zeros_bomb(64 * MB),
        "x_train.npy in the .npz looks like a zip bomb: it unpacks to 64 MB from 6",  # 64 KB or so
        id="zeros-bomb",
    ),
    pytest.param(
        lambda: io.BytesIO(b"\x93NUMPY not a zip"),
        "the .npz file is not a zip archive (save it with numpy.savez)",
        id="not-a-zip",
    ),
]


@pytest.mark.parametrize(("make", "reason"), HOSTILE_NPZ)
def test_hostile_npz_is_refused_with_its_reason(make, reason):
    with pytest.raises(datasets.DatasetError) as refused:
        datasets.describe_npz(make())

    assert str(refused.value).startswith(reason)


@pytest.mark.parametrize(("make", "reason"), HOSTILE_NPZ)
def test_hostile_npz_upload_leaves_nothing(client, alice, bundle, settings, make, reason):
    client.force_login(alice)
    session = client.session
    session["fc2_wizard"] = {"code": {"bundle": bundle.pk, "parameters": {}}}
    session.save()
    before = media_files(settings)

    response = client.post(
        step_url("data"), {"source": "upload", "file": SimpleUploadedFile("mine.npz", make().getvalue())}
    )

    assert response.status_code == 400
    (error,) = response.context["form"].errors["file"]
    assert error.startswith(reason)
    assert not Dataset.objects.filter(kind="upload").exists()
    assert media_files(settings) == before


def test_over_long_dataset_name_is_refused(alice):
    with pytest.raises(datasets.DatasetError, match="^the dataset's name is longer than 200 characters"):
        datasets.store_upload(alice, SimpleUploadedFile("d" * 240 + ".npz", good_npz().getvalue()))

    assert not Dataset.objects.exists()


# --- reports: non-finite samples, long artifact names -----------------------------------------------------------------


@pytest.fixture
def running_job(job) -> Job:
    for role, index in [("chief", 0), ("worker", 0)]:
        Node.objects.create(job=job, name=f"{role}-{index}", role=role, index=index, status=Node.Status.RUNNING)
    Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING)
    job.refresh_from_db()
    return job


def strict_json(text: str):
    """JSON as a browser parses it: NaN and Infinity are not JSON."""
    return json.loads(text, parse_constant=lambda constant: pytest.fail(f"{constant} in JSON"))


@pytest.mark.parametrize("raw", ["Infinity", "-Infinity", "NaN"])
def test_non_finite_sample_is_stored_unknown_and_series_stays_json(client, alice, running_job, raw):
    token = running_job.issue_token()
    running_job.save()
    body = (
        '{"node": "chief-0", "status": "running", "progress": {"step": 3, "loss": %s}, '
        '"sample": {"cpu_percent": %s, "memory_mb": %s, "gpu_percent": %s, "bytes_sent": 10}}' % ((raw,) * 4)
    )

    response = client.post(
        reverse("api-job-report", args=[running_job.pk]),
        body,
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    client.force_login(alice)
    series = client.get(reverse("job-series", args=[running_job.pk]))

    assert response.status_code == 200
    sample = NodeSample.objects.get()
    assert (sample.cpu_percent, sample.memory_mb, sample.gpu_percent) == (None, None, None)
    assert not LossPoint.objects.exists()
    (chief,) = [node for node in strict_json(series.content.decode())["nodes"] if node["name"] == "chief-0"]
    assert chief["points"][0]["cpu_percent"] is None


def test_non_finite_as_a_string_is_refused(running_job):
    with pytest.raises(ValueError, match="Input should be a finite number"):
        Report.model_validate({"node": "chief-0", "status": "running", "sample": {"cpu_percent": "inf"}})


def test_series_of_rows_stored_with_infinity_is_json(client, alice, running_job):
    node = running_job.nodes.get(name="chief-0")
    NodeSample.objects.create(node=node, cpu_percent=float("inf"), memory_mb=12.0)
    client.force_login(alice)

    series = strict_json(client.get(reverse("job-series", args=[running_job.pk])).content.decode())

    (chief,) = [n for n in series["nodes"] if n["name"] == "chief-0"]
    assert (chief["points"][0]["cpu_percent"], chief["points"][0]["memory_mb"]) == (None, 12.0)


@pytest.mark.parametrize("stem", ["a" * 300, "é" * 300], ids=["ascii", "two-byte"])
@pytest.mark.parametrize("node", ["chief-0", "worker-0"])
def test_long_artifact_name_is_shortened_and_stored(running_job, stem, node):
    """The agent sends the name of a file in the node's output directory; Django keeps 255 characters of it."""
    uploads = [SimpleUploadedFile(f"a{stem}.keras", b"weights"), SimpleUploadedFile(f"b{stem}.keras", b"other")]
    report = Report(node=node, status="running")

    apply_report(running_job, report, uploads)

    artifacts = list(Artifact.objects.filter(job=running_job))
    assert len(artifacts) == 2
    for artifact in artifacts:
        assert len(artifact.name) <= Artifact._meta.get_field("name").max_length
        assert artifact.name.endswith(".keras") and artifact.name.startswith("" if node == "chief-0" else "worker-0/")
        assert len(Path(artifact.file.name).name.encode()) <= 255
        assert Path(artifact.file.path).read_bytes() in (b"weights", b"other")


def test_short_artifact_names_are_kept():
    assert artifact_name("model.keras") == "model.keras"
    assert artifact_name("metrics.json", "worker-1") == "worker-1/metrics.json"


def test_good_wheel_still_uploads(client, alice, tmp_path):
    client.force_login(alice)
    wheel = make_wheel(tmp_path, GOOD).read_bytes()

    response = client.post(
        step_url("code"),
        {"source": "upload", "wheel": SimpleUploadedFile(FILENAME, wheel), "main_script": "main.py"},
    )

    assert response.status_code == 302
    assert CodeBundle.objects.get().sha256
