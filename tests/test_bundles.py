"""fc2.bundles and `manage.py check_bundle`: good wheels pass, each bad one is refused with its reason."""

import contextlib
import hashlib
import io
import json
import random
import stat
import subprocess
import sys
import zipfile
from io import StringIO
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.urls import reverse

from fc2.bundles import MB, BundleError, WheelInfo, ZipLimits, check_members, validate_wheel
from fc2.models import CodeBundle
from harness.wheels import DIST_INFO, FILENAME, GOOD, make_wheel

PROJECT_DIR = Path(__file__).resolve().parent.parent


def check(path: Path, main_script: str = "main.py", max_bytes: int | None = None) -> WheelInfo:
    with path.open("rb") as fileobj:
        return validate_wheel(fileobj, path.name, main_script, max_bytes)


@pytest.mark.parametrize(
    ("members", "main_script", "resolved"),
    [
        pytest.param(GOOD, "main.py", "demo/main.py", id="main-in-package"),
        pytest.param({**GOOD, "demo/main.py": None, "main.py": b""}, "main.py", "main.py", id="main-top-level"),
        pytest.param({**GOOD, "other/main.py": b""}, "demo/main.py", "demo/main.py", id="full-path"),
        pytest.param({**GOOD, "demo/sub/train.py": b""}, "train.py", "demo/sub/train.py", id="other-name"),
        pytest.param({**GOOD, "demo-1.0.data/scripts/main.py": b""}, "main.py", "demo/main.py", id="data-dir-ignored"),
        pytest.param({**GOOD, f"{DIST_INFO}/main.py": b""}, "main.py", "demo/main.py", id="dist-info-ignored"),
    ],
)
def test_good_wheel_passes(tmp_path, members, main_script, resolved):
    path = make_wheel(tmp_path, members)

    info = check(path, main_script)

    content = path.read_bytes()
    assert info == WheelInfo("demo", "1.0", resolved, len(content), hashlib.sha256(content).hexdigest())


def test_example_wheel_passes():
    wheels = sorted((PROJECT_DIR / "examples" / "dist").glob("*.whl"))
    if not wheels:
        pytest.skip("no example wheel built")

    info = check(wheels[0])

    assert info.main_script.endswith("/main.py")


def test_upload_and_plain_streams_pass_and_are_rewound(tmp_path):
    content = make_wheel(tmp_path, GOOD).read_bytes()
    upload = SimpleUploadedFile(FILENAME, content, content_type="application/zip")
    buffer = io.BytesIO(content)
    unseekable = io.BufferedReader(_Unseekable(content))

    infos = [validate_wheel(f, FILENAME) for f in (upload, buffer, unseekable)]

    assert {info.sha256 for info in infos} == {hashlib.sha256(content).hexdigest()}
    assert upload.tell() == buffer.tell() == 0


class _Unseekable(io.RawIOBase):
    """A pipe-like stream: readable once, no seek."""

    def __init__(self, content: bytes) -> None:
        self._buffer = io.BytesIO(content)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        return self._buffer.readinto(b)


