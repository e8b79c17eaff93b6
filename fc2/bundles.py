"""Wheel validation for code bundles, shared by the upload form and `manage.py check_bundle`.

It owns the rules a researcher's wheel must pass before the platform stores it or installs it on a cluster: a
non-empty zip within the size limit, a wheel file name pip accepts (naming the distribution and version METADATA
names), no member path that could land outside the install
directory, no zip bomb, exactly one complete `.dist-info` directory naming the same distribution as the file, and a
main script that the nodes can run with `python -m`. It also judges what the wheel's METADATA requires (its
Requires-Dist, read by common.wheels): the framework its code trains with (`requirements_framework`) and a dependency
only CUDA machines can install (`cuda_requirement`), which the job service holds against the framework and the
cluster asked for.

Everything except METADATA is judged from the zip's central directory, so refusing a hostile upload costs little.
The central directory can lie about sizes, but Python's zipfile (which pip uses too) never yields more than the
recorded size and then fails the CRC check, so the recorded sizes bound what reading or installing can produce.
"""

from __future__ import annotations

import hashlib
import io
import keyword
import lzma
import re
import stat
import zipfile
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import BinaryIO

from django.conf import settings
from packaging.metadata import parse_email
from packaging.requirements import Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from common.wheels import find_dist_info, requires_dist

MB = 1024 * 1024
# Longest values CodeBundle stores; fc2.models sizes its columns from these, so a wheel that passes fits its row.
DISTRIBUTION_MAX_LENGTH = 200
VERSION_MAX_LENGTH = 100
MAIN_SCRIPT_MAX_LENGTH = 300
# The wheel's file name is kept (CodeBundle.filename) and stored on disk under it: within both limits (255), with room
# for the suffix storage adds on a clash.
FILE_NAME_MAX_LENGTH = 200
# The longest CUDA-only requirement CodeBundle keeps as written (a longer one is cut, ending in "…").
REQUIREMENT_MAX_LENGTH = 200

# Errors zipfile and its decompressors raise on a corrupt, encrypted or exotic archive or member: ValueError covers
# a member name flagged UTF-8 that is not (UnicodeDecodeError) and a central directory whose offset points before the
# start of the file ("negative seek value"); NotImplementedError an unknown zip version or compression method.
ZIP_READ_ERRORS = (
    zipfile.BadZipFile,
    ValueError,
    NotImplementedError,
    RuntimeError,
    EOFError,
    OSError,
    zlib.error,
    lzma.LZMAError,
)
_DRIVE_LETTER = re.compile(r"^[A-Za-z]:")


class BundleError(ValueError):
    """A wheel the platform refuses; `str(error)` is the reason, written for the researcher."""


@dataclass(frozen=True)
class WheelInfo:
    """What the platform records about a wheel that passed validation (the fields of CodeBundle)."""

    # Name from METADATA as its author spelled it, e.g. "fc2-digits-cnn".
    distribution: str
    # Version from METADATA, e.g. "0.1.0".
    version: str
    # Path of the main script inside the wheel, resolved from what the user gave, e.g. "fc2_digits/main.py".
    main_script: str
    # Size of the wheel file in bytes.
    size_bytes: int
    # SHA-256 of the wheel file, lowercase hex.
    sha256: str
    # What its code trains with, from its Requires-Dist (`requirements_framework`): "tensorflow", "pytorch", or ""
    # when it requires neither or both.
    framework: str = ""
    # Its first requirement that only a machine with CUDA can install (`cuda_requirement`), e.g. "torch==2.3.0+cu121";
    # "" when none.
    cuda_requirement: str = ""


@dataclass(frozen=True)
class ZipLimits:
    """Zip-bomb limits, checked against the central directory before anything is decompressed."""

    # Most members in one wheel: a flood of tiny members is a bomb of its own kind.
    max_members: int = 10_000
    # Largest uncompressed size of one member.
    max_member_bytes: int = 100 * MB
    # Largest uncompressed size of all members together, i.e. what pip would write to disk.
    max_total_bytes: int = 500 * MB
    # Highest uncompressed:compressed ratio for a member above `ratio_min_bytes`. Deflate tops out near 1032:1;
    # code, data and model weights stay far below 100:1.
    max_ratio: int = 100
    # Members up to this size may compress as well as they like: a small file of blank lines is harmless.
    ratio_min_bytes: int = 1 * MB
    # Largest METADATA we read (a long README included, real ones are a few KB).
    max_metadata_bytes: int = 4 * MB


