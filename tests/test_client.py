"""The `fc2` command-line client (client/fc2_client): its config file, multipart bodies, download paths, arguments and
errors against a stand-in server; then the real thing — the installed `fc2` command against a live server with a real
Celery worker, as a researcher's machine would run it."""

from __future__ import annotations

import http.server
import io
import json
import os
import stat
import subprocess
import sys
import threading
import uuid
import zipfile
from pathlib import Path

import pytest
from django.test import RequestFactory
from fc2_client import api as api_module
from fc2_client import cli, config, display
from fc2_client.api import ApiError, Client, Multipart

from fc2.models import ApiToken, Artifact, CodeBundle, Job, Node
from fc2.services import planning
from fc2.services.artifacts import store_outputs
from harness.wheels import GOOD, make_wheel
from recommender.catalog import load_catalog
from tests.helpers import job_row

FC2 = Path(sys.executable).with_name("fc2")  # the console script the project's install put beside its Python


# --- the config file --------------------------------------------------------------------------------------------------


def test_the_login_is_readable_by_its_owner_only(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    folder = tmp_path / "fc2"
    folder.mkdir(mode=0o755)
    (folder / "config.json").write_text("{}")
    (folder / "config.json").chmod(0o644)  # left by something else, readable by all
    old_umask = os.umask(0)  # the mode must not depend on a careful umask
    try:
        path = config.save(config.Login("http://127.0.0.1:8000", "fc2_secret"))
    finally:
        os.umask(old_umask)

    assert path == folder / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert json.loads(path.read_text()) == {"url": "http://127.0.0.1:8000", "token": "fc2_secret"}
    assert [p.name for p in folder.iterdir()] == ["config.json"]  # no temporary file left beside it
    assert config.load() == config.Login("http://127.0.0.1:8000", "fc2_secret")
    assert config.remove() and not path.exists() and not config.remove()


def test_the_token_file_is_never_opened_wider_than_0600(tmp_path, monkeypatch):
    """Not even for a moment before a chmod: every file the save creates is created with mode 0600."""
    created = []
    real_open = os.open

    def spy(path, flags, mode=0o777, *args, **kwargs):
        if flags & os.O_CREAT:
            created.append(mode)
        return real_open(path, flags, mode, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    config.save(config.Login("http://x", "t"), tmp_path / "fc2" / "config.json")

    assert created and all(mode & 0o077 == 0 for mode in created)


@pytest.mark.parametrize(
    ("xdg", "expected"),
    [
        ("{tmp}/xdg", "{tmp}/xdg/fc2/config.json"),
        ("", "{tmp}/home/.config/fc2/config.json"),
        ("relative/dir", "{tmp}/home/.config/fc2/config.json"),  # the XDG spec: ignored
    ],
)
def test_config_path(xdg, expected, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    env = {"XDG_CONFIG_HOME": xdg.format(tmp=tmp_path)} if xdg else {}
    assert config.config_path(env) == Path(expected.format(tmp=tmp_path))


def test_fc2_url_and_token_override_the_stored_login(tmp_path):
    path = tmp_path / "config.json"
    config.save(config.Login("http://stored", "stored-token"), path)

    assert config.current({}, path) == config.Login("http://stored", "stored-token")
    assert config.current({"FC2_TOKEN": "t"}, path) == config.Login("http://stored", "t")
    assert config.current({"FC2_URL": "http://env/", "FC2_TOKEN": "t"}, path) == config.Login("http://env", "t")
    with pytest.raises(config.ConfigError, match="run `fc2 login URL`"):
        config.current({}, tmp_path / "none.json")


# --- multipart bodies -------------------------------------------------------------------------------------------------


def test_a_multipart_body_is_what_django_reads(tmp_path):
    wheel = tmp_path / 'my "odd"\nname-1.0-py3-none-any.whl'
    data = os.urandom(300_000)  # several chunks
    wheel.write_bytes(data)
    body = Multipart({"main": "pkg/main.py", "name": "ünïcode"}, "file", wheel)

    chunks = list(body.chunks())
    request = RequestFactory().generic("POST", "/", b"".join(chunks), content_type=body.content_type)

    assert len(chunks) > 3 and sum(map(len, chunks)) == body.length
    assert request.POST.dict() == {"main": "pkg/main.py", "name": "ünïcode"}
    upload = request.FILES["file"]
    assert upload.read() == data
    assert upload.name == "my %22odd%22%0Aname-1.0-py3-none-any.whl"  # quotes and line breaks cannot end the header


def test_a_file_that_changes_while_it_is_sent_is_an_error(tmp_path):
    path = tmp_path / "a.whl"
    path.write_bytes(b"x" * 1000)
    body = Multipart({}, "file", path)
    path.write_bytes(b"x" * 10)

    with pytest.raises(ApiError, match="changed while it was being sent"):
        list(body.chunks())


def test_an_upload_reports_its_progress(stub, tmp_path):
    stub.routes["POST /api/v1/bundles"] = (201, {"id": 1})
    wheel = tmp_path / "w.whl"
    wheel.write_bytes(os.urandom(200_000))
    calls = []

    answer = Client(stub.url, "tok").upload(
        "/api/v1/bundles", {"main": "main.py"}, "file", wheel, lambda *a: calls.append(a)
    )

    assert answer == {"id": 1}
    total = calls[-1][1]
    assert calls[-1] == (total, total) and total > 200_000
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)
    assert stub.requests[-1]["body"].count(wheel.read_bytes()) == 1


def test_the_progress_bar_and_the_live_line():
    out = io.StringIO()  # not a terminal: each new text on a line of its own
    line = display.LiveLine(out)
    bar = display.ProgressBar("upload w.whl", line)
    bar(0, 2_000_000)
    bar(1_000_000, 2_000_000)
    bar(1_000_000, 2_000_000)  # unchanged: not written again

    assert out.getvalue().splitlines() == [
        "[------------------------]   0%  0 B of 2.0 MB  upload w.whl",
        "[############------------]  50%  1.0 MB of 2.0 MB  upload w.whl",
    ]


# --- where downloads go -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected", "renamed"),
    [
        ("model.keras", "model.keras", False),
        ("worker-0/model.keras", "worker-0/model.keras", False),
        ("logs/chief-0.log", "logs/chief-0.log", False),
        ("./metrics.json", "metrics.json", False),
        (".hidden", ".hidden", False),
        ("日本/データ.txt", "日本/データ.txt", False),
        ("/etc/passwd", "etc/passwd", True),
        ("../escape", "escape", True),
        ("worker-0/../../escape", "worker-0/escape", True),
        ("..\\escape", "escape", True),
        ("\\\\server\\share\\x", "server/share/x", True),
        ("C:/Windows/x", "C_/Windows/x", True),
        ("C:x", "C_x", True),
        ("", "artifact-9", True),
        (".", "artifact-9", True),
        ("..", "artifact-9", True),
        ("a\0b", "a_b", True),
        ("line\nbreak\r.txt", "line_break_.txt", True),
        ("esc\x1b[2J", "esc_[2J", True),
        ("what?.txt", "what_.txt", True),
        ("CON", "_CON", True),
        ("logs/nul.txt", "logs/_nul.txt", True),
        ("Com1.tar.gz", "_Com1.tar.gz", True),
        ("console.log", "console.log", False),
        ("trailing. ", "trailing_", True),
        ("x" * 300 + ".keras", "x" * 222 + "-{digest}.keras", True),
        ("é" * 200, "é" * 114 + "-{digest}", True),
    ],
)
def test_where_an_artifact_is_written(name, expected, renamed, tmp_path):
    (place,) = cli.placements(tmp_path, [{"id": 9, "name": name, "url": "u"}])

    relative = place.path.relative_to(tmp_path).as_posix()
    if "{digest}" in expected:
        prefix, suffix = expected.split("{digest}")
        assert relative.startswith(prefix) and relative.endswith(suffix) and len(relative.encode()) <= 240
    else:
        assert relative == expected
    assert bool(place.why) is renamed


def test_names_that_meet_are_placed_apart(tmp_path):
    """A file where another needs a folder, the same name but for case (one file on macOS or Windows), two names
    made safe alike: each gets a place of its own, in its own folder (a node's) where that folder can be had, else at
    the top."""
    listed = [
        {"id": 1, "name": "out", "url": "u"},
        {"id": 2, "name": "out/model.keras", "url": "u"},
        {"id": 3, "name": "Model.keras", "url": "u"},
        {"id": 4, "name": "model.keras", "url": "u"},
        {"id": 5, "name": "a?b", "url": "u"},
        {"id": 6, "name": "a*b", "url": "u"},
        {"id": 7, "name": "big.bin", "url": None, "not_kept": "over the 200 MB limit"},
        {"id": 8, "name": "worker-1/Log.txt", "url": "u"},
        {"id": 9, "name": "worker-1/log.txt", "url": "u"},
        {"id": 10, "name": "worker-1/a:b", "url": "u"},
        {"id": 11, "name": "worker-1/a|b", "url": "u"},
    ]

    placed = {p.artifact["id"]: p for p in cli.placements(tmp_path, listed)}

    where = {i: p.path.relative_to(tmp_path).as_posix() if p.path else None for i, p in placed.items()}
    assert where == {
        1: "out", 2: "artifact-2-model.keras", 3: "Model.keras", 4: "artifact-4-model.keras", 5: "a_b",
        6: "artifact-6-a_b", 7: None, 8: "worker-1/Log.txt", 9: "worker-1/artifact-9-log.txt", 10: "worker-1/a_b",
        11: "worker-1/artifact-11-a_b",
    }  # fmt: skip
    assert placed[2].why == placed[4].why == "renamed: its path meets another artifact's or something in the way"
    assert placed[9].why == placed[11].why == placed[2].why
    assert placed[7].why == "not kept: over the 200 MB limit"


def test_what_is_in_the_way_on_disk_is_left_alone(tmp_path):
    (tmp_path / "logs").write_text("a file where a folder goes")
    (tmp_path / "model.keras").mkdir()  # a folder where the file goes
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "ok.txt").write_text("an earlier download of it: written again")
    names = ["logs/a.log", "model.keras", "link/x", "ok.txt"]
    listed = [{"id": i, "name": name, "url": "u"} for i, name in enumerate(names)]

    where = [p.path.relative_to(tmp_path).as_posix() for p in cli.placements(tmp_path, listed)]

    assert where == ["artifact-0-a.log", "artifact-1-model.keras", "artifact-2-x", "ok.txt"]


