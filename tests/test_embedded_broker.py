"""The embedded broker (fc2/broker.py) under the race that stopped kombu's filesystem transport (celery/kombu#1551):
many publishers and a consumer on one queue folder lose no message and read none half-written; a message that cannot
be decoded is set aside with a log line, and a real worker goes on past it."""

import json
import multiprocessing
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from celery import Celery
from kombu import Connection

from fc2 import broker

PROJECT_DIR = Path(__file__).resolve().parent.parent
PUBLISHERS = 4
MESSAGES_EACH = 300


def transport_options(root: Path) -> dict:
    """The folders as fc2/settings.py lays them out under FC2_VAR_DIR/broker, polled every 10 ms."""
    folders = {name: root / name for name in ("queue", "processed", "rejected", "control")}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(folders["queue"]),
        "data_folder_out": str(folders["queue"]),
        "processed_folder": str(folders["processed"]),
        "rejected_folder": str(folders["rejected"]),
        "control_folder": str(folders["control"]),
        "polling_interval": 0.01,
    }


def connection(root: Path) -> Connection:
    return Connection("filesystem://localhost/", transport=broker.Transport, transport_options=transport_options(root))


def publish(root: Path, queue_name: str, publisher: int) -> None:
    with connection(root) as conn:
        queue = conn.SimpleQueue(queue_name)
        for index in range(MESSAGES_EACH):
            # Some bulk, so that a write is not a single page and a reader could meet half of it.
            queue.put({"publisher": publisher, "index": index, "pad": "x" * 20_000})
        queue.close()


def plant(folder: Path, queue: str, content: bytes) -> str:
    """A message file as a crashed or stock-kombu producer leaves it, first in the queue's order."""
    name = f"0_{uuid.uuid4()}.{queue}.msg"
    (folder / name).write_bytes(content)
    return name


def test_many_publishers_and_a_consumer_lose_nothing_and_read_nothing_half_written(tmp_path):
    context = multiprocessing.get_context("fork")
    name = f"race-{uuid.uuid4().hex[:8]}"
    publishers = [context.Process(target=publish, args=(tmp_path, name, n)) for n in range(PUBLISHERS)]
    for process in publishers:
        process.start()
    received: list[tuple[int, int]] = []
    deadline = time.monotonic() + 60
    with connection(tmp_path) as conn:
        queue = conn.SimpleQueue(name)
        while len(received) < PUBLISHERS * MESSAGES_EACH and time.monotonic() < deadline:
            try:
                message = queue.get(timeout=1)
            except queue.Empty:
                continue
            received.append((message.payload["publisher"], message.payload["index"]))
            message.ack()
        queue.close()
    for process in publishers:
        process.join(timeout=30)
        assert process.exitcode == 0
    assert sorted(received) == [(p, i) for p in range(PUBLISHERS) for i in range(MESSAGES_EACH)]
    assert os.listdir(tmp_path / "rejected") == []
    # Nothing left behind: no message, no temporary file of a put, no claimed file.
    assert os.listdir(tmp_path / "queue") == [] and os.listdir(tmp_path / "processed") == []


@pytest.mark.parametrize(
    "content",
    [b'{"body": "half', b"\x00\x00\x00", b"", b'"a string, not a message"', b'{"properties": "no tag"}'],
    ids=["half-written", "garbage", "empty", "not-an-object", "no-delivery-tag"],
)
def test_an_unreadable_message_is_set_aside_with_a_log_line_and_the_next_is_read(tmp_path, caplog, content):
    name = f"q-{uuid.uuid4().hex[:8]}"  # kombu keeps a process's bindings across connections: a queue of its own
    with connection(tmp_path) as conn:
        queue = conn.SimpleQueue(name)
        queue.put({"after": "the unreadable one"})
        planted = plant(tmp_path / "queue", name, content)
        message = queue.get(timeout=5)
        assert message.payload == {"after": "the unreadable one"}
        message.ack()
        queue.close()
    assert os.listdir(tmp_path / "rejected") == [planted]
    assert (tmp_path / "rejected" / planted).read_bytes() == content  # kept as it was, to be looked at
    [line] = [r.getMessage() for r in caplog.records if r.name == "fc2.broker"]
    assert planted in line and str(tmp_path / "rejected") in line