DEFAULT_LIMITS = ZipLimits()


def validate_wheel(
    fileobj: BinaryIO, filename: str, main_script: str = "main.py", max_bytes: int | None = None
) -> WheelInfo:
    """Check a wheel and describe it, or raise BundleError with the reason the platform refuses it.

    `fileobj` is any binary file object (an open file, a Django UploadedFile); it is read from the start and left
    rewound. One that cannot seek is read into memory, up to the limit, and is then used up. `main_script` is a file
    name found anywhere outside `.dist-info`/`.data`, or an exact member path if it has a `/`. `max_bytes` defaults
    to settings.FC2_MAX_BUNDLE_MB.
    """
    if max_bytes is None:
        max_bytes = settings.FC2_MAX_BUNDLE_MB * MB
    file_distribution, file_version = parse_wheel_name(filename)
    check_main_script_arg(main_script)
    stream = _seekable(fileobj, max_bytes)
    try:
        size_bytes, sha256 = _measure(stream, max_bytes)
        with _open_zip(stream) as zf:
            infos = zf.infolist()
            check_members(infos)
            names = [info.filename for info in infos if not info.is_dir()]
            try:
                dist_info = find_dist_info(names)
            except ValueError as error:
                raise BundleError(str(error)) from None
            _check_same_distribution(dist_info_distribution(dist_info), file_distribution, "its .dist-info directory")
            metadata = _read_member(zf, f"{dist_info}/METADATA", DEFAULT_LIMITS.max_metadata_bytes)
        distribution, version = parse_metadata(metadata)
        _check_same_distribution(distribution, file_distribution, "its METADATA")
        _check_same_version(version, file_version)
        resolved = resolve_main_script(names, main_script)
        try:
            requires = requires_dist(metadata)  # (parse_metadata has refused METADATA that is not UTF-8)
        except ValueError as error:
            raise BundleError(str(error)) from None
    finally:
        stream.seek(0)
    info = WheelInfo(
        distribution,
        version,
        resolved,
        size_bytes,
        sha256,
        requirements_framework(requires),
        cuda_requirement(requires),
    )
    _check_fits_columns(info)
    return info


def parse_wheel_name(filename: str) -> tuple[str, Version]:
    """The distribution (canonicalised) and version a wheel file name names, parsed by packaging as pip parses it.

    >>> parse_wheel_name("fc2_digits_cnn-0.1.0-py3-none-any.whl")
    ('fc2-digits-cnn', <Version('0.1.0')>)
    >>> parse_wheel_name("demo-1.0-1-cp311-cp311-manylinux_2_17_x86_64.whl")
    ('demo', <Version('1.0')>)
    >>> parse_wheel_name("demo.zip")
    Traceback (most recent call last):
    ...
    fc2.bundles.BundleError: demo.zip is not a wheel: the file name must end in .whl
    >>> parse_wheel_name("demo-1.0-py3-none-any.WHL")
    Traceback (most recent call last):
    ...
    fc2.bundles.BundleError: demo-1.0-py3-none-any.WHL is not a wheel: the file name must end in .whl, in lower case
    """
    name = PurePosixPath(filename).name
    if len(name.encode()) > FILE_NAME_MAX_LENGTH:
        raise BundleError(f"the wheel's file name is longer than {FILE_NAME_MAX_LENGTH} characters")
    if not name.endswith(".whl"):
        case = ", in lower case" if name.lower().endswith(".whl") else ""
        raise BundleError(f"{name} is not a wheel: the file name must end in .whl{case}")
    try:
        distribution, version, _, _ = parse_wheel_filename(name)
    except InvalidWheelFilename:
        raise BundleError(
            f"{name} is not a valid wheel file name: expected distribution-version-python-abi-platform.whl, "
            "e.g. mypkg-0.1.0-py3-none-any.whl as built by `python -m build --wheel`"
        ) from None
    return distribution, version


def check_main_script_arg(main_script: str) -> None:
    """Refuse a main script argument that cannot name a Python file inside the wheel.

    >>> check_main_script_arg("pkg/main.py")
    >>> check_main_script_arg("../main.py")
    Traceback (most recent call last):
    ...
    fc2.bundles.BundleError: main script ../main.py must be a path inside the wheel, without .. or backslashes
    """
    if not main_script.endswith(".py"):
        raise BundleError(f"main script {main_script} must be a Python file ending in .py")
    if main_script.startswith("/") or _DRIVE_LETTER.match(main_script):
        raise BundleError(f"main script {main_script} must be a path inside the wheel, not an absolute path")
    if ".." in main_script.split("/") or "\\" in main_script:
        raise BundleError(f"main script {main_script} must be a path inside the wheel, without .. or backslashes")