def test_download_renames_what_is_unsafe_and_keeps_going(stub, logged_in, tmp_path, capsys):
    stub.routes["GET /api/v1/jobs/4/artifacts"] = (200, {"results": [
        {"id": 1, "name": "model.keras", "url": "u"},
        {"id": 2, "name": "../../.bashrc", "url": "u"},
        {"id": 3, "name": "big.bin", "url": None, "not_kept": "3.0 GB, over the 200 MB limit"},
        {"id": 4, "name": "gone.txt", "url": "u"},
        {"id": 5, "name": "/abs/CON", "url": "u"},
    ]})  # fmt: skip
    stub.routes["GET /api/v1/jobs/4/artifacts/1"] = (200, b"model")
    stub.routes["GET /api/v1/jobs/4/artifacts/2"] = (200, b"echo pwned")
    stub.routes["GET /api/v1/jobs/4/artifacts/4"] = (404, {"error": "the file of artifact gone.txt is missing"})
    stub.routes["GET /api/v1/jobs/4/artifacts/5"] = (200, b"device")
    out = tmp_path / "deep" / "out"

    code = cli.main(["download", "4", "--dir", str(out), "--json"])

    answer = json.loads(capsys.readouterr().out)
    assert code == 1 and answer["error"] == "2 of 5 artifacts skipped"
    assert [(f["name"], f["size_bytes"]) for f in answer["files"]] == [
        ("model.keras", 5), ("../../.bashrc", 10), ("/abs/CON", 6)
    ]  # fmt: skip
    assert answer["renamed"] == [
        {"name": "../../.bashrc", "path": str(out / ".bashrc"), "why": "renamed: '..'"},
        {"name": "/abs/CON", "path": str(out / "abs" / "_CON"), "why": "renamed: absolute, a reserved name"},
    ]
    assert answer["skipped"] == [
        {"name": "big.bin", "why": "not kept: 3.0 GB, over the 200 MB limit"},
        {"name": "gone.txt", "why": "the file of artifact gone.txt is missing"},
    ]
    assert (out / ".bashrc").read_bytes() == b"echo pwned" and (out / "abs" / "_CON").read_bytes() == b"device"
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "deep", "deep/out", "deep/out/.bashrc", "deep/out/abs", "deep/out/abs/_CON", "deep/out/model.keras"
    ]  # fmt: skip
    assert "/api/v1/jobs/4/artifacts/3" not in [r["path"] for r in stub.requests]