@pytest.mark.parametrize(
    ("members", "main_script", "reason"),
    [
        pytest.param(
            {**GOOD, "../evil.py": b""}, "main.py", "unsafe path in the wheel: '../evil.py' contains '..'", id="dotdot"
        ),
        pytest.param(
            {**GOOD, "demo/../../evil.py": b""},
            "main.py",
            "unsafe path in the wheel: 'demo/../../evil.py' contains '..'",
            id="inner-dotdot",
        ),
        pytest.param({**GOOD, "/abs.py": b""}, "main.py", "unsafe path in the wheel: '/abs.py' is absolute", id="abs"),
        pytest.param(
            {**GOOD, "C:/evil.py": b""},
            "main.py",
            "unsafe path in the wheel: 'C:/evil.py' starts with a drive letter",
            id="drive",
        ),
        pytest.param(
            {**GOOD, "demo\\..\\..\\evil.py": b""},
            "main.py",
            "unsafe path in the wheel: 'demo\\\\..\\\\..\\\\evil.py' contains a backslash",
            id="backslash",
        ),
        pytest.param(
            {**GOOD, "demo/main.py": None},
            "main.py",
            "main script main.py is not in the wheel (looked at the top level and in packages)",
            id="main-missing",
        ),
        pytest.param(
            {**GOOD, "other/main.py": b"", "main.py": b""},
            "main.py",
            "main script main.py is ambiguous: the wheel has demo/main.py, main.py, other/main.py; "
            "give its full path, e.g. demo/main.py",
            id="main-ambiguous",
        ),
        pytest.param(GOOD, "demo/train.py", "main script demo/train.py is not in the wheel", id="main-path-missing"),
        pytest.param(
            {**GOOD, "my-scripts/main.py": b""},
            "my-scripts/main.py",
            "main script my-scripts/main.py cannot be run as a module: 'my-scripts' is not a Python identifier",
            id="main-not-importable",
        ),
        pytest.param(
            {**GOOD, "demo/class/main.py": b""},
            "demo/class/main.py",
            "main script demo/class/main.py cannot be run as a module: 'class' is not a Python identifier",
            id="main-keyword",
        ),
        pytest.param(GOOD, "main.txt", "main script main.txt must be a Python file ending in .py", id="main-not-py"),
        pytest.param(
            GOOD,
            "/demo/main.py",
            "main script /demo/main.py must be a path inside the wheel, not an absolute path",
            id="main-abs",
        ),
        pytest.param(
            GOOD,
            "demo/../main.py",
            "main script demo/../main.py must be a path inside the wheel, without .. or backslashes",
            id="main-dotdot",
        ),
        pytest.param(
            {name: data for name, data in GOOD.items() if not name.startswith(DIST_INFO)},
            "main.py",
            "not a wheel: it has no .dist-info directory (build it with `python -m build --wheel`)",
            id="no-dist-info",
        ),
        pytest.param(
            {**GOOD, f"{DIST_INFO}/RECORD": None},
            "main.py",
            f"not a wheel: {DIST_INFO} has no RECORD",
            id="no-record",
        ),
        pytest.param(
            {**GOOD, f"{DIST_INFO}/WHEEL": None, f"{DIST_INFO}/METADATA": None},
            "main.py",
            f"not a wheel: {DIST_INFO} has no WHEEL, METADATA",
            id="no-wheel-metadata",
        ),
        pytest.param(
            {**GOOD, "demo-2.0.dist-info/RECORD": b""},
            "main.py",
            "not a wheel: it has more than one .dist-info directory (demo-1.0.dist-info, demo-2.0.dist-info)",
            id="two-dist-info",
        ),
        pytest.param(
            {**GOOD, f"{DIST_INFO}/METADATA": b"Metadata-Version: 2.1\nName: demo\n"},
            "main.py",
            "the wheel's METADATA has no Version",
            id="metadata-no-version",
        ),
        pytest.param(
            {**GOOD, f"{DIST_INFO}/METADATA": b"Metadata-Version: 2.1\n\nName: demo\nVersion: 1.0\n"},
            "main.py",
            "the wheel's METADATA has no Name or Version",
            id="metadata-fields-in-body",
        ),
        pytest.param(
            {**GOOD, f"{DIST_INFO}/METADATA": b"Name: other\nVersion: 1.0\n"},
            "main.py",
            "the file name says distribution 'demo' but its METADATA says 'other'",
            id="metadata-other-name",
        ),
        pytest.param(
            {name.replace(DIST_INFO, "other-1.0.dist-info"): data for name, data in GOOD.items()},
            "main.py",
            "the file name says distribution 'demo' but its .dist-info directory says 'other'",
            id="dist-info-other-name",
        ),
    ],
)
def test_bad_wheel_is_refused(tmp_path, members, main_script, reason):
    path = make_wheel(tmp_path, members)

    with pytest.raises(BundleError) as refused:
        check(path, main_script)

    assert str(refused.value) == reason


