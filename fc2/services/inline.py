"""Jobs driven in this process (`submit_job --inline`, `lab_sweep`): the pipeline's steps run one after the other
here, holding the job's lease throughout, while a private WSGI server on 127.0.0.1 takes the nodes' reports — no
Celery worker and no web server needed. Should this process die, the lease expires and the sweep hands the job to the
workers (fc2/services/sweep.py). Interrupted — Ctrl-C, or SIGTERM, taken the same way — the job is cancelled and
its cluster torn down before the process exits."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from fc2.models import Job
from fc2.services import pipeline, sweep
from fc2.services.pipeline import Lease

State = Job.State


def run_inline(job_id: int, poll_s: float = 0.5) -> Job:
    """Drive a job to its end in this process, holding its lease throughout and serving the report API on a private
    port meanwhile. Should this process die, its lease expires and the sweep hands the job to the workers."""
    lease = Lease.claim(job_id)
    if lease is None:
        raise RuntimeError(f"job {job_id} is driven by another process")
    with Interrupts() as interrupts, report_server() as url, lease.renewing():
        try:
            _run_steps(pipeline.FIRST_STEP, job_id, url, lease, interrupts)
            while lease.held and not (job := Job.objects.get(pk=job_id)).is_terminal:
                interrupts.check()
                if job.state == State.COLLECTING:
                    pipeline.run_step(pipeline.STEP_OF[job.state], job_id)
                elif job.state == State.RUNNING:
                    sweep.check_running(job)
                elif job.state == State.PROVISIONING and pipeline.restarting(job) is not None:
                    # a lost node's restart (pipeline.node_lost): its cluster made again and started
                    _run_steps("provision", job_id, url, lease, interrupts, resume=True)
                else:
                    break  # a step did nothing: the job is no longer this process's to drive
                time.sleep(poll_s)
        except BaseException:
            _interrupted(job_id)  # Ctrl-C or a crash here must not leave a cluster behind
            raise
        finally:
            pipeline.release(job_id, lease)  # an ended job's cluster: failed by a node's report, cancelled, or done
            lease.end()
    return Job.objects.get(pk=job_id)


def _run_steps(
    step: str | None, job_id: int, url: str, lease: Lease, interrupts: Interrupts, resume: bool = False
) -> None:
    """Run the pipeline's steps from `step` on, each after the one before, until one stops the job or none is left."""
    attempt = 1
    while step and lease.held:
        interrupts.check()
        try:
            if not pipeline.run_step(step, job_id, attempt, report_url=url, resume=resume or attempt > 1):
                return
        except pipeline.TryAgain as again:
            time.sleep(again.delay_s)  # this process is the job's driver: nothing else to do meanwhile
            attempt += 1
            continue
        step, attempt, resume = pipeline.STEPS[step].next, 1, False


class Interrupts:
    """SIGINT (Ctrl-C) and SIGTERM (`kill`, a container stopped, a CI runner's time out) end this process by an
    exception the runner cleans up after — KeyboardInterrupt, or SystemExit with the status a process killed by the
    signal has — rather than at once, its cluster left running. Both handlers are set here, whatever this process
    inherited (a SIGINT ignored by its parent included), and each signal is also kept: an exception raised where
    Python swallows it (a destructor, a garbage-collector callback) is raised again by `check()`, which the runner's
    loops call. Only the main thread can take signals; elsewhere (a test's thread) the handlers stay as they were."""

    def __init__(self) -> None:
        self.received: int | None = None

    def __enter__(self) -> Interrupts:
        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self.previous[signum] = signal.signal(signum, self._interrupt)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def _interrupt(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        self.check()

    def check(self) -> None:
        if self.received == signal.SIGINT:
            raise KeyboardInterrupt
        if self.received is not None:
            raise SystemExit(128 + self.received)


def _interrupted(job_id: int) -> None:
    job = Job.objects.get(pk=job_id)
    if job.state == State.COLLECTING:
        pipeline.collect(job_id)  # the chief has succeeded: collecting is quicker than anything else, and right
    else:
        pipeline.cancel(job, "interrupt")


@contextmanager
def report_server() -> Iterator[str]:
    """The platform's WSGI app on a free 127.0.0.1 port in a background thread; yields its base URL."""
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
    from django.core.wsgi import get_wsgi_application

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadedWSGIServer(("127.0.0.1", 0), QuietHandler, allow_reuse_address=False)
    server.set_app(get_wsgi_application())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