def test_download_says_what_it_renamed_and_skipped(stub, logged_in, tmp_path, capsys):
    stub.routes["GET /api/v1/jobs/4/artifacts"] = (200, {"results": [
        {"id": 1, "name": "a\nb", "url": "u"}, {"id": 2, "name": "big", "url": None, "not_kept": "too big"},
    ]})  # fmt: skip
    stub.routes["GET /api/v1/jobs/4/artifacts/1"] = (200, b"x")

    assert cli.main(["download", "4", "--dir", str(tmp_path / "out")]) == 1

    out, err = capsys.readouterr()
    assert out.splitlines()[1:] == [
        f"renamed: 'a\\nb' -> {tmp_path / 'out' / 'a_b'} (renamed: characters no file name may hold)",
        "skipped: 'big' (not kept: too big)",
    ]
    assert err == ""  # (the exit code says it; --json's "error" too)


def test_download_does_not_follow_a_symlinked_folder_out(stub, logged_in, tmp_path, capsys):
    stub.routes["GET /api/v1/jobs/4/artifacts"] = (200, {"results": [
        {"id": 1, "name": "worker-0/model.keras", "url": "u"}, {"id": 2, "name": "metrics.json", "url": "u"},
    ]})  # fmt: skip
    stub.routes["GET /api/v1/jobs/4/artifacts/1"] = (200, b"model")
    stub.routes["GET /api/v1/jobs/4/artifacts/2"] = (200, b"{}")
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "worker-0").symlink_to(elsewhere)

    code = cli.main(["download", "4", "--dir", str(out), "--json"])

    answer = json.loads(capsys.readouterr().out)
    assert code == 0 and answer["renamed"][0]["path"] == str(out / "artifact-1-model.keras")
    assert list(elsewhere.iterdir()) == []
    assert (out / "artifact-1-model.keras").read_bytes() == b"model" and (out / "metrics.json").read_bytes() == b"{}"


def test_a_download_never_writes_through_a_symlink_left_at_its_temporary_name(stub, logged_in, tmp_path):
    stub.routes["GET /api/v1/jobs/4/artifacts/1"] = (200, b"model")
    victim = tmp_path / "victim"
    victim.write_text("mine")
    (tmp_path / ".model.keras.part").symlink_to(victim)

    with pytest.raises(OSError):
        Client(stub.url, "t").download("/api/v1/jobs/4/artifacts/1", tmp_path / "model.keras")

    assert victim.read_text() == "mine"