def check_members(infos: Sequence[zipfile.ZipInfo], limits: ZipLimits = DEFAULT_LIMITS) -> None:
    """Refuse unsafe paths and zip bombs, from the central directory alone."""
    if len(infos) > limits.max_members:
        raise BundleError(f"the wheel has {len(infos)} members, above the limit of {limits.max_members}")
    duplicates = sorted(name for name, count in Counter(info.filename for info in infos).items() if count > 1)
    if duplicates:
        raise BundleError(f"the wheel holds {duplicates[0]} more than once")
    for info in infos:
        _check_member(info, limits)
    total = sum(info.file_size for info in infos)
    if total > limits.max_total_bytes:
        raise BundleError(
            f"the wheel unpacks to {format_bytes(total)}, above the {format_bytes(limits.max_total_bytes)} limit"
        )


def unsafe_path_reason(name: str) -> str | None:
    """Why a member path could be written outside the install directory (zip-slip), or None if it is safe.

    >>> unsafe_path_reason("pkg/main.py") is None
    True
    >>> [unsafe_path_reason(n) for n in ["../evil.py", "/abs.py", "C:/evil.py", "pkg\\\\evil.py"]]
    ["contains '..'", 'is absolute', 'starts with a drive letter', 'contains a backslash']
    """
    if "\\" in name:
        return "contains a backslash"
    if name.startswith("/"):
        return "is absolute"
    if _DRIVE_LETTER.match(name):
        return "starts with a drive letter"
    if ".." in name.split("/"):
        return "contains '..'"
    return None