@pytest.mark.parametrize(
    ("filename", "content", "max_bytes", "reason"),
    [
        pytest.param(FILENAME, b"", None, "the file is empty", id="empty"),
        pytest.param(
            FILENAME, b"PK\x03\x04 not really", None, "not a wheel: the file is not a zip archive", id="not-zip"
        ),
        pytest.param(FILENAME, b"x" * 101, 100, "the wheel is larger than the 100 bytes limit", id="over-limit"),
        pytest.param(FILENAME, b"x" * (MB + 1), MB, "the wheel is larger than the 1 MB limit", id="over-limit-mb"),
        pytest.param(
            "demo-1.0-py3-none-any.zip",
            b"PK",
            None,
            "demo-1.0-py3-none-any.zip is not a wheel: the file name must end in .whl",
            id="extension",
        ),
        pytest.param(
            "demo.whl",
            b"PK",
            None,
            "demo.whl is not a valid wheel file name: expected distribution-version-python-abi-platform.whl, "
            "e.g. mypkg-0.1.0-py3-none-any.whl as built by `python -m build --wheel`",
            id="filename-shape",
        ),
    ],
)
def test_bad_file_is_refused(filename, content, max_bytes, reason):
    with pytest.raises(BundleError) as refused:
        validate_wheel(io.BytesIO(content), filename, max_bytes=max_bytes)

    assert str(refused.value) == reason


def test_default_limit_comes_from_settings(tmp_path, settings):
    settings.FC2_MAX_BUNDLE_MB = 1
    path = make_wheel(tmp_path, {**GOOD, "demo/weights.bin": random.Random(0).randbytes(2 * MB)})

    with pytest.raises(BundleError, match=r"^the wheel is larger than the 1 MB limit$"):
        check(path)


def test_highly_compressed_member_is_refused(tmp_path):
    path = make_wheel(tmp_path, {**GOOD, "demo/zeros.bin": bytes(2 * MB)})

    with pytest.raises(BundleError, match=r"^the wheel's member demo/zeros.bin looks like a zip bomb: it compresses "):
        check(path)


def test_bomb_member_is_refused(tmp_path):
    """200 MB of zeros compresses to ~200 KB; the central directory gives it away without decompressing."""
    path = tmp_path / FILENAME
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in GOOD.items():
            zf.writestr(name, data)
        with zf.open("demo/bomb.bin", "w", force_zip64=True) as member:
            chunk = bytes(MB)
            for _ in range(200):
                member.write(chunk)

    with pytest.raises(BundleError) as refused:
        check(path)

    assert str(refused.value) == ("the wheel's member demo/bomb.bin unpacks to 200 MB, above the 100 MB limit per file")
    assert path.stat().st_size < MB


@pytest.mark.parametrize("recorded_size", [10, 0], ids=["smaller", "zero"])
def test_header_lying_about_metadata_size_is_refused(tmp_path, recorded_size):
    path = tmp_path / FILENAME
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in GOOD.items():
            zf.writestr(name, data)
        # The central directory is written on close from these ZipInfo objects: make it understate METADATA.
        zf.getinfo(f"{DIST_INFO}/METADATA").file_size = recorded_size

    with pytest.raises(BundleError, match=rf"^cannot read {DIST_INFO}/METADATA from the wheel: Bad CRC-32"):
        check(path)


def zip_info(name: str, file_size: int = 10, compress_size: int = 10, **attributes) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.file_size, info.compress_size = file_size, compress_size
    for attribute, value in attributes.items():
        setattr(info, attribute, value)
    return info


SMALL_LIMITS = ZipLimits(max_members=3, max_member_bytes=1000, max_total_bytes=1500, max_ratio=10, ratio_min_bytes=100)