def test_download_keeps_folders(stub, logged_in, tmp_path, capsys):
    stub.routes["GET /api/v1/jobs/4/artifacts"] = (
        200,
        {"results": [{"id": 1, "name": "model.keras", "url": "u"}, {"id": 2, "name": "worker-1/log.txt", "url": "u"}]},
    )
    stub.routes["GET /api/v1/jobs/4/artifacts/1"] = (200, b"model")
    stub.routes["GET /api/v1/jobs/4/artifacts/2"] = (200, b"log")

    assert cli.main(["download", "4", "--dir", str(tmp_path / "out"), "--json"]) == 0

    answer = json.loads(capsys.readouterr().out)
    assert [(f["name"], f["size_bytes"]) for f in answer["files"]] == [("model.keras", 5), ("worker-1/log.txt", 3)]
    assert (tmp_path / "out" / "worker-1" / "log.txt").read_bytes() == b"log"
    assert sorted(p.name for p in (tmp_path / "out").rglob("*")) == ["log.txt", "model.keras", "worker-1"]


# --- arguments --------------------------------------------------------------------------------------------------------

SUBMITS = [
    (["--dataset", "digits"], {"dataset": "digits", "parameters": {}}),
    (["--dataset", "12"], {"dataset": "12", "parameters": {}}),
    (["--dataset", "https://example.org/d.npz", "--param", "epochs=2", "--param", "lr=a=b"],
     {"dataset": "https://example.org/d.npz", "parameters": {"epochs": "2", "lr": "a=b"}}),
    (["--dataset", "digits", "--algorithm", "cost-opt", "--budget", "2.5", "--total-budget", "1",
      "--worker-types", "m4.xlarge, c4.xlarge"],
     {"dataset": "digits", "parameters": {}, "algorithm": "cost-opt", "budget": 2.5, "total_budget": 1.0,
      "worker_types": ["m4.xlarge", "c4.xlarge"]}),
    # --main goes with the wheel, not the job
    (["--dataset", "digits", "--workers", "3", "--strategy", "mirrored", "--provider", "lab", "--latency-ms", "20",
      "--worker-type", "lab-w-100", "--ps-type", "lab-ps-450", "--workload", "w", "--main", "pkg/main.py"],
     {"dataset": "digits", "parameters": {}, "workers": 3, "strategy": "mirrored", "provider": "lab",
      "latency_ms": 20.0, "worker_type": "lab-w-100", "ps_type": "lab-ps-450", "workload_name": "w"}),
]  # fmt: skip


@pytest.mark.parametrize(("args", "expected"), SUBMITS)
def test_submit_arguments_make_the_jobs_request(args, expected, tmp_path):
    parsed = cli.build_parser().parse_args(["submit", "w.whl", *args])

    assert cli.job_payload(parsed, 7, parsed.dataset) == {"bundle": 7, **expected}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--algorithm", "cost-opt", "--max-workers", "6", "--ps-type", "m4.large", "--worker-types", "a,b"],
         {"algorithm": "cost-opt", "max_workers": 6, "ps_type": "m4.large", "worker_types": ["a", "b"]}),
        (["--algorithm", "lookup", "--workload", "anwar2021-mnist", "--batch-size", "64000", "--latency-ms", "0",
          "--strategy", "mirrored", "--catalog", "lab"],
         {"algorithm": "lookup", "workload": "anwar2021-mnist", "batch_size": 64000, "latency_ms": 0.0,
          "strategy": "mirrored", "catalog": "lab"}),
        (["--algorithm", "explore", "--workload", "w", "--preset", "cheapest", "--search-budget", "2.5",
          "--search-minutes", "20", "--provider", "aws"],
         {"algorithm": "explore", "workload": "w", "preset": "cheapest", "search_budget": 2.5, "search_minutes": 20,
          "provider": "aws"}),
        (["--algorithm", "explore", "--alpha", "0.2", "--beta", "0.8"], {"algorithm": "explore", "alpha": 0.2,
                                                                          "beta": 0.8}),
    ],
)  # fmt: skip
def test_recommend_arguments_make_the_recommenders_request(args, expected):
    assert cli.recommend_payload(cli.build_parser().parse_args(["recommend", *args])) == expected


USAGE_ERRORS = [
    (["submit", "w.whl"], "the following arguments are required: --dataset"),
    (["submit", "w.whl", "--dataset", "d", "--param", "epochs"], "'epochs' is not KEY=VALUE"),
    (["submit", "w.whl", "--dataset", "d", "--param", "=1"], "'=1' is not KEY=VALUE"),
    (["submit", "w.whl", "--dataset", "d", "--budget", "1", "--workers", "2"], "not allowed with argument"),
    (["submit", "w.whl", "--dataset", "d", "--budget", "nan"], "'nan' is not a finite number"),
    (["submit", "w.whl", "--dataset", "d", "--workers", "two"], "'two' is not a whole number"),
    (["submit", "w.whl", "--dataset", "d", "--provider", "mars"], "invalid choice: 'mars'"),
    (["recommend", "--algorithm", "cost-opt", "--budget", "1", "--max-workers", "2"], "not allowed with argument"),
    (["status"], "the following arguments are required: ID"),
    (["logs", "x"], "'x' is not a whole number"),
    ([], "the following arguments are required: COMMAND"),
    (["launch"], "invalid choice: 'launch'"),
]


@pytest.mark.parametrize(("args", "reason"), USAGE_ERRORS)
def test_usage_errors_are_one_json_object(args, reason, capsys):
    assert cli.main([*args, "--json"]) == 2

    out, err = capsys.readouterr()
    assert json.loads(out) == {"ok": False, "error": json.loads(out)["error"]}
    assert reason in json.loads(out)["error"] and err == ""


