"""The PyTorch nodes' launcher (monitor/launcher.py) against real `python -m`: the same tiny programs run both ways,
as a node runs them (the launcher as a file, the module found from the working directory), must exit with the same
status and leave the same output — stdout and stderr through one pipe, so their order and flushing are compared too —
and the same files.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

LAUNCHER = Path(__file__).resolve().parent.parent / "monitor" / "launcher.py"

# name -> the program, as demo/main.py.
PROGRAMS = {
    "returns": "import sys\nprint('out 1')\nprint('err 1', file=sys.stderr)\nprint('out 2')\n",
    "exit 3": "import sys\nprint('before')\nsys.exit(3)\n",
    "exit None": "raise SystemExit(None)\n",
    "exit 259": "import sys\nsys.exit(259)\n",  # the parent sees its low 8 bits
    "exit message": "import sys\nprint('before')\nsys.exit('no dataset given')\n",
    "raises": "def train():\n    raise ValueError('bad shape')\n\nprint('before')\ntrain()\n",
    "chained": "try:\n    {}['k']\nexcept KeyError as e:\n    raise RuntimeError('wrapped') from e\n",
    "os._exit": "import os, sys\nprint('lost in the buffer')\nsys.stdout.flush()\nprint('kept?')\nos._exit(7)\n",
    "stdout closed": "import sys\nprint('last words')\nsys.stdout.close()\n",
    "interrupted": "print('training')\nraise KeyboardInterrupt\n",
    "atexit": (
        "import atexit\n"
        "atexit.register(print, 'registered first, runs last')\n"
        "@atexit.register\ndef failing():\n    raise OSError('handler failed')\n"
        "atexit.register(print, 'registered last, runs first')\n"
        "print('main done')\n"
    ),
    "thread": (
        "import atexit, threading, time\n"
        "def work():\n    time.sleep(0.3)\n    print('thread done')\n"
        "threading.Thread(target=work).start()\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # never joined\n"
        "atexit.register(print, 'atexit after the thread')\n"
        "print('main done')\n"
    ),
    "argv and path": (
        "import json, os, sys\n"
        "print(json.dumps({'argv': sys.argv, 'path0': sys.path[0], 'name': __name__, 'cwd': os.getcwd(),\n"
        "                  'spec': __spec__.name, 'file': __file__}))\n"
    ),
    "files left open": (
        "import sys\n"
        "text = open('text.txt', 'w')\ntext.write('epoch 1\\n' * 1000)\n"
        "binary = open('binary.bin', 'wb')\nbinary.write(b'\\x01' * 3000)\n"
        "appended = open('log.txt', 'a', buffering=1)\nappended.write('no newline yet')\n"
        "def cycle():\n    f = open('cycle.txt', 'w')\n    holder = [f]\n    holder.append(holder)\n"
        "    f.write('unreachable but buffered')\n"
        "cycle()\n"
        "sys.exit(2)\n"
    ),
}


def run(tmp_path: Path, source: str, how: str, module: str = "demo.main") -> dict:
    """Run `module` (demo/main.py holding `source`, in a fresh directory) by `python -m` or through the launcher, with
    two arguments; what it did."""
    work = tmp_path / how
    (work / "demo").mkdir(parents=True)
    (work / "demo" / "__init__.py").write_text("")
    (work / "demo" / "main.py").write_text(source)
    start = ["-m"] if how == "python -m" else [str(LAUNCHER)]
    done = subprocess.run(
        [sys.executable, *start, module, "--epochs=2", "x y"],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
    )
    output = "\n".join(line for line in done.stdout.splitlines() if '"<frozen runpy>"' not in line)
    output = re.sub(r" at 0x[0-9a-f]+>", " at 0x…>", output)  # a function's address in "Exception ignored in …"
    files = {p.name: p.read_bytes() for p in work.iterdir() if p.is_file()}
    return {"status": done.returncode, "output": output.replace(str(work), "WORK"), "files": files}


@pytest.mark.parametrize("name", PROGRAMS)
def test_the_launcher_ends_a_program_as_python_dash_m_does(tmp_path, name):
    """Same status, same output in the same order, same files; runpy's own frames of a traceback aside (python -m
    and runpy.run_module go through different functions of it)."""
    expected, launched = run(tmp_path, PROGRAMS[name], "python -m"), run(tmp_path, PROGRAMS[name], "launcher")
    # Better than Python: its finalization loses what a file in a reference cycle still buffered; the launcher keeps it.
    if expected["files"].get("cycle.txt") == b"":
        expected["files"]["cycle.txt"] = b"unreachable but buffered"
    assert launched == expected


@pytest.mark.parametrize(
    ("name", "status", "said"),
    [
        ("exit 3", 3, "before"),
        ("exit 259", 3, ""),
        ("exit message", 1, "before\nno dataset given"),
        ("raises", 1, "ValueError: bad shape"),
        ("chained", 1, "The above exception was the direct cause"),
        ("os._exit", 7, "lost in the buffer"),
        ("interrupted", -2, "KeyboardInterrupt"),  # killed by SIGINT, as Python kills itself
        ("atexit", 0, "registered last, runs first\nException ignored in atexit callback"),
        ("thread", 0, "main done\nthread done\natexit after the thread"),
    ],
)
def test_what_the_launcher_does_is_what_a_user_expects(tmp_path, name, status, said):
    """The comparison above cannot fail by both ways being wrong alike: what each program does, stated."""
    launched = run(tmp_path, PROGRAMS[name], "launcher")
    assert launched["status"] == status and said in launched["output"]


def test_nothing_of_the_interpreters_finalization_runs_so_an_abort_there_fails_no_run(tmp_path):
    """gloo's abort, made certain: an object whose finalizer aborts the process. Python's finalization runs it (the
    run dies of SIGABRT after its work); through the launcher the finalizer never runs."""
    source = "import os\nclass Group:\n    def __del__(self):\n        os.abort()\ngroup = Group()\nprint('trained')\n"
    expected, launched = run(tmp_path, source, "python -m"), run(tmp_path, source, "launcher")
    assert (expected["status"], expected["output"]) == (-6, "trained")
    assert (launched["status"], launched["output"]) == (0, "trained")


def test_a_file_the_code_never_closed_keeps_what_it_wrote(tmp_path):
    files = run(tmp_path, PROGRAMS["files left open"], "launcher")["files"]
    assert files["text.txt"] == b"epoch 1\n" * 1000 and files["binary.bin"] == b"\x01" * 3000
    assert files["log.txt"] == b"no newline yet" and files["cycle.txt"] == b"unreachable but buffered"


def test_the_module_sees_the_argv_and_path_python_dash_m_gives(tmp_path):
    seen = json.loads(run(tmp_path, PROGRAMS["argv and path"], "launcher")["output"])
    assert seen == {
        "argv": ["WORK/demo/main.py", "--epochs=2", "x y"],
        "path0": "WORK",
        "name": "__main__",
        "cwd": "WORK",
        "spec": "demo.main",
        "file": "WORK/demo/main.py",
    }


@pytest.mark.parametrize("args", [(), ("-m", "demo.main")])
def test_the_launcher_without_a_module_says_how_it_is_used(tmp_path, args):
    done = subprocess.run([sys.executable, str(LAUNCHER), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "usage: fc2_launcher.py MODULE" in done.stderr


def test_a_module_that_is_not_there_fails_as_python_dash_m_does(tmp_path):
    expected, launched = (run(tmp_path, "", how, module="demo.nope") for how in ("python -m", "launcher"))
    assert launched["status"] == expected["status"] == 1
    assert "No module named demo.nope" in expected["output"] and "No module named demo.nope" in launched["output"]
