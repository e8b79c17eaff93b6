"""Soak of the embedded stack: hours of `make run` compressed into minutes, on the embedded broker.

`manage.py serve` (what `make run` starts: runserver, and the Celery worker with beat, supervised) runs in a scratch
FC2_VAR_DIR with the sweep every second (five times `make run`'s rate), while --publishers processes send tasks to the
worker's queue as the web server and `submit_job` do, each every --interval seconds, for --minutes. Then the queue is
given time to drain, the platform is stopped with a TERM (as Ctrl-C would), and the figures are read from the worker's
log and the broker's folders:

    messages sent / consumed / lost / consumed twice   (each task's id, as the worker logs it)
    unreadable                                         (set aside in broker/rejected, each with its log line)
    publisher errors                                   (a send that raised)
    worker restarts, "Unrecoverable error" lines       (`serve` restarting a worker that died)
    sweeps run, wall time, stop time

--transport kombu runs the same against kombu's own filesystem transport (settings' CELERY_BROKER_TRANSPORT replaced by
kombu's "filesystem" in a settings module made for the run), to show the race fc2/broker.py removes
(celery/kombu#1551). Nothing of the developer's var/ is touched; REDIS_URL and DATABASE_URL are ignored.

    .venv/bin/python benchmarks/broker_soak.py [--minutes 10] [--publishers 4] [--interval 1] [--transport fc2|kombu]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent
# The run's settings: fc2.settings with the periodic tasks' log lines kept (they are how sweeps are counted here),
# and, for --transport kombu, kombu's own transport.
SETTINGS = """\
from fc2.settings import *  # noqa: F403

LOGGING["loggers"] = {{name: config for name, config in LOGGING["loggers"].items() if not name.startswith("celery.")}}
{transport}
"""


def publish(env: dict[str, str], publisher: int, interval: float, until: float, sent_file: str) -> None:
    """Send tasks until `until`, writing each one's id, and a line per send that raised."""
    os.environ.update(env)
    sys.path[:0] = env["PYTHONPATH"].split(os.pathsep)  # the run's settings module, and the project
    from fc2.celery import app

    queue = env["FC2_QUEUE"]
    with open(sent_file, "w") as out:
        sequence = 0
        while time.time() < until:
            try:
                result = app.send_task("celery.accumulate", args=(publisher, sequence), queue=queue)
                out.write(f"sent {result.id}\n")
            except Exception as exc:  # the figure is how many; the run goes on as a web server would
                out.write(f"error {type(exc).__name__}: {exc}\n".replace("\n", " ") + "\n")
            out.flush()
            sequence += 1
            time.sleep(interval)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def soak(minutes: float, publishers: int, interval: float, transport: str) -> dict[str, object]:
    var = Path(tempfile.mkdtemp(prefix=f"fc2-soak-{transport}-"))
    (var / "soak_settings.py").write_text(
        SETTINGS.format(transport='CELERY_BROKER_TRANSPORT = "filesystem"' if transport == "kombu" else "")
    )
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env.update(
        FC2_VAR_DIR=str(var), FC2_QUEUE="fc2-soak", DEBUG="1", FC2_SWEEP_INTERVAL_S="1",
        DJANGO_SETTINGS_MODULE="soak_settings", PYTHONPATH=os.pathsep.join([str(var), str(PROJECT_DIR)]),
    )  # fmt: skip
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v0"], cwd=PROJECT_DIR, env=env, check=True)
    log = var / "serve.log"
    start = time.monotonic()
    with log.open("wb") as out:
        serve = subprocess.Popen(
            [sys.executable, "manage.py", "serve", f"127.0.0.1:{free_port()}"],
            cwd=PROJECT_DIR, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    while " ready." not in log.read_text():
        if time.monotonic() - start > 300 or serve.poll() is not None:
            raise SystemExit(f"the worker did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    load_start = time.monotonic()
    until = time.time() + minutes * 60
    context = multiprocessing.get_context("spawn")
    sent_files = [str(var / f"sent-{n}.txt") for n in range(publishers)]
    processes = [
        context.Process(target=publish, args=(env, n, interval, until, sent_files[n])) for n in range(publishers)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    sent = {
        line.split()[1] for f in sent_files for line in Path(f).read_text().splitlines() if line.startswith("sent ")
    }
    errors = [line for f in sent_files for line in Path(f).read_text().splitlines() if line.startswith("error ")]

    def consumed() -> list[str]:
        return re.findall(r"Task celery\.accumulate\[(\S+)\] succeeded", log.read_text())

    drain_deadline = time.monotonic() + 120  # the backlog, if any, at the worker's pace
    while len(set(consumed()) & sent) < len(sent) and time.monotonic() < drain_deadline:
        time.sleep(1)
    load_s = time.monotonic() - load_start
    stop_start = time.monotonic()
    os.killpg(serve.pid, signal.SIGTERM)
    serve.wait(timeout=60)
    stop_s = time.monotonic() - stop_start
    text = log.read_text()
    ids = consumed()
    rejected = os.listdir(var / "broker" / "rejected")
    return {
        "transport": "fc2.broker:Transport" if transport == "fc2" else "kombu filesystem (stock)",
        "publishers x interval": f"{publishers} x {interval} s",
        "messages sent": len(sent),
        "messages consumed": len(set(ids) & sent),
        "messages lost": len(sent - set(ids)),
        "messages consumed twice": len(ids) - len(set(ids)),
        "unreadable (set aside)": len(rejected),
        "publisher errors": len(errors),
        "worker restarts": len(re.findall(r"fc2 serve: the Celery worker .* starting it again", text)),
        "'Unrecoverable error' lines": text.count("Unrecoverable error"),
        "platform stopped itself": "fc2 serve: the" in text and "stopping the platform" in text,
        "sweeps run": len(re.findall(r"Task fc2\.tasks\.sweep\[\S+\] succeeded", text)),
        "load + drain wall time s": round(load_s, 1),
        "stop after TERM s": round(stop_s, 1),
        "first publisher error": errors[0][:200] if errors else "",
        "var dir": str(var),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--publishers", type=int, default=4)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between one publisher's sends")
    parser.add_argument("--transport", choices=("fc2", "kombu"), default="fc2")
    args = parser.parse_args()
    figures = soak(args.minutes, args.publishers, args.interval, args.transport)
    width = max(map(len, figures))
    for name, value in figures.items():
        print(f"{name:<{width}}  {value}", flush=True)


if __name__ == "__main__":
    main()
