"""What describing an .npz bomb costs the web server: a ~1 MB .npz whose x_train is 1 GiB of zeros.

Before: the shape was read by loading the array (`np.load(...)["x_train"].shape`, reconstructed here as it was).
After: `fc2.services.datasets.describe_npz` reads the .npy headers and the central directory, and refuses the file.
Each is measured in a fresh process (ru_maxrss is a high-water mark): peak RSS above the process's baseline, and time.

    .venv/bin/python benchmarks/upload_npz_bomb.py [--gib 1]
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_DIR))

from benchmarks._django import setup_django  # noqa: E402

MB = 2**20


def write_bomb(path: Path, gib: float) -> None:
    import numpy as np
    from numpy.lib import format as npy_format

    size = int(gib * 1024) * MB
    header = io.BytesIO()
    npy_format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (size // 4,)})
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open("x_train.npy", "w", force_zip64=True) as member:
            member.write(header.getvalue())
            zeros = bytes(MB)
            for _ in range(size // MB):
                member.write(zeros)
        zf.writestr("y_train.npy", _npy(np.zeros(10, "int64")))


def _npy(array) -> bytes:
    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def describe_by_loading(fileobj) -> tuple[int | None, int | None]:
    """describe_npz as it was before: the arrays loaded to read their shapes."""
    import numpy as np

    with np.load(fileobj, allow_pickle=False) as data:
        shapes = [data[key].shape for key in ("x_train", "x_test") if key in data.files]
    fileobj.seek(0)
    if not shapes:
        return None, None
    return sum(shape[0] for shape in shapes), int(np.prod(shapes[0][1:], dtype=np.int64))


def measure(path: Path, how: str) -> dict:
    """Run one describe in this process; peak RSS above what the process held just before."""
    setup_django(path.parent)  # the parent's temporary directory, removed with the bomb
    from fc2.services.datasets import DatasetError, describe_npz

    describe = describe_by_loading if how == "before" else describe_npz
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    start = time.perf_counter()
    with path.open("rb") as fileobj:
        try:
            outcome = f"described: {describe(fileobj)}"
        except DatasetError as exc:
            outcome = f"refused: {exc}"
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "how": how,
        "peak_rss_mb": round((peak - baseline) / 1024, 1),
        "seconds": round(seconds, 3),
        "outcome": outcome,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the zeros array, GiB")
    parser.add_argument("--measure", choices=["before", "after"], help=argparse.SUPPRESS)
    parser.add_argument("--path", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.path, args.measure)))
        return

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bomb.npz"
        write_bomb(path, args.gib)
        print(f"bomb: {path.stat().st_size / MB:.2f} MB on disk, x_train {args.gib:g} GiB of float32 zeros")
        for how in ("before", "after"):
            child = subprocess.run(
                [sys.executable, __file__, "--measure", how, "--path", str(path)],
                capture_output=True,
                text=True,
                check=True,
            )
            result = json.loads(child.stdout)
            print(f"{how:>6}: peak RSS +{result['peak_rss_mb']} MB, {result['seconds']} s — {result['outcome']}")


if __name__ == "__main__":
    main()