def test_the_embedded_default_is_this_transport():
    # Settings select it only without REDIS_URL; read them as a fresh process without it does.
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    code = (
        "from fc2.celery import app; print(type(app.connection_for_write().transport).__module__, "
        "app.conf.broker_transport_options['rejected_folder'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT_DIR, env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0] == "fc2.broker" and out[1].endswith("/broker/rejected")


def test_a_worker_goes_on_past_an_unreadable_message(tmp_path):
    """A real `celery worker` on the embedded broker meets a garbage message first in its queue: it logs it, sets it
    aside, and runs the task behind it."""
    var = tmp_path / "var"
    queue = f"fc2-test-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "PYTEST_XDIST_WORKER")}
    env.update(FC2_VAR_DIR=str(var), FC2_QUEUE=queue, DJANGO_SETTINGS_MODULE="fc2.settings", DEBUG="1")
    root = var / "broker"
    options = transport_options(root)
    planted = plant(root / "queue", queue, b'{"body": "eyJ')
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "fc2", "worker", "-Q", queue, "--concurrency", "1",
             "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "INFO"],
            cwd=PROJECT_DIR, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        sender = Celery("sender", broker="filesystem://localhost/")
        sender.conf.update(broker_transport="fc2.broker:Transport", broker_transport_options=options)
        result = sender.send_task("celery.accumulate", args=(1, 2), queue=queue)
        deadline = time.monotonic() + 60
        while f"celery.accumulate[{result.id}] succeeded" not in log.read_text() and time.monotonic() < deadline:
            assert worker.poll() is None, log.read_text()
            time.sleep(0.2)
        text = log.read_text()
        assert f"celery.accumulate[{result.id}] succeeded" in text, text
        assert f"message {planted} is unreadable" in text and "Unrecoverable error" not in text
        assert os.listdir(root / "rejected") == [planted]
        assert worker.poll() is None
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def test_a_put_is_never_seen_half_written(tmp_path, monkeypatch):
    """The moment kombu's own put exposes: the file under its `.msg` name before its bytes. Here a reader listing the
    folder at any point of a put sees either nothing or the whole message."""
    seen: list[list[str]] = []
    real_fsync = os.fsync

    def fsync_and_look(fd):
        # Mid-put: the bytes are written, the name not given yet.
        seen.append([name for name in os.listdir(tmp_path / "queue") if name.endswith(".msg")])
        real_fsync(fd)

    monkeypatch.setattr(broker.os, "fsync", fsync_and_look)
    with connection(tmp_path) as conn:
        conn.SimpleQueue(f"q-{uuid.uuid4().hex[:8]}").put({"whole": True})
    assert seen == [[]]
    [name] = os.listdir(tmp_path / "queue")
    assert json.loads((tmp_path / "queue" / name).read_text())["body"]


def test_what_a_dead_process_left_is_removed_when_a_channel_opens(tmp_path, caplog):
    """A put killed before its rename leaves a `.part`, a worker killed before reading a claimed message leaves it in
    processed/: removed once an hour old; a fresh one (a put in progress) is left alone."""
    transport_options(tmp_path)  # makes the folders
    old = time.time() - broker.LEFT_BEHIND_S - 60
    stale = [tmp_path / "queue" / ".a.part", tmp_path / "processed" / f"1_{uuid.uuid4()}.q.msg"]
    fresh = tmp_path / "queue" / ".b.part"
    for path in (*stale, fresh):
        path.write_bytes(b"{")
    for path in stale:
        os.utime(path, (old, old))

    with connection(tmp_path) as conn:
        conn.channel().close()

    assert [path.exists() for path in stale] == [False, False] and fresh.exists()
    removed = [r.getMessage() for r in caplog.records if r.name == "fc2.broker"]
    assert len(removed) == 2 and all("left behind by a process that died" in line for line in removed)