def parse_metadata(data: bytes) -> tuple[str, str]:
    """Name and Version from a wheel's METADATA file, as its author wrote them, read by packaging's parser.

    >>> parse_metadata(b"Metadata-Version: 2.1\\nName: fc2-digits\\nVersion: 0.1.0\\n\\nDescription.\\n")
    ('fc2-digits', '0.1.0')
    >>> parse_metadata(b"Name: demo\\nName: other\\nVersion: 1.0\\n")
    Traceback (most recent call last):
    ...
    fc2.bundles.BundleError: the wheel's METADATA gives Name more than once
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BundleError("the wheel's METADATA is not UTF-8 text") from None
    # Only the two fields the platform relies on are judged, not the whole file (`Metadata.from_email` validating):
    # pip installs wheels packaging's full validation refuses, e.g. License-File under Metadata-Version 2.1, which
    # setuptools wrote for years. The version is kept as written; `Metadata.version` would normalise it.
    raw, unparsed = parse_email(text)
    for field in ("Name", "Version"):
        if field.lower() in unparsed:  # a field given twice is left unparsed
            raise BundleError(f"the wheel's METADATA gives {field} more than once")
    name, version = raw.get("name", "").strip(), raw.get("version", "").strip()
    missing = [field for field, value in (("Name", name), ("Version", version)) if not value]
    if missing:
        raise BundleError(f"the wheel's METADATA has no {' or '.join(missing)}")
    return name, version


# The distributions that say which framework a bundle's code trains with (PEP 503 names). Keras 3 runs on either
# framework's backend, so keras says nothing alone; tf-keras is TensorFlow's own Keras 2.
FRAMEWORK_DISTRIBUTIONS = {
    "tensorflow": "tensorflow",
    "tensorflow-cpu": "tensorflow",
    "tensorflow-gpu": "tensorflow",
    "tf-keras": "tensorflow",
    "torch": "pytorch",
}
# NVIDIA's CUDA libraries as PyPI names them (nvidia-cublas-cu12, nvidia-cudnn-cu11, …): a CUDA machine's only.
_CUDA_DISTRIBUTION = re.compile(r"nvidia-.+-cu\d+")
# A CUDA build's local version (torch==2.3.0+cu121), also as a URL writes it (…/torch-2.3.0%2Bcu121-…whl).
_CUDA_LOCAL_VERSION = re.compile(r"(\+|%2B)cu\d+", re.IGNORECASE)


def requirements_framework(requires: Sequence[Requirement]) -> str:
    """The framework a bundle trains with, from what it requires: "pytorch" or "tensorflow" when it names one of
    them (FRAMEWORK_DISTRIBUTIONS), "" when it names neither or both (unknown: the job says which).

    >>> [requirements_framework([Requirement(r) for r in rs]) for rs in (["torch"], ["tensorflow-cpu", "keras"],
    ...     ["keras"], ["torch", "tensorflow"], [])]
    ['pytorch', 'tensorflow', '', '', '']
    """
    names = {canonicalize_name(r.name) for r in requires}
    named = {FRAMEWORK_DISTRIBUTIONS[name] for name in names if name in FRAMEWORK_DISTRIBUTIONS}
    return named.pop() if len(named) == 1 else ""


def cuda_requirement(requires: Sequence[Requirement]) -> str:
    """The first requirement only a machine with CUDA can install — an NVIDIA CUDA library (nvidia-*-cu12) or a CUDA
    build's local version (+cu121) — as written (cut to REQUIREMENT_MAX_LENGTH); "" when there is none.

    >>> [cuda_requirement([Requirement(r)]) for r in ("torch==2.3.0+cu121", "nvidia-cudnn-cu12>=9", "torch>=2",
    ...     "nvidia-ml-py")]
    ['torch==2.3.0+cu121', 'nvidia-cudnn-cu12>=9', '', '']
    """
    for requirement in requires:
        written = str(requirement)
        if _CUDA_DISTRIBUTION.fullmatch(canonicalize_name(requirement.name)) or _CUDA_LOCAL_VERSION.search(
            f"{requirement.specifier} {requirement.url or ''}"
        ):
            return written if len(written) <= REQUIREMENT_MAX_LENGTH else written[: REQUIREMENT_MAX_LENGTH - 1] + "…"
    return ""


def resolve_main_script(names: Sequence[str], main_script: str) -> str:
    """The member path of the main script: `main_script` itself if it has a `/`, else the one member so named.

    >>> resolve_main_script(["demo/__init__.py", "demo/main.py"], "main.py")
    'demo/main.py'
    >>> resolve_main_script(["demo/main.py", "demo/train.py"], "demo/train.py")
    'demo/train.py'
    """
    check_main_script_arg(main_script)
    if "/" in main_script:
        if main_script not in names:
            raise BundleError(f"main script {main_script} is not in the wheel")
        found = [main_script]
    else:
        found = sorted(name for name in names if PurePosixPath(name).name == main_script and not _in_metadata_dir(name))
    if not found:
        raise BundleError(f"main script {main_script} is not in the wheel (looked at the top level and in packages)")
    if len(found) > 1:
        raise BundleError(
            f"main script {main_script} is ambiguous: the wheel has {', '.join(found)}; "
            f"give its full path, e.g. {found[0]}"
        )
    module_name(found[0])
    return found[0]


def module_name(member: str) -> str:
    """The dotted module `python -m` runs for a main script inside the wheel.

    >>> module_name("fc2_digits/main.py")
    'fc2_digits.main'
    >>> module_name("main.py")
    'main'
    >>> module_name("my-pkg/main.py")
    Traceback (most recent call last):
    ...
    fc2.bundles.BundleError: main script my-pkg/main.py cannot be run as a module: 'my-pkg' is not a Python identifier
    """
    parts = PurePosixPath(member).with_suffix("").parts
    for part in parts:
        if not part.isidentifier() or keyword.iskeyword(part):
            raise BundleError(f"main script {member} cannot be run as a module: {part!r} is not a Python identifier")
    return ".".join(parts)


def dist_info_distribution(dist_info: str) -> str:
    """The distribution a `.dist-info` directory belongs to.

    >>> dist_info_distribution("fc2_digits_cnn-0.1.0.dist-info")
    'fc2_digits_cnn'
    """
    return dist_info.removesuffix(".dist-info").rsplit("-", 1)[0]


def format_bytes(size: int) -> str:
    """A size for a human, in binary units.

    >>> [format_bytes(n) for n in (100, 1536, 50 * MB, 200 * MB + 1, 1536 * MB, 4 * 2**40)]
    ['100 bytes', '1.5 KB', '50 MB', '200 MB', '1.5 GB', '4 TB']
    """
    if size < 1024:
        return f"{size} bytes"
    amount = float(size)
    for unit in ("KB", "MB", "GB"):
        amount /= 1024
        if amount < 1024:
            return f"{round(amount, 1):g} {unit}"
    return f"{round(amount / 1024, 1):g} TB"


def _check_member(info: zipfile.ZipInfo, limits: ZipLimits) -> None:
    name = info.filename
    reason = unsafe_path_reason(name)
    if reason:
        raise BundleError(f"unsafe path in the wheel: {name!r} {reason}")
    if stat.S_ISLNK(info.external_attr >> 16):
        raise BundleError(f"unsafe member in the wheel: {name} is a symbolic link")
    if info.flag_bits & 0x1:
        raise BundleError(f"the wheel's member {name} is encrypted")
    if info.file_size > limits.max_member_bytes:
        raise BundleError(
            f"the wheel's member {name} unpacks to {format_bytes(info.file_size)}, "
            f"above the {format_bytes(limits.max_member_bytes)} limit per file"
        )
    ratio = info.file_size / max(info.compress_size, 1)
    if info.file_size > limits.ratio_min_bytes and ratio > limits.max_ratio:
        raise BundleError(
            f"the wheel's member {name} looks like a zip bomb: it compresses {ratio:.0f}:1, "
            f"above the {limits.max_ratio}:1 limit"
        )


def _check_same_distribution(name: str, file_distribution: str, what: str) -> None:
    """pip refuses a wheel whose .dist-info directory or METADATA names another distribution than its file name.

    Names are compared as pip compares them, canonicalised (PEP 503): `FC2_Digits.CNN` is `fc2-digits-cnn`.
    """
    if canonicalize_name(name) != canonicalize_name(file_distribution):
        raise BundleError(f"the file name says distribution {file_distribution!r} but {what} says {name!r}")


def _check_same_version(version: str, file_version: Version) -> None:
    """pip refuses a wheel whose METADATA gives another version than its file name (compared as PEP 440 versions)."""
    try:
        same = Version(version) == file_version
    except InvalidVersion:
        raise BundleError(f"the wheel's METADATA gives version {version!r}, which is not a valid version") from None
    if not same:
        raise BundleError(f"the file name says version {file_version} but its METADATA says {version!r}")


def _check_fits_columns(info: WheelInfo) -> None:
    """Refuse a name, version or main script path too long for the column it is stored in."""
    for value, limit, what in (
        (info.distribution, DISTRIBUTION_MAX_LENGTH, "name"),
        (info.version, VERSION_MAX_LENGTH, "version"),
        (info.main_script, MAIN_SCRIPT_MAX_LENGTH, "main script path"),
    ):
        if len(value) > limit:
            raise BundleError(f"the wheel's {what} is longer than {limit} characters")


def _in_metadata_dir(name: str) -> bool:
    top = name.split("/")[0]
    return "/" in name and (top.endswith(".dist-info") or top.endswith(".data"))


def _seekable(fileobj: BinaryIO, max_bytes: int) -> BinaryIO:
    """The file itself if it can seek (zipfile needs that), else its first bytes in memory, enough to judge it."""
    seekable = getattr(fileobj, "seekable", None)
    if seekable is not None and seekable():
        fileobj.seek(0)
        return fileobj
    return io.BytesIO(fileobj.read(max_bytes + 1))


def _measure(stream: BinaryIO, max_bytes: int) -> tuple[int, str]:
    """Size and SHA-256 of the file, reading no further than one byte past the limit; leaves it rewound."""
    digest = hashlib.sha256()
    size = 0
    while chunk := stream.read(MB):
        size += len(chunk)
        if size > max_bytes:
            raise BundleError(f"the wheel is larger than the {format_bytes(max_bytes)} limit")
        digest.update(chunk)
    if size == 0:
        raise BundleError("the file is empty")
    stream.seek(0)
    return size, digest.hexdigest()


def _open_zip(stream: BinaryIO) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(stream)
    except zipfile.BadZipFile:
        raise BundleError("not a wheel: the file is not a zip archive") from None
    except ZIP_READ_ERRORS as exc:
        raise BundleError(f"not a wheel: its zip directory cannot be read ({exc})") from None


def _read_member(zf: zipfile.ZipFile, name: str, max_bytes: int) -> bytes:
    """A member's content, refused if the header or the stream itself goes past `max_bytes`."""
    info = zf.getinfo(name)
    if info.file_size > max_bytes:
        raise BundleError(f"{name} is {format_bytes(info.file_size)}, above the {format_bytes(max_bytes)} limit")
    try:
        with zf.open(info) as member:
            data = member.read(max_bytes + 1)
    except ZIP_READ_ERRORS as exc:
        raise BundleError(f"cannot read {name} from the wheel: {exc}") from None
    if len(data) > max_bytes:
        raise BundleError(f"{name} is larger than the {format_bytes(max_bytes)} limit")
    return data