@pytest.mark.parametrize(
    ("infos", "reason"),
    [
        pytest.param([zip_info("a.py"), zip_info("b.py"), zip_info("c.py")], None, id="within-limits"),
        pytest.param([zip_info("notes.txt", 100, 1)], None, id="small-member-any-ratio"),
        pytest.param([zip_info("w.bin", 1000, 100)], None, id="ratio-at-limit"),
        pytest.param(
            [zip_info(f"{n}.py") for n in "abcd"], "the wheel has 4 members, above the limit of 3", id="too-many"
        ),
        pytest.param(
            [zip_info("w.bin", 1001, 1000)],
            "the wheel's member w.bin unpacks to 1001 bytes, above the 1000 bytes limit per file",
            id="member-too-big",
        ),
        pytest.param(
            [zip_info("a.bin", 800, 800), zip_info("b.bin", 800, 800)],
            "the wheel unpacks to 1.6 KB, above the 1.5 KB limit",
            id="total-too-big",
        ),
        pytest.param(
            [zip_info("w.bin", 1000, 0)],
            "the wheel's member w.bin looks like a zip bomb: it compresses 1000:1, above the 10:1 limit",
            id="compressed-size-zero",
        ),
        pytest.param([zip_info("a.py"), zip_info("a.py")], "the wheel holds a.py more than once", id="duplicate"),
        pytest.param(
            [zip_info("demo/link.py", external_attr=(stat.S_IFLNK | 0o777) << 16)],
            "unsafe member in the wheel: demo/link.py is a symbolic link",
            id="symlink",
        ),
        pytest.param(
            [zip_info("demo/secret.py", flag_bits=0x1)],
            "the wheel's member demo/secret.py is encrypted",
            id="encrypted",
        ),
    ],
)
def test_check_members(infos, reason):
    if reason is None:
        check_members(infos, SMALL_LIMITS)
    else:
        with pytest.raises(BundleError) as refused:
            check_members(infos, SMALL_LIMITS)
        assert str(refused.value) == reason


# --- manage.py check_bundle ---


def run_check_bundle(*args: str) -> tuple[int, str, str]:
    """Run the command in-process; returns (exit code, stdout, stderr)."""
    stdout, stderr = StringIO(), StringIO()
    try:
        call_command("check_bundle", *args, stdout=stdout, stderr=stderr)
    except SystemExit as exit_:
        return exit_.code, stdout.getvalue(), stderr.getvalue()
    return 0, stdout.getvalue(), stderr.getvalue()


def test_command_ok(tmp_path):
    path = make_wheel(tmp_path, {**GOOD, "other/main.py": b""})

    assert run_check_bundle(str(path), "--main", "demo/main.py") == (0, "ok\n", "")


def test_command_ok_json(tmp_path):
    path = make_wheel(tmp_path, GOOD)

    code, stdout, stderr = run_check_bundle(str(path), "--json")

    content = path.read_bytes()
    assert (code, stderr) == (0, "")
    assert json.loads(stdout) == {
        "ok": True,
        "distribution": "demo",
        "version": "1.0",
        "main_script": "demo/main.py",
        "size_bytes": len(content),
        "sha256": hashlib.sha256(content).hexdigest(),
        "framework": "",
        "cuda_requirement": "",
    }
    assert stdout.count("\n") == 1


@pytest.mark.parametrize(
    ("members", "args", "reason"),
    [
        pytest.param(GOOD, ["--main", "train.py"], "main script train.py is not in the wheel", id="bad-main"),
        pytest.param(
            {**GOOD, "../evil.py": b""}, [], "unsafe path in the wheel: '../evil.py' contains '..'", id="slip"
        ),
    ],
)
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_command_refuses_bad_wheel(tmp_path, members, args, reason, as_json):
    path = make_wheel(tmp_path, members)

    code, stdout, stderr = run_check_bundle(str(path), *args, *(["--json"] if as_json else []))

    assert code == 1
    assert stderr.startswith(f"error: {reason}")
    assert stderr.count("\n") == 1
    if as_json:
        assert json.loads(stdout) == {"ok": False, "error": stderr.removeprefix("error: ").rstrip("\n")}
    else:
        assert stdout == ""


@pytest.mark.parametrize(
    ("path", "reason"),
    [("missing.whl", "no such file: {tmp}/missing.whl"), (".", "{tmp} is a directory, not a wheel")],
    ids=["missing", "directory"],
)
def test_command_refuses_unreadable_path(tmp_path, path, reason):
    assert run_check_bundle(str(tmp_path / path)) == (1, "", f"error: {reason.format(tmp=tmp_path)}\n")


