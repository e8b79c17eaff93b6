"""The node agent's reads of the instance metadata service (monitor/agent.py, Metadata; Notices on an aws spot node):
IMDSv2's session token asked for once for its life, not once a look, and asked for again a little before it expires
or when the service refuses it. Against a small IMDSv2 service in the test (http.server on 127.0.0.1), speaking the
protocol as EC2 does: PUT /latest/api/token with X-aws-ec2-metadata-token-ttl-seconds (1 to 21600, else 400), then
GETs with X-aws-ec2-metadata-token (401 without a token it knows, or once it has expired); 404 on
spot/instance-action while there is no notice."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from monitor import agent


class Imds:
    """The service's state: the tokens it gave (token -> expiry, time.monotonic()), the TTLs asked for, the GETs it
    refused, and the spot notice it holds (None: 404)."""

    def __init__(self) -> None:
        self.tokens: dict[str, float] = {}
        self.ttls: list[int] = []
        self.refused = 0
        self.notice: dict | None = None


@pytest.fixture
def imds() -> Iterator[tuple[Imds, str]]:
    state = Imds()

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
            if self.path != "/latest/api/token" or not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                return self.answer(400, b"")
            token = secrets.token_urlsafe(24)
            state.tokens[token] = time.monotonic() + int(ttl)
            state.ttls.append(int(ttl))
            self.answer(200, token.encode())

        def do_GET(self) -> None:
            expiry = state.tokens.get(self.headers.get("X-aws-ec2-metadata-token", ""), 0.0)
            if time.monotonic() >= expiry:
                state.refused += 1
                return self.answer(401, b"")
            if self.path != "/latest/meta-data/spot/instance-action" or state.notice is None:
                return self.answer(404, b"<html>404 - Not Found</html>")
            self.answer(200, json.dumps(state.notice).encode())

        def answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:  # the test's output is not the service's log
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}/latest"
    finally:
        server.shutdown()
        server.server_close()


NOTICE = {"action": "terminate", "time": "2026-11-29T04:22:00Z"}


def test_one_token_serves_every_look_until_a_notice_comes(imds):
    state, base = imds
    metadata = agent.Metadata(base)
    assert [metadata.get("spot/instance-action") for _ in range(20)] == [None] * 20  # 404: no notice
    state.notice = NOTICE
    assert agent.read_notice(metadata.get("spot/instance-action") or "") == {
        "at": NOTICE["time"],
        "action": "terminate",
    }
    assert state.ttls == [agent.IMDS_TOKEN_TTL_S] == [21600]  # asked for once, for IMDSv2's longest life
    assert state.refused == 0


def test_a_token_is_asked_for_again_before_it_expires(imds):
    """Asked for 2 s: renewed once 1.8 s have gone (a tenth of its life early), so no look is ever refused."""
    state, base = imds
    metadata = agent.Metadata(base, ttl_s=2)
    assert metadata.get("spot/instance-action") is None
    assert metadata.get("spot/instance-action") is None
    assert len(state.ttls) == 1
    time.sleep(2)
    assert metadata.get("spot/instance-action") is None
    assert state.ttls == [2, 2] and state.refused == 0


def test_a_token_the_service_no_longer_knows_is_replaced_and_the_look_still_answers(imds):
    """The service restarted (its tokens forgotten): the 401 has the agent ask for a new token, once, and the same
    look gets its answer."""
    state, base = imds
    metadata = agent.Metadata(base)
    assert metadata.get("spot/instance-action") is None
    state.tokens.clear()
    state.notice = NOTICE
    assert metadata.get("spot/instance-action") == json.dumps(NOTICE)
    assert state.refused == 1 and len(state.ttls) == 2


def test_the_agents_notices_poll_the_metadata_service_with_one_token(imds, tmp_path):
    """Notices as an aws spot node runs them: a look every 50 ms at spot/instance-action, a checkpoint asked for
    (CHECKPOINT_NOW) and the report woken once the notice comes; one token for all the looks."""
    state, base = imds
    directory = tmp_path / "ck"
    directory.mkdir()
    wake = threading.Event()
    notices = agent.Notices(tmp_path / "no-notice-file", directory, base, interval=0.05, wake=wake)
    notices.start()
    try:
        time.sleep(0.5)  # ten looks or so, each a 404
        assert not wake.is_set() and not (directory / agent.CHECKPOINT_NOW).exists()
        state.notice = NOTICE
        assert wake.wait(5)
    finally:
        notices.stopped.set()
    assert (directory / agent.CHECKPOINT_NOW).exists()
    assert notices.take() == {"at": NOTICE["time"], "action": "terminate"}
    assert len(state.ttls) == 1 and state.refused == 0


def test_no_metadata_service_is_no_notice(tmp_path):
    """Nothing listening (a node that is not on EC2): no notice, and no error out of the look."""
    notices = agent.Notices(tmp_path / "no-notice-file", tmp_path, "http://127.0.0.1:9/latest")
    assert notices._from_metadata() is None
