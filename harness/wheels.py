"""Hand-made wheels for the tests (and benchmarks): a minimal good one (`GOOD`), `make_wheel` to vary it member by
member, and `sleeper_wheel`, whose code sleeps: a real cluster that costs nothing but its processes."""

from __future__ import annotations

import zipfile
from pathlib import Path

FILENAME = "demo-1.0-py3-none-any.whl"
DIST_INFO = "demo-1.0.dist-info"
METADATA = b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\nSummary: A demo.\n\nA description.\n"
GOOD = {
    "demo/__init__.py": b"",
    "demo/main.py": b"print('training')\n",
    f"{DIST_INFO}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    f"{DIST_INFO}/METADATA": METADATA,
    f"{DIST_INFO}/RECORD": b"",
}


def make_wheel(directory: Path, members: dict[str, bytes | None], filename: str = FILENAME) -> Path:
    """Write a wheel holding `members`; a member mapped to None is left out."""
    path = directory / filename
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            if data is not None:
                zf.writestr(name, data)
    return path


def sleeper_wheel(directory: Path) -> Path:
    """A good wheel whose main script says it is up and then sleeps for ten minutes."""
    return make_wheel(directory, {**GOOD, "demo/main.py": b"import time\nprint('up', flush=True)\ntime.sleep(600)\n"})