def test_manage_py_check_bundle(tmp_path):
    """The contract as other tools see it: exit code, one `error:` line on stderr, one JSON object on stdout."""
    good = make_wheel(tmp_path, GOOD)
    manage = [sys.executable, "manage.py", "check_bundle"]

    ok = subprocess.run([*manage, str(good)], cwd=PROJECT_DIR, capture_output=True, text=True, timeout=120)
    refused = subprocess.run(
        [*manage, str(good), "--main", "nope.py", "--json"],
        cwd=PROJECT_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "ok\n", "")
    reason = "main script nope.py is not in the wheel (looked at the top level and in packages)"
    assert (refused.returncode, refused.stderr) == (1, f"error: {reason}\n")
    assert json.loads(refused.stdout) == {"ok": False, "error": reason}


# --- hostile wheels: each refused with its reason, through every path, nothing stored ---


def good_wheel_bytes(members: dict[str, bytes] = GOOD) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            if data is not None:
                zf.writestr(name, data)
    return buffer.getvalue()


def bad_utf8_name() -> bytes:
    """demo/main.py renamed to bytes that are not UTF-8, in a central directory entry flagged UTF-8 (bit 0x800)."""
    data = bytearray(good_wheel_bytes())
    entry = data.index(b"PK\x01\x02", data.index(b"demo/main.py") + 1)
    while data[entry + 46 : entry + 58] != b"demo/main.py":
        entry = data.index(b"PK\x01\x02", entry + 1)
    data[entry + 46 : entry + 50] = b"\xff\xfe\xfd\xfc"
    flags = int.from_bytes(data[entry + 8 : entry + 10], "little")
    data[entry + 8 : entry + 10] = (flags | 0x800).to_bytes(2, "little")
    return bytes(data)


def bogus_directory_offset() -> bytes:
    """The end record points the central directory 1 GB into a file of a few hundred bytes."""
    data = bytearray(good_wheel_bytes())
    end = data.rindex(b"PK\x05\x06")
    data[end + 16 : end + 20] = (10**9).to_bytes(4, "little")
    return bytes(data)


HOSTILE_WHEELS = [
    pytest.param(
        FILENAME,
        bad_utf8_name(),
        "not a wheel: its zip directory cannot be read ('utf-8' codec can't decode",
        id="utf8",
    ),
    pytest.param(
        FILENAME,
        bogus_directory_offset(),
        f"cannot read {DIST_INFO}/METADATA from the wheel: ",  # a negative seek: ValueError in memory, OSError on disk
        id="directory-offset",
    ),
    pytest.param(
        "demo-1.0-py3-none-any.WHL",
        good_wheel_bytes(),
        "demo-1.0-py3-none-any.WHL is not a wheel: the file name must end in .whl, in lower case",
        id="upper-case-extension",
    ),
    pytest.param(
        "demo-2.0-py3-none-any.whl",
        good_wheel_bytes(),
        "the file name says version 2.0 but its METADATA says '1.0'",
        id="version-differs",
    ),
    pytest.param(
        FILENAME,
        good_wheel_bytes({**GOOD, f"{DIST_INFO}/METADATA": b"Name: demo\nVersion: one\n"}),
        "the wheel's METADATA gives version 'one', which is not a valid version",
        id="version-invalid",
    ),
    pytest.param(
        FILENAME,
        good_wheel_bytes({**GOOD, f"{DIST_INFO}/METADATA": b"Name: demo\nVersion: 1.0\nName: other\n"}),
        "the wheel's METADATA gives Name more than once",
        id="name-twice",
    ),
    pytest.param(
        FILENAME,
        good_wheel_bytes({**GOOD, f"{DIST_INFO}/METADATA": b"Name: d\xe9mo\nVersion: 1.0\n"}),
        "the wheel's METADATA is not UTF-8 text",
        id="metadata-not-utf8",
    ),
    pytest.param(
        "demo-1.0-py3-none-any.whl",
        good_wheel_bytes({**GOOD, "demo/main.py": None, f"demo/{'d' * 300}/main.py": b""}),
        "the wheel's main script path is longer than 300 characters",
        id="main-path-too-long",
    ),
]


