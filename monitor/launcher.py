"""Runs a PyTorch node's main module as `python -m` would, and ends the process without the interpreter's finalization.

Why: torch 2.13's gloo now and then aborts a process ("terminate called without an active exception", exit 134)
while the interpreter finalizes, after the code's work is done and even when it called
`dist.destroy_process_group()`: a thread of the process group frees the last collective's tensor and cannot take the
GIL (pytorch/pytorch#179291; the atexit fix proposed there was abandoned). A node whose code trained every epoch
would then fail. The platform cannot change its users' code (a script written for torchrun must run unchanged), so
the bootstrap starts a PyTorch node's module through this file (`python fc2_launcher.py MODULE ARGS…`, or one such
process per GPU under torch.distributed.run; provisioner/nodes.py, `node_argv`). It is copied to the node beside the
agent (stdlib only) and does what Python's own shutdown does, in Python's order, while the interpreter is fully
alive:

1. runs the module as `python -m MODULE ARGS…` does: `__name__ == "__main__"`, sys.argv[0] the module's file,
   sys.path[0] the working directory (unless -P / PYTHONSAFEPATH says not to add one);
2. takes the exit status as Python computes it: SystemExit's code (None: 0, an int: itself, anything else printed
   to stderr: 1); an uncaught exception's traceback printed by sys.excepthook: 1; an uncaught KeyboardInterrupt
   printed, then the process killed by SIGINT as Python does (its parent sees a SIGINT death, a shell 130);
3. joins the non-daemon threads (threading's own shutdown), runs the atexit handlers, and destroys the
   torch.distributed process group if the code left one initialized;
4. flushes sys.stdout and sys.stderr (a failed flush makes the status 120, as Python's does), then every other open
   Python file object: a file the code never closed keeps what it wrote;
5. ends with `os._exit(status)`.

What it does not do: no finalization. The code's objects are never collected, so their `__del__` methods and
weakref callbacks do not run, nor does any close() that only a finalizer would have called: an object that writes
its last bytes there (a `gzip.GzipFile` or `zipfile.ZipFile` left open: their trailer or central directory) keeps
only what its flush() wrote. Nor do C/C++ static destructors and C atexit handlers run (that is the point: gloo's
is the one that aborts).
"""

from __future__ import annotations

import atexit
import gc
import io
import os
import runpy
import signal
import sys
import threading
import traceback
from typing import NoReturn

USAGE = "usage: fc2_launcher.py MODULE [ARG ...]"


def main(argv: list[str]) -> NoReturn:
    if len(argv) < 2 or argv[1].startswith("-"):
        print(USAGE, file=sys.stderr)
        os._exit(2)
    module = argv[1]
    # python -m's: "-m" while the module is found (runpy then puts the module's file), the cwd first on the path.
    sys.argv = ["-m", *argv[2:]]
    if not sys.flags.safe_path:
        sys.path[0] = os.getcwd()  # where Python put this file's directory
    status, interrupted = run(module)
    status = shutdown(status)
    if interrupted:
        # Python's own exit after an uncaught KeyboardInterrupt: die of SIGINT, so that a parent sees why.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


def run(module: str) -> tuple[int, bool]:
    """Run `module` as __main__; (the exit status Python would give, whether a KeyboardInterrupt ended it)."""
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit:
        return exit_status(exit.code), False
    except BaseException as error:  # what Python does with any uncaught exception
        # The traceback as python -m prints it: from runpy's frames on, without this file's.
        trimmed = error.with_traceback(error.__traceback__.tb_next if error.__traceback__ else None)
        sys.excepthook(type(trimmed), trimmed, trimmed.__traceback__)
        return 1, isinstance(error, KeyboardInterrupt)
    return 0, False


def exit_status(code: object) -> int:
    """SystemExit's code as the process's exit status (Python's rule). Only the low 8 bits reach the parent."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def shutdown(status: int) -> int:
    """Python's shutdown up to its finalization, in its order; returns the status, 120 if stdout or stderr could
    not be flushed."""
    threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx calls first: joins non-daemon threads
    atexit._run_exitfuncs()  # prints a failing handler's traceback and goes on, as at exit
    destroy_process_group()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and not stream.closed:  # one the code closed is not flushed, nor an error
                stream.flush()
        except (OSError, ValueError):
            status = 120
    flush_files()
    return status


def destroy_process_group() -> None:
    """Destroy the torch.distributed process group the code left initialized (never import torch for it)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    try:
        dist.destroy_process_group()
    except Exception:  # the code's work is done: say so, as Python says of a failing atexit handler
        print("Exception ignored in destroying the process group:", file=sys.stderr)
        traceback.print_exc()


def flush_files() -> None:
    """Flush every open Python file object. Enough because every buffered file object of the io module
    (BufferedWriter, BufferedRandom, TextIOWrapper, and Python subclasses of IOBase) is a garbage-collector-tracked
    container, so gc.get_objects() lists every live one, reachable or not; an unbuffered FileIO holds nothing back;
    and flushing a wrapper flushes what lies under it, so the order does not matter. What is flushed is in the
    kernel's hands: `os._exit` closes the descriptors and loses none of it."""
    for obj in gc.get_objects():
        if isinstance(obj, io.IOBase):
            try:
                if not obj.closed:
                    obj.flush()
            except (OSError, ValueError):  # a pipe closed by its reader, a wrapper whose buffer was detached
                continue


if __name__ == "__main__":
    main(sys.argv)