def test_a_usage_error_without_json_shows_the_usage(capsys):
    assert cli.main(["submit", "w.whl", "--dataset", "d", "--param", "x"]) == 2

    out, err = capsys.readouterr()
    assert out == "" and err.startswith("usage: fc2 submit") and "fc2 submit: error: argument --param" in err


# --- errors from the platform, against a stand-in ---------------------------------------------------------------------


class Stub:
    """A stand-in platform: canned answers by "METHOD /path" (a status and a JSON object or bytes, or a function of
    the request's query that gives them; status None: the connection closed unanswered), and every request it got."""

    def __init__(self):
        self.routes: dict = {}
        self.requests: list[dict] = []
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self):
                path, _, query = self.path.partition("?")
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                stub.requests.append({"method": self.command, "path": path, "query": query, "body": body,
                                      "headers": dict(self.headers)})  # fmt: skip
                route = stub.routes.get(f"{self.command} {path}", (404, b"<html>Not Found</html>"))
                status, answer, *headers = route(query) if callable(route) else route
                if status is None:  # the connection lost before any answer
                    self.close_connection = True
                    return
                data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
                self.send_response(status)
                for name, value in (headers[0] if headers else {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def stub():
    server = Stub()
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture
def logged_in(stub, monkeypatch):
    monkeypatch.setenv("FC2_URL", stub.url)
    monkeypatch.setenv("FC2_TOKEN", "fc2_tok")
    monkeypatch.setattr(cli, "POLL_S", 0.01)


REFUSALS = [
    ((401, {"error": "this API token is revoked"}), "this API token is revoked: run `fc2 login {url}`"),
    ((404, {"error": "no job 4"}), "no job 4"),
    ((404, b"<html>Not Found</html>"), "GET {url}/api/v1/jobs/4: not found (HTTP 404); is {url} an FC"),
    ((429, {"error": "too many submissions"}, {"Retry-After": "60"}), "too many submissions (try again in 60 s)"),
    ((500, b"<html>Server Error</html>"), "GET {url}/api/v1/jobs/4 failed: HTTP 500"),
    ((302, b"", {"Location": "https://fc2.example.org/api/v1/jobs/4"}),
     "redirects to https://fc2.example.org/api/v1/jobs/4: log in with the platform's own address"),
    ((200, b"<html>a login page</html>"), "did not answer with a JSON object"),
]  # fmt: skip


@pytest.mark.parametrize(("answer", "message"), REFUSALS)
def test_refusals_say_what_to_do(answer, message, stub, logged_in, capsys):
    stub.routes["GET /api/v1/jobs/4"] = answer

    assert cli.main(["status", "4", "--json"]) == 1

    out, err = capsys.readouterr()
    assert message.format(url=stub.url) in json.loads(out)["error"]
    assert stub.requests[0]["headers"]["Authorization"] == "Token fc2_tok"


def test_invalid_fields_are_listed(stub, logged_in, capsys):
    stub.routes["POST /api/v1/recommend"] = (400, {"error": "invalid request", "fields": {"budget": ["too small"]}})

    assert cli.main(["recommend", "--algorithm", "cost-opt", "--budget", "0.001"]) == 1

    out, err = capsys.readouterr()
    assert out == "" and err == "fc2: error: invalid request — budget: too small\n"
    assert json.loads(stub.requests[0]["body"]) == {"algorithm": "cost-opt", "budget": 0.001}

    assert cli.main(["recommend", "--algorithm", "cost-opt", "--budget", "0.001", "--json"]) == 1
    answer = json.loads(capsys.readouterr().out)
    assert answer["fields"] == {"budget": ["too small"]} and answer["status"] == 400 and answer["ok"] is False


def test_an_unreachable_platform_is_named(monkeypatch, capsys):
    monkeypatch.setenv("FC2_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("FC2_TOKEN", "t")

    assert cli.main(["jobs"]) == 1

    assert capsys.readouterr().err.startswith("fc2: error: cannot reach http://127.0.0.1:9: ")


@pytest.mark.parametrize(
    ("state", "code"), [("succeeded", 0), ("failed", 1), ("cancelled", 1), ("running", 3), ("queued", 3)]
)
def test_status_exit_codes(state, code, stub, logged_in, capsys):
    stub.routes["GET /api/v1/jobs/4"] = (
        200,
        {"id": 4, "state": state, "failure_reason": "boom" if state == "failed" else ""},
    )

    assert cli.main(["status", "4", "--json"]) == code

    answer = json.loads(capsys.readouterr().out)
    assert answer["ok"] is (code == 0) and answer["job"]["state"] == state
    if code:
        assert answer["error"] == f"job 4 {state}" + (": boom" if state == "failed" else "")


def test_following_logs_reads_on_from_its_offset(stub, logged_in, capsys):
    pages = iter([
        {"node": "worker-0", "nodes": ["worker-0", "worker-1"], "offset": 6, "text": "epoch\n", "complete": False},
        {"node": "worker-0", "nodes": ["worker-0", "worker-1"], "offset": 6, "text": "", "complete": False},
        {"node": "worker-0", "nodes": ["worker-0", "worker-1"], "offset": 11, "text": "done\n", "complete": True},
    ])  # fmt: skip
    stub.routes["GET /api/v1/jobs/4/logs"] = lambda query: (200, next(pages))

    assert cli.main(["logs", "4", "--follow"]) == 0

    assert capsys.readouterr().out == "epoch\ndone\n"
    assert [r["query"] for r in stub.requests] == ["since=0", "node=worker-0&since=6", "node=worker-0&since=6"]


def test_following_a_job_draws_its_line_until_it_ends(stub, logged_in, capsys):
    states = iter([
        {"id": 4, "state": "running", "progress": {"epoch": 1, "epochs": 2, "step": 3, "loss": 0.5},
         "cost": {"cost_so_far": 0.001, "launched_at": "t0"}},
        {"id": 4, "state": "succeeded", "progress": {"epoch": 2, "epochs": 2, "step": 6, "loss": 0.25},
         "cost": {"cost_so_far": 0.002, "launched_at": "t0", "torn_down_at": None}},
        {"id": 4, "state": "succeeded", "progress": {"epoch": 2, "epochs": 2, "step": 6, "loss": 0.25},
         "cost": {"cost_so_far": 0.0021, "launched_at": "t0", "torn_down_at": "t1"}},
    ])  # fmt: skip
    stub.routes["GET /api/v1/jobs/4"] = lambda query: (200, next(states))

    assert cli.main(["status", "4", "--follow"]) == 0

    out, err = capsys.readouterr()
    assert err.splitlines() == [  # not a terminal: each change on a line of its own
        "job 4 running · epoch 1/2 · step 3 · loss 0.5 · ≈ $0.001 so far",
        "job 4 succeeded · epoch 2/2 · step 6 · loss 0.25 · ≈ $0.002 so far",
        "job 4 succeeded · epoch 2/2 · step 6 · loss 0.25 · ≈ $0.0021 so far",
    ]
    assert out.startswith("job 4 succeeded")


def test_interrupting_a_follow_says_the_job_goes_on(stub, logged_in, monkeypatch, capsys):
    stub.routes["GET /api/v1/jobs/4"] = (200, {"id": 4, "state": "running"})

    def interrupt(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.time, "sleep", interrupt)

    assert cli.main(["status", "4", "--follow", "--json"]) == 130

    answer = json.loads(capsys.readouterr().out)
    assert answer["error"] == "stopped following; job 4 goes on (`fc2 status 4 --follow`, `fc2 cancel 4`)"
    assert answer["job"]["state"] == "running"


@pytest.fixture
def submitting(stub, logged_in, tmp_path, monkeypatch) -> tuple[Path, list[float]]:
    """A wheel to submit (the platform stores it as bundle 7), and the pauses the client makes between tries."""
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    wheel.write_bytes(b"a wheel")
    stub.routes["GET /api/v1/bundles"] = (200, {"results": []})
    stub.routes["POST /api/v1/bundles"] = (201, {"id": 7})
    pauses: list[float] = []
    monkeypatch.setattr(api_module.time, "sleep", pauses.append)
    return wheel, pauses


def job_posts(stub) -> list[dict]:
    return [r for r in stub.requests if r["method"] == "POST" and r["path"] == "/api/v1/jobs"]


def idempotency_key(request: dict) -> str:
    return next(value for name, value in request["headers"].items() if name.lower() == "idempotency-key")


def test_submit_sends_a_fresh_key_and_the_same_one_when_it_tries_again(stub, submitting, capsys):
    wheel, pauses = submitting
    answers = iter([
        (None, b""),  # the answer lost: the job may have been made
        (503, b"<html>unavailable</html>"),
        (429, {"error": "slow down"}, {"Retry-After": "10"}),
        (502, b"bad gateway"),
        (201, {"id": 11, "state": "queued"}),
        (201, {"id": 12, "state": "queued"}),
    ])  # fmt: skip
    stub.routes["POST /api/v1/jobs"] = lambda query: next(answers)

    assert cli.main(["submit", str(wheel), "--dataset", "digits", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["job"]["id"] == 11
    assert cli.main(["submit", str(wheel), "--dataset", "digits", "--json"]) == 0

    posts = job_posts(stub)
    keys = [idempotency_key(r) for r in posts]
    assert len(posts) == 6 and len(set(keys[:5])) == 1 and keys[5] != keys[0]  # a fresh key per invocation
    assert uuid.UUID(keys[0].strip('"')) and keys[0].startswith('"')  # a Structured Field string, as the draft has it
    assert all(r["body"] == posts[0]["body"] for r in posts)
    assert pauses == [1.0, 2.0, 10.0, 8.0]  # backoff, or the Retry-After when it asks for longer


def test_submit_tries_again_a_bounded_number_of_times(stub, submitting, capsys):
    wheel, pauses = submitting
    stub.routes["POST /api/v1/jobs"] = (503, b"down for maintenance")

    assert cli.main(["submit", str(wheel), "--dataset", "digits"]) == 1

    assert len(job_posts(stub)) == 1 + cli.SUBMIT_RETRIES and len(pauses) == cli.SUBMIT_RETRIES
    out, err = capsys.readouterr()
    assert err.count("submitting: ") == cli.SUBMIT_RETRIES and "(trying again in 16 s)" in err
    assert err.endswith("failed: HTTP 503 Service Unavailable\n")


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ((400, {"error": "invalid request", "fields": {"workers": ["too many"]}}), "workers: too many"),
        ((422, {"error": "this Idempotency-Key was used for another request"}), "used for another request"),
        ((429, {"error": "too many job submissions"}, {"Retry-After": "3599"}), "(try again in 3599 s)"),
        ((500, b"<html>Server Error</html>"), "failed: HTTP 500"),
    ],
)
def test_submit_does_not_try_again_what_would_fail_again(stub, submitting, capsys, answer, message):
    wheel, pauses = submitting
    stub.routes["POST /api/v1/jobs"] = answer

    assert cli.main(["submit", str(wheel), "--dataset", "digits", "--json"]) == 1

    assert message in json.loads(capsys.readouterr().out)["error"]
    assert len(job_posts(stub)) == 1 and pauses == []


def test_the_client_imports_no_platform_code():
    """It runs on a researcher's machine: the standard library only."""
    code = "import sys, fc2_client.cli; print(sorted({m.split('.')[0] for m in sys.modules}))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    modules = {name.strip(" '") for name in loaded.strip("[]\n").split(",")}
    assert {name for name in modules if name not in sys.stdlib_module_names and not name.startswith("_")} == {
        "fc2_client"
    }


# --- the installed command against a live server ----------------------------------------------------------------------


class Researcher:
    """The `fc2` command as one researcher runs it on their own machine: a home of their own (where `fc2 login`
    keeps the token), or FC2_URL and FC2_TOKEN in the environment instead."""

    def __init__(self, home: Path, **env: str):
        home.mkdir(parents=True, exist_ok=True)
        self.home = home
        inherited = {name: value for name, value in os.environ.items() if name not in ("FC2_URL", "FC2_TOKEN")}
        self.env = {**inherited, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), **env}

    def __call__(self, *args: str, stdin: str = "", timeout: float = 120) -> tuple[int, dict]:
        """Run `fc2 ARGS --json`: its exit code and the one JSON object it printed."""
        done = subprocess.run(
            [str(FC2), *args, "--json"], input=stdin, capture_output=True, text=True, env=self.env, cwd=self.home,
            timeout=timeout,
        )  # fmt: skip
        assert "Traceback" not in done.stderr, done.stderr
        return done.returncode, json.loads(done.stdout)


def media_files(settings) -> list[Path]:
    """Files stored under MEDIA_ROOT, the materialised built-in datasets aside."""
    return [p for p in Path(settings.MEDIA_ROOT).rglob("*") if p.is_file() and "builtin" not in p.parts]


@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
def test_a_researcher_trains_and_downloads_a_model_from_their_machine(
    alice, bob, example_wheel, celery_worker, live_server, tmp_path
):
    """The whole path, once (one real 2-worker job trains): login → submit → follow → download; then another user's
    token sees none of it, and a revoked token nothing at all."""
    token, secret = ApiToken.issue(alice, "laptop")
    as_alice = Researcher(tmp_path / "alice")

    code, answer = as_alice("login", live_server.url, stdin=f"{secret}\n")  # the token piped in, as from a vault
    assert (code, answer["username"]) == (0, "alice"), answer
    stored = as_alice.home / ".config" / "fc2" / "config.json"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600 and json.loads(stored.read_text())["token"] == secret

    code, answer = as_alice(
        "submit", str(example_wheel), "--dataset", "digits", "--workers", "2", "--strategy", "mirrored",
        "--param", "epochs=1", "--param", "steps_per_epoch=3", "--follow", timeout=600,
    )  # fmt: skip
    assert code == 0, (answer, celery_worker.read_text()[-3000:])
    job = answer["job"]
    assert job["state"] == "succeeded" and job["cost"]["torn_down_at"]  # followed until the cluster was gone
    assert Job.objects.get(pk=job["id"]).owner == alice

    code, answer = as_alice("download", str(job["id"]), "--dir", "results")
    assert code == 0, answer
    names = {f["name"] for f in answer["files"]}
    assert {"model.keras", "metrics.json", "logs/worker-0.log", "logs/worker-1.log"} <= names
    with zipfile.ZipFile(as_alice.home / "results" / "model.keras") as model:
        assert "config.json" in model.namelist()  # a real Keras model
    metrics = json.loads((as_alice.home / "results" / "metrics.json").read_text())
    assert 0 <= metrics["test_accuracy"] <= 1

    code, answer = as_alice("logs", str(job["id"]), "--node", "worker-0", "--follow")
    assert code == 0 and answer["complete"] and answer["node"] == "worker-0" and answer["text"]
    code, answer = as_alice("jobs", "--state", "succeeded")
    assert [j["id"] for j in answer["jobs"]] == [job["id"]]

    _, bob_secret = ApiToken.issue(bob, "laptop")
    as_bob = Researcher(tmp_path / "bob", FC2_URL=live_server.url, FC2_TOKEN=bob_secret)
    for command in (["status"], ["logs"], ["cancel"], ["download", "--dir", "stolen"]):
        code, answer = as_bob(command[0], str(job["id"]), *command[1:])
        assert (code, answer["status"]) == (1, 404), (command, answer)
    assert not (as_bob.home / "stolen").exists()
    assert as_bob("jobs") == (0, {"ok": True, "count": 0, "next": None, "jobs": []})

    token.revoke()
    code, answer = as_alice("status", str(job["id"]))
    assert (code, answer["status"]) == (1, 401)
    assert f"run `fc2 login {live_server.url}`" in answer["error"]


@pytest.mark.django_db(transaction=True)
def test_fc2_recommend_sends_explores_weights_and_budget_as_fc2_submit_does(alice, live_server, tmp_path):
    """Against the live API: a workload never run needs trials, and the estimate is within the budget asked, a
    trial's length counting the provider's start-up and teardown; the weights reach the recommender (a preset and
    weights together, or both weights 0, are refused by it)."""
    load_catalog("lab")
    _, secret = ApiToken.issue(alice, "laptop")
    researcher = Researcher(tmp_path / "alice", FC2_URL=live_server.url, FC2_TOKEN=secret)
    asked = ["recommend", "--algorithm", "explore", "--workload", "never-run", "--catalog", "lab", "--max-workers", "3"]

    budget = ["--search-budget", "2.5", "--search-minutes", "20", "--provider", "lab"]
    code, answer = researcher(*asked, "--preset", "cheapest", *budget)
    assert (code, answer["status"]) == (1, 400) and "trial" in answer["error"], answer
    search = answer["search"]
    assert search["dollars_at_most"] == 2.5 and search["minutes_at_most"] == 20 and search["next"]["worker_type"]
    assert search["trial_minutes"] == pytest.approx(planning.trial_minutes("lab"))  # start-up and teardown counted
    code, answer = researcher(*asked, "--preset", "cheapest", "--alpha", "1")
    assert (code, answer["status"]) == (1, 400) and "preset or alpha and beta" in str(answer["fields"]), answer
    code, answer = researcher(*asked, "--alpha", "0", "--beta", "0")
    assert (code, answer["status"]) == (1, 400) and "not both 0" in answer["error"], answer


@pytest.mark.django_db(transaction=True)
def test_a_nodes_outputs_are_downloaded_into_its_folder_even_renamed(alice, live_server, tmp_path):
    """Outputs the platform stored as a real report stores them (fc2.services.artifacts), downloaded by `fc2
    download` from the live server: a worker's output renamed on this machine (its name meets another's but for case)
    stays in the worker's folder, beside the other; the chief's are at the top."""
    job = job_row(alice, state="succeeded")
    chief = Node.objects.create(job=job, name="chief-0", role="chief", index=0, status=Node.Status.SUCCEEDED)
    worker = Node.objects.create(job=job, name="worker-1", role="worker", index=1, status=Node.Status.SUCCEEDED)
    outputs = {"outputs": [{"file": "0", "path": "Model.keras"}, {"file": "1", "path": "model.keras"}]}
    store_outputs(job, chief, {"outputs": [{"file": "0", "path": "metrics.json"}]}, {"0": b"{}"}, chief=True)
    store_outputs(job, worker, outputs, {"0": b"upper", "1": b"lower"}, chief=False)
    renamed_id = Artifact.objects.get(job=job, name="worker-1/model.keras").pk
    _, secret = ApiToken.issue(alice, "laptop")
    researcher = Researcher(tmp_path / "alice", FC2_URL=live_server.url, FC2_TOKEN=secret)

    code, answer = researcher("download", str(job.pk), "--dir", "results")

    assert code == 0, answer
    results = researcher.home / "results"
    assert sorted(p.relative_to(results).as_posix() for p in results.rglob("*")) == [
        "metrics.json", "worker-1", "worker-1/Model.keras", f"worker-1/artifact-{renamed_id}-model.keras",
    ]  # fmt: skip
    assert (results / "worker-1" / f"artifact-{renamed_id}-model.keras").read_bytes() == b"lower"
    assert (results / "worker-1" / "Model.keras").read_bytes() == b"upper"
    assert [r["name"] for r in answer["renamed"]] == ["worker-1/model.keras"]


BAD_UPLOADS = [
    # (what the wheel holds, extra arguments, the reason the platform gives)
    ({"demo-1.0-py3-none-any.whl": b"not a zip at all"}, [], "not a wheel"),
    ({"demo-1.0-py3-none-any.whl": GOOD}, ["--main", "train.py"], "main script train.py is not in the wheel"),
    ({"demo-1.0-py3-none-any.whl": {**GOOD, "demo/blob.bin": os.urandom(1_500_000)}}, [], "larger than the 1 MB limit"),
    ({"demo-1.0-py3-none-any.whl": GOOD, "data.npz": b"not an npz"}, ["--dataset", "data.npz"], "npz"),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("files", "args", "reason"), BAD_UPLOADS)
def test_a_refused_upload_stores_nothing(files, args, reason, alice, live_server, settings, tmp_path):
    settings.FC2_MAX_BUNDLE_MB = 1
    _, secret = ApiToken.issue(alice, "laptop")
    researcher = Researcher(tmp_path / "alice", FC2_URL=live_server.url, FC2_TOKEN=secret)
    for name, content in files.items():
        if isinstance(content, dict):
            make_wheel(researcher.home, content, name)
        else:
            (researcher.home / name).write_bytes(content)

    code, answer = researcher("submit", "demo-1.0-py3-none-any.whl", "--dataset", "digits", *args)

    assert code == 1 and 400 <= answer["status"] < 500, answer
    assert reason in answer["error"]
    assert not CodeBundle.objects.exists() and not Job.objects.exists() and not alice.datasets.exists()
    assert media_files(settings) == []