@pytest.mark.parametrize(("filename", "content", "reason"), HOSTILE_WHEELS)
def test_hostile_wheel_is_refused_with_its_reason(filename, content, reason):
    with pytest.raises(BundleError) as refused:
        validate_wheel(io.BytesIO(content), filename)

    assert str(refused.value).startswith(reason)


def test_same_version_spelled_differently_passes(tmp_path):
    """pip compares versions as PEP 440 does: 1.0 and 1.0.0 are one version."""
    path = make_wheel(tmp_path, GOOD, filename="demo-1.0.0-py3-none-any.whl")

    assert check(path).version == "1.0"


def test_same_name_spelled_differently_passes(tmp_path):
    """pip compares names canonicalised (PEP 503); the platform keeps the name as METADATA spells it."""
    metadata = b"Metadata-Version: 2.1\nName: Demo.Pkg\nVersion: 1.0\n"
    members = {**{name.replace(DIST_INFO, "demo_pkg-1.0.dist-info"): data for name, data in GOOD.items()}}
    members["demo_pkg-1.0.dist-info/METADATA"] = metadata

    path = make_wheel(tmp_path, members, filename="demo_pkg-1.0-py3-none-any.whl")

    assert check(path).distribution == "Demo.Pkg"


def test_metadata_with_fields_newer_than_its_version_passes(tmp_path):
    """setuptools wrote License-File under Metadata-Version 2.1 for years; pip installs such wheels, so do we."""
    metadata = b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\nLicense-File: LICENSE\nX-Custom: yes\n"

    path = make_wheel(tmp_path, {**GOOD, f"{DIST_INFO}/METADATA": metadata})

    assert check(path).version == "1.0"


def test_validator_does_not_import_the_models():
    """fc2.models imports fc2.bundles for its column sizes, so the validator must not import the models back."""
    code = "import sys, fc2.bundles; print('fc2.models' in sys.modules)"

    result = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_DIR, capture_output=True, text=True, timeout=60)

    assert (result.returncode, result.stdout) == (0, "False\n")


@pytest.mark.parametrize(("filename", "content", "reason"), HOSTILE_WHEELS)
def test_hostile_wheel_upload_leaves_nothing(client, alice, settings, filename, content, reason):
    client.force_login(alice)

    response = client.post(
        reverse("job-new-step", args=["code"]),
        {"source": "upload", "wheel": SimpleUploadedFile(filename, content), "main_script": "main.py"},
    )

    assert response.status_code == 400
    (error,) = response.context["form"].errors["wheel"]
    assert error.startswith(reason)
    assert not CodeBundle.objects.exists()
    assert not [p for p in Path(settings.MEDIA_ROOT).rglob("*") if p.is_file()]


@pytest.mark.parametrize(("filename", "content", "reason"), HOSTILE_WHEELS)
def test_check_bundle_json_refuses_hostile_wheel(tmp_path, filename, content, reason):
    path = tmp_path / filename
    path.write_bytes(content)

    code, stdout, stderr = run_check_bundle(str(path), "--json")

    assert code == 1
    assert stderr.startswith(f"error: {reason}") and stderr.count("\n") == 1
    assert json.loads(stdout) == {"ok": False, "error": stderr.removeprefix("error: ").rstrip("\n")}


def test_corrupted_wheels_are_refused_never_crash():
    """Bytes flipped anywhere in a good wheel: whatever zipfile makes of it, the answer is a BundleError."""
    content = good_wheel_bytes()
    rng = random.Random(8)
    for _ in range(3000):
        corrupted = bytearray(content)
        for _ in range(rng.randint(1, 4)):
            corrupted[rng.randrange(len(corrupted))] = rng.randrange(256)
        with contextlib.suppress(BundleError):
            validate_wheel(io.BytesIO(bytes(corrupted)), FILENAME)
