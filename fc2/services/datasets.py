"""Datasets: the built-in sets (materialised once as .npz files), registering URLs, and uploads (an .npz checked
against the dataset contract from its .npy headers, never loaded).

The dataset contract (examples/README.md, "Dataset"): an .npz with `x_train`, `y_train`, `x_test`, `y_test` — the
examples as numbers, one row per example (images shaped (n, height, width[, channels])), the labels as whole numbers,
one per example. Every built-in is stored so; an upload that is not is refused when it is uploaded, with what it
lacks, rather than failing its job on the nodes after the cluster was paid for.
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING

import numpy as np
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import UploadedFile
from django.core.validators import URLValidator
from numpy.lib import format as npy_format

from common.columns import max_length
from fc2.bundles import ZIP_READ_ERRORS, format_bytes
from fc2.models import Dataset
from fc2.services.files import atomic_with_files, track
from monitor import safe_fetch

if TYPE_CHECKING:
    from django.contrib.auth.models import User


Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # x_train, x_test, y_train, y_test


class DatasetError(ValueError):
    """A dataset cannot be used; the message says why."""


@dataclass(frozen=True)
class Builtin:
    name: str  # what users pick, e.g. "digits"
    title: str  # shown in the wizard
    features: int  # values per example
    rows: int  # examples, train + test
    load: Callable[[], Arrays]  # real loading code


def _load_digits() -> Arrays:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]
    return train_test_split(x, digits.target.astype("int64"), test_size=0.2, random_state=0, stratify=digits.target)


def _keras_images(loader_name: str) -> Callable[[], Arrays]:
    def load() -> Arrays:
        import keras  # type: ignore[import-untyped]  # (TensorFlow's Keras has no type hints)

        (x_train, y_train), (x_test, y_test) = getattr(keras.datasets, loader_name).load_data()

        def images(x: np.ndarray) -> np.ndarray:
            x = x.astype("float32") / 255.0
            return x[..., None] if x.ndim == 3 else x

        return images(x_train), images(x_test), y_train.reshape(-1).astype("int64"), y_test.reshape(-1).astype("int64")

    return load


BUILTINS = {
    b.name: b
    for b in (
        Builtin("digits", "Digits (scikit-learn, 8×8 grey, 10 classes)", 64, 1797, _load_digits),
        Builtin("mnist", "MNIST (28×28 grey, 10 classes; downloaded by Keras)", 784, 70000, _keras_images("mnist")),
        Builtin(
            "cifar10", "CIFAR-10 (32×32 colour, 10 classes; downloaded by Keras)", 3072, 60000, _keras_images("cifar10")
        ),
    )
}


def builtin_path(name: str) -> Path:
    return settings.MEDIA_ROOT / "datasets" / "builtin" / f"{name}.npz"


def materialise_builtin(name: str) -> Path:
    """The .npz of built-in `name`, written on first use with the set's real loading code."""
    builtin = BUILTINS.get(name)
    if builtin is None:
        raise DatasetError(f"unknown built-in dataset {name!r} (available: {', '.join(BUILTINS)})")
    path = builtin_path(name)
    if path.exists():
        return path
    try:
        x_train, x_test, y_train, y_test = builtin.load()
    except Exception as exc:  # keras.datasets raises whatever urllib/requests raise offline
        raise DatasetError(
            f"the built-in dataset {name!r} could not be loaded ({type(exc).__name__}: {exc}); it is downloaded on "
            "first use, so this machine needs internet access to it — or upload the data, or give a URL"
        ) from exc
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.npz")
    np.savez_compressed(partial, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    partial.replace(path)
    return path


def ensure_builtin_rows() -> list[Dataset]:
    """One Dataset row per built-in (no owner: everyone may pick them); path filled once materialised."""
    rows = []
    for builtin in BUILTINS.values():
        path = builtin_path(builtin.name)
        dataset, _ = Dataset.objects.update_or_create(
            kind=Dataset.Kind.BUILTIN,
            builtin_name=builtin.name,
            defaults={
                "owner": None,
                "name": builtin.name,
                "features": builtin.features,
                "rows": builtin.rows,
                "path": str(path) if path.exists() else "",
                "size_mb": round(path.stat().st_size / 2**20, 3) if path.exists() else None,
            },
        )
        rows.append(dataset)
    return rows


def ready(dataset: Dataset) -> Dataset:
    """The dataset with a path the nodes can fetch; built-ins are materialised here (and may fail, clearly)."""
    if dataset.kind == Dataset.Kind.BUILTIN:
        path = materialise_builtin(dataset.builtin_name)
        if dataset.path != str(path):
            dataset.path = str(path)
            dataset.size_mb = round(path.stat().st_size / 2**20, 3)
            dataset.save(update_fields=["path", "size_mb"])
    elif dataset.kind == Dataset.Kind.UPLOAD:
        if not Path(dataset.path).is_file():
            raise DatasetError(f"the uploaded file of dataset {dataset.name!r} is missing")
        # Again: it may have been stored before the contract was checked at upload.
        with open(dataset.path, "rb") as stored:
            try:
                describe_npz(stored)
            except DatasetError as exc:
                raise DatasetError(f"dataset {dataset.name!r} cannot be used: {exc}") from exc
    elif dataset.kind == Dataset.Kind.URL:
        check_url(dataset.url)  # again: it may have been stored before the rules, or its name resolve elsewhere now
    return dataset


def resolve(user: User, name_or_url: str) -> Dataset:
    """The dataset a CLI or form argument names: a built-in, one of the user's datasets, or a URL dataset.

    A new URL dataset is returned unsaved: it is stored with the job that uses it, or not at all. Only http(s) URLs to
    public addresses are taken (see `check_url`).
    """
    value = name_or_url.strip()
    if value.lower().startswith(("http://", "https://")):
        check_url(value)
        try:
            URLValidator(schemes=["http", "https"])(value)
        except ValidationError as exc:
            raise DatasetError(f"not a valid URL: {value}") from exc
        existing = Dataset.objects.filter(owner=user, kind=Dataset.Kind.URL, url=value).first()
        name = value.rstrip("/").rsplit("/", 1)[-1] or value
        return existing or Dataset(owner=user, kind=Dataset.Kind.URL, url=value, name=name, path=value)
    if value in BUILTINS:
        ensure_builtin_rows()
        return Dataset.objects.get(kind=Dataset.Kind.BUILTIN, builtin_name=value)
    match = Dataset.objects.usable_by(user).filter(name=value).order_by("-created_at").first()
    if match is None:
        if "/" in value or ":" in value:  # most likely meant as a URL (example.com/x.npz, file:///…): say what is wrong
            try:
                safe_fetch.check_url(value)
            except safe_fetch.FetchError as exc:
                raise DatasetError(f"no dataset named {value!r}, and as a URL: {exc}") from exc
        raise DatasetError(f"no dataset named {value!r} (built-ins: {', '.join(BUILTINS)}; or give an http(s) URL)")
    return match


def store_url(owner: User, url: str, name: str = "") -> tuple[Dataset, bool]:
    """The owner's dataset for an http(s) URL (refused as `resolve` refuses it), stored now rather than with its first
    job; True if it is new. `name` names it (default: the URL's last part)."""
    if not url.strip().lower().startswith(("http://", "https://")):
        raise DatasetError(f"not an http(s) URL: {url!r}")
    if len(url.strip()) > (max_url := max_length(Dataset, "url")):
        raise DatasetError(f"a dataset URL has at most {max_url} characters")
    dataset = resolve(owner, url)
    created = dataset.pk is None
    if name.strip():
        dataset.name = name.strip()
    max_name = max_length(Dataset, "name")
    if len(dataset.name) > max_name:
        raise DatasetError(f"a dataset's name has at most {max_name} characters")
    dataset.save()
    return dataset, created


def check_url(url: str) -> None:
    """DatasetError, with the reason, unless nodes may download `url`: http(s) to a public address, or to one in the
    operator's FC2_DATASET_ALLOWED_NETWORKS. Checked here so that a bad URL is refused at submit time; the node that
    downloads it checks again at every redirect and connection (monitor/safe_fetch.py), as DNS answers can change."""
    try:
        safe_fetch.check_url(url, settings.FC2_DATASET_ALLOWED_NETWORKS)
    except safe_fetch.FetchError as exc:
        said = str(exc)
        # Refused for its address alone: say which setting admits it (safe_fetch names it for some refusals itself).
        if ALLOWED_NETWORKS_SETTING not in said and _admitted_by_a_network(url):
            said += (
                f"; the platform's administrator may admit that address's network with the setting "
                f"{ALLOWED_NETWORKS_SETTING} (a comma-separated list of CIDR networks, e.g. 10.1.0.0/16)"
            )
        raise DatasetError(f"dataset URL refused: {said}") from exc


ALLOWED_NETWORKS_SETTING = "FC2_DATASET_ALLOWED_NETWORKS"
# Every address: a URL these admit is refused for its address alone, which the setting can change.
EVERY_NETWORK = ("0.0.0.0/0", "::/0")


def _admitted_by_a_network(url: str) -> bool:
    try:
        safe_fetch.check_url(url, EVERY_NETWORK)
    except safe_fetch.FetchError:
        return False
    return True


# np.save writes version 1.0, or 2.0 for a header above 64 KB (3.0 only for structured types with non-Latin-1 names).
NPY_HEADER_READERS = {(1, 0): npy_format.read_array_header_1_0, (2, 0): npy_format.read_array_header_2_0}
# Arrays that unpack to more than this many times their compressed size are refused above NPZ_RATIO_MIN_BYTES: real
# data (images, features, labels) stays far below, while 1 GiB of zeros deflates to 1 MB (1000:1).
NPZ_MAX_RATIO = 100
NPZ_RATIO_MIN_BYTES = 2**20
# Rows and features are stored in PositiveIntegerFields.
NPZ_MAX_COUNT = 2**31 - 1


# The arrays of the dataset contract, each with what it holds, as a refusal names them.
CONTRACT_ARRAYS = {
    "x_train": "the training examples",
    "y_train": "their labels",
    "x_test": "the test examples",
    "y_test": "their labels",
}
CONTRACT = (
    "a dataset is an .npz (numpy.savez) with x_train, y_train, x_test and y_test: the examples as numbers, one row "
    "per example (images shaped (n, height, width[, channels])), and the labels as whole numbers, one per example"
)


def describe_npz(fileobj: IO[bytes]) -> tuple[int, int]:
    """(rows, features) of an .npz that keeps the dataset contract (CONTRACT), else DatasetError saying what it lacks.

    Judged from the zip's central directory and each member's .npy header, never by loading an array: a small file
    can declare arrays of any size. DatasetError also if a member is not an .npy array, holds Python objects (which
    the nodes will not unpickle), declares more or less data than it holds, or unpacks suspiciously well (a zip bomb).
    The file is left rewound.
    """
    try:
        with _open_npz(fileobj) as zf:
            arrays = {
                PurePosixPath(info.filename).stem: _npy_header(zf, info) for info in zf.infolist() if not info.is_dir()
            }
    finally:
        fileobj.seek(0)
    if missing := [f"{key} ({what})" for key, what in CONTRACT_ARRAYS.items() if key not in arrays]:
        held = f"it holds {', '.join(sorted(arrays))}" if arrays else "it holds no array"
        raise DatasetError(f"the .npz lacks {', '.join(missing)}; {held}. The contract: {CONTRACT}")
    for part in ("train", "test"):
        _check_part(part, arrays[f"x_{part}"], arrays[f"y_{part}"])
    if arrays["x_train"][0][1:] != arrays["x_test"][0][1:]:
        raise DatasetError(
            f"x_train's examples are shaped {arrays['x_train'][0][1:]} but x_test's {arrays['x_test'][0][1:]}: a "
            "model trained on the one cannot be tested on the other"
        )
    shapes = (arrays["x_train"][0], arrays["x_test"][0])
    rows, features = sum(shape[0] for shape in shapes), math.prod(shapes[0][1:])
    if rows > NPZ_MAX_COUNT or features > NPZ_MAX_COUNT:
        raise DatasetError(f"the .npz declares {rows} rows of {features} features, more than the platform counts")
    return rows, features


def _check_part(part: str, x: tuple[tuple[int, ...], np.dtype], y: tuple[tuple[int, ...], np.dtype]) -> None:
    """x_<part> holds examples of numbers, y_<part> one whole-number label for each (`_npy_header`'s shapes, dtypes)."""
    (x_shape, x_type), (y_shape, y_type) = x, y
    if len(x_shape) < 2:
        raise DatasetError(f"x_{part} is shaped {x_shape}: it needs one row per example, each of one or more values")
    if x_type.kind not in "biuf":
        raise DatasetError(f"x_{part} holds {x_type} values: the examples must be numbers")
    if x_shape[0] < 1:
        raise DatasetError(f"x_{part} holds no example")
    if len(y_shape) != 1 and not (len(y_shape) == 2 and y_shape[1] == 1):
        raise DatasetError(f"y_{part} is shaped {y_shape}: it needs one label per example, shaped (n,)")
    if y_type.kind not in "iu":
        raise DatasetError(f"y_{part} holds {y_type} values: the labels must be whole numbers (class indices)")
    if y_shape[0] != x_shape[0]:
        raise DatasetError(f"x_{part} holds {x_shape[0]} examples but y_{part} {y_shape[0]} labels")


def _open_npz(fileobj: IO[bytes]) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(fileobj)
    except zipfile.BadZipFile:
        raise DatasetError("the .npz file is not a zip archive (save it with numpy.savez)") from None
    except ZIP_READ_ERRORS as exc:
        raise DatasetError(f"the .npz file's zip directory cannot be read ({exc})") from None


def _npy_header(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype an .npz member's .npy header declares, refused unless its data is exactly what it holds."""
    name = info.filename
    if info.file_size > NPZ_RATIO_MIN_BYTES and info.file_size > NPZ_MAX_RATIO * max(info.compress_size, 1):
        raise DatasetError(
            f"{name} in the .npz looks like a zip bomb: it unpacks to {format_bytes(info.file_size)} from "
            f"{format_bytes(info.compress_size)}, above the {NPZ_MAX_RATIO}:1 limit"
        )
    try:
        with zf.open(info) as member:
            read_header = NPY_HEADER_READERS.get(npy_format.read_magic(member))
            if read_header is None:
                raise ValueError("an .npy format version numpy.save does not write")
            shape, _, dtype = read_header(member)
            header_bytes = member.tell()
    except ZIP_READ_ERRORS as exc:  # read_magic and the header readers raise ValueError for what is not .npy
        raise DatasetError(f"{name} in the .npz is not a readable .npy array ({exc})") from None
    if dtype.hasobject:
        raise DatasetError(f"{name} in the .npz holds Python objects, which the platform does not load")
    declared = math.prod(shape) * dtype.itemsize
    if header_bytes + declared != info.file_size:
        raise DatasetError(
            f"{name} in the .npz declares {format_bytes(max(declared, 0))} of data but holds "
            f"{format_bytes(max(info.file_size - header_bytes, 0))}"
        )
    return shape, dtype


def store_upload(owner: User, upload: UploadedFile, name: str = "") -> Dataset:
    """A dataset from an uploaded file (size-limited) that keeps the dataset contract (`describe_npz`: refused, and
    nothing stored, when it does not), with its rows and features. Its name is `name`, or the file's without its
    extension (as `fc2 submit` names it: a workload reads `dist:mydata`)."""
    limit = settings.FC2_MAX_DATASET_MB * 2**20
    filename, size = upload.name or "", upload.size or 0  # an uploaded file has both
    if size == 0:
        raise DatasetError("the dataset file is empty")
    if size > limit:
        raise DatasetError(f"the dataset file is larger than {settings.FC2_MAX_DATASET_MB} MB")
    name = name or PurePosixPath(filename).stem
    max_name = max_length(Dataset, "name")
    if len(name) > max_name:
        raise DatasetError(f"the dataset's name is longer than {max_name} characters: rename the file")
    if not filename.lower().endswith(".npz"):
        raise DatasetError(f"{PurePosixPath(filename).name} is not an .npz file: {CONTRACT}")
    rows, features = describe_npz(upload)
    dataset = Dataset(
        owner=owner,
        kind=Dataset.Kind.UPLOAD,
        name=name,
        size_mb=round(size / 2**20, 3),
        rows=rows,
        features=features,
    )
    with atomic_with_files():
        dataset.file.save(PurePosixPath(filename).name, upload, save=False)
        track(dataset.file)
        dataset.path = dataset.file.path
        dataset.save()
    return dataset
