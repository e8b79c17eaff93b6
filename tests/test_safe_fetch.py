"""URL datasets reach nothing inside (monitor/safe_fetch.py): refused at submit time, and again on the node at every
redirect and connection (DNS rebinding), with a size limit and no partial file left.

Real sockets on 127.0.0.1 only — no test here sends a packet anywhere else: every name resolves through the `dns`
fixture (a patched socket.getaddrinfo that fails for names it was not told), and where a public address comes into
play every connect is intercepted before it leaves (`connects`).
"""

from __future__ import annotations

import datetime
import http.server
import shutil
import socket
import socketserver
import ssl
import subprocess
import sys
import threading
from io import StringIO
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from django.core.management import CommandError, call_command

from fc2.models import CodeBundle, Dataset, Job
from fc2.services import datasets
from fc2.wizard import SESSION_KEY
from monitor import safe_fetch
from monitor.safe_fetch import FetchError, check_url, fetch
from tests.helpers import code_form, step_url

PUBLIC = "93.184.216.34"  # never reached: only ever handed out by the patched resolver, and connects are intercepted
BODY = b"x_train and friends " * 100  # 2,000 bytes
LOOPBACK = ("127.0.0.0/8",)


# --- fixtures: a resolver we control, a connect we can intercept, a local server ---


@pytest.fixture(autouse=True)
def dns(monkeypatch) -> dict:
    """Name → addresses (or a callable giving them per lookup) for every getaddrinfo in the test; other names fail as
    unknown, so no DNS query ever leaves. Each lookup's name lands in dns["lookups"]."""
    answers: dict = {"lookups": []}

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        answers["lookups"].append(host)
        addresses = answers.get(host)
        if addresses is None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known (test resolver)")
        if callable(addresses):
            addresses = addresses()
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (a, port, 0, 0))
            if ":" in a
            else (socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
            for a in addresses
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers


@pytest.fixture
def connects(monkeypatch) -> list[tuple[str, int]]:
    """Every outgoing connect of the test, recorded; those to 127.0.0.1 (the test's servers) are made, any other is
    refused before a packet leaves."""
    attempts: list[tuple[str, int]] = []
    real_connect = socket.socket.connect

    def connect(self, address):
        attempts.append(tuple(address[:2]))
        if address[0] != "127.0.0.1":
            raise ConnectionRefusedError("intercepted by the test: no packet left")
        return real_connect(self, address)

    def refused(*args, **kwargs):
        raise AssertionError("only socket.socket.connect is expected")

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", refused)
    monkeypatch.setattr(socket, "create_connection", refused)
    return attempts


class Handler(http.server.BaseHTTPRequestHandler):
    """/data.npz, /redirect?to=URL, /hops/N (N redirects, then the data), /chunked/N (N chunks of 1,000 bytes, no
    length), /declared-big (says 10 GB), /short (says 1,000 bytes, sends 10), anything else 404."""

    protocol_version = "HTTP/1.1"  # for chunked bodies

    def do_GET(self):
        self.server.requests.append((self.path, self.headers["Host"]))
        self.close_connection = True
        parts = urlsplit(self.path)
        if parts.path == "/data.npz":
            self.reply(200, {"Content-Length": str(len(BODY))}, BODY)
        elif parts.path == "/redirect":
            self.reply(302, {"Location": parse_qs(parts.query)["to"][0], "Content-Length": "0"})
        elif parts.path.startswith("/hops/"):
            left = int(parts.path.rsplit("/", 1)[1])
            self.reply(302, {"Location": f"/hops/{left - 1}" if left else "/data.npz", "Content-Length": "0"})
        elif parts.path.startswith("/chunked/"):
            self.reply(200, {"Transfer-Encoding": "chunked"})
            for _ in range(int(parts.path.rsplit("/", 1)[1])):
                self.wfile.write(b"3e8\r\n" + b"c" * 1000 + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        elif parts.path == "/declared-big":
            self.reply(200, {"Content-Length": str(10 * 10**9)}, b"z" * 10)
        elif parts.path == "/short":
            self.reply(200, {"Content-Length": "1000"}, b"s" * 10)
        else:
            self.reply(404, {"Content-Length": "0"})

    def reply(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

    def server_bind(self):  # HTTPServer's would ask for our FQDN
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


def serve(tls: ssl.SSLContext | None = None):
    server = Server(("127.0.0.1", 0), Handler)
    server.requests = []
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server


@pytest.fixture
def server():
    """An HTTP server on 127.0.0.1; `server.requests` lists (path, Host header) of what reached it."""
    server = serve()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def data_dir(tmp_path) -> Path:
    """Where downloads go; a test ends with nothing here but what it fetched."""
    path = tmp_path / "data"
    path.mkdir()
    return path


def files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# --- the check, at submit time and at every hop ---


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("example.com/x.npz", "has no scheme"),
        ("localhost:8000/x.npz", "has no scheme"),
        ("//example.com/x.npz", "has no scheme"),
        ("ftp://example.com/x.npz", "only http and https"),
        ("file:///etc/passwd", "only http and https"),
        ("gopher://127.0.0.1:6379/_FLUSHALL", "only http and https"),
        ("http://user:pw@example.com/x", "credentials"),
        ("https://token@example.com/x", "credentials"),
        ("http:///x.npz", "has no host"),
        ("http://localhost/x", "localhost"),
        ("http://LocalHost.:8000/x", "localhost"),
        ("http://api.localhost/x", "localhost"),
        ("http://127.0.0.1:8000/x.npz", "loopback"),
        ("http://127.8.9.10/", "loopback"),
        ("http://[::1]/", "loopback"),
        ("http://[::ffff:127.0.0.1]/", "loopback address (as IPv4 127.0.0.1)"),
        ("http://[::ffff:7f00:1]/", "loopback"),
        ("http://[64:ff9b::7f00:1]/", "loopback"),  # NAT64
        ("http://[2002:7f00:1::]/", "loopback"),  # 6to4
        ("http://[::7f00:1]/", "reserved"),  # IPv4-compatible, deprecated
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://[::ffff:169.254.169.254]/latest/meta-data/", "link-local"),
        ("http://[fe80::1]/", "link-local"),
        ("http://[fe80::1%25eth0]/", "zone id"),
        ("http://10.0.0.1/", "private"),
        ("http://172.16.5.4/", "private"),
        ("http://192.168.1.1/", "private"),
        ("http://100.64.0.1/", "carrier-grade NAT"),
        ("http://[fc00::1]/", "private"),
        ("http://[fd12:3456::1]/", "private"),
        ("http://0.0.0.0:8000/", "unspecified"),
        ("http://[::]/", "unspecified"),
        ("http://224.0.0.1/", "multicast"),
        ("http://[ff02::1]/", "multicast"),
        ("http://240.0.0.1/", "reserved"),
        ("http://255.255.255.255/", "reserved"),
        ("http://192.0.2.7/", "private"),  # documentation
        ("http://2130706433/", "non-standard spelling"),
        ("http://0x7f.1/", "non-standard spelling"),
        ("http://017700000001/", "non-standard spelling"),
        ("http://0x7f000001/", "non-standard spelling"),
        ("http://127.1/", "non-standard spelling"),
        ("http://127.0.0.01/", "non-standard spelling"),
        ("http://1.2.3.4.5/", "non-standard spelling"),
        ("http://example.com:99999/", "not a valid URL"),
        ("http://example.com:0/", "port 0"),
        ("http://exa mple.com/", "whitespace"),
        ("http://example.com\\@127.0.0.1/", "backslashes"),
        ("http://exa_mple.com%00.evil/", "not a valid host name"),
    ],
)
def test_refused_at_check_time(dns, url, reason):
    with pytest.raises(FetchError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        check_url(url)
    assert dns["lookups"] == []  # refused from the URL alone


def test_credentials_are_not_repeated_in_the_reason():
    with pytest.raises(FetchError) as refused:
        check_url("https://alice:s3cret@example.com/x.npz")
    assert "s3cret" not in str(refused.value)


@pytest.mark.parametrize(
    "url", ["https://93.184.216.34/data.npz", "http://8.8.8.8:8080/x?y=1", "http://[2606:4700:4700::1111]/x"]
)
def test_public_addresses_pass(dns, url):
    check_url(url)
    assert dns["lookups"] == []


def test_a_name_passes_when_every_address_is_public(dns):
    dns["data.example"] = [PUBLIC, "2606:4700::6810:84e5"]
    check_url("https://data.example/sets/mine.npz")
    assert dns["lookups"] == ["data.example"]


@pytest.mark.parametrize(
    "addresses",
    [
        ["127.0.0.1"],
        ["10.0.0.5"],
        ["169.254.169.254"],
        ["::1"],
        ["::ffff:127.0.0.1"],
        ["fd00::5"],
        [PUBLIC, "127.0.0.1"],  # every address is checked, not just the first
        ["2606:4700::6810:84e5", "192.168.0.10"],
    ],
)
def test_names_resolving_inside_are_refused(dns, addresses):
    dns["inside.example"] = addresses
    with pytest.raises(FetchError, match="host 'inside.example' resolves to"):
        check_url("http://inside.example/x.npz")


def test_unresolvable_names_are_refused():
    with pytest.raises(FetchError, match="cannot resolve host 'nowhere.example'"):
        check_url("https://nowhere.example/x.npz")


def test_operator_allowed_networks(dns):
    check_url("http://10.1.2.3/x.npz", ["10.0.0.0/8"])
    check_url("http://[::ffff:10.1.2.3]/x.npz", ["10.0.0.0/8"])
    dns["mirror.lab"] = ["10.1.2.3"]
    check_url("http://mirror.lab/x.npz", ["10.1.0.0/16"])
    with pytest.raises(FetchError, match="private"):
        check_url("http://10.1.2.3/x.npz", ["10.2.0.0/16"])
    with pytest.raises(FetchError, match="not a network"):
        check_url("http://10.1.2.3/x.npz", ["10.0.0.0/33"])


# --- fetching from a local server ---


def test_fetches_from_an_allowed_local_server_without_any_proxy(server, data_dir, monkeypatch):
    dead = f"http://127.0.0.1:{unused_port()}"  # a proxy from the environment would be a dead end
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, dead)

    path = fetch(f"http://127.0.0.1:{server.server_port}/data.npz", data_dir / "data.npz", 10_000, LOOPBACK)

    assert path == data_dir / "data.npz" and path.read_bytes() == BODY
    assert files(data_dir) == ["data.npz"]
    assert server.requests == [("/data.npz", f"127.0.0.1:{server.server_port}")]


def test_a_local_server_is_refused_without_the_allowance(server, data_dir):
    with pytest.raises(FetchError, match="loopback"):
        fetch(f"http://127.0.0.1:{server.server_port}/data.npz", data_dir / "data.npz", 10_000)
    assert server.requests == [] and files(data_dir) == []


@pytest.mark.parametrize(
    ("to", "reason"),
    [
        ("http://127.0.0.2:{port}/data.npz", "127.0.0.2 is a loopback address"),
        ("file:///etc/passwd", "only http and https"),
        ("gopher://127.0.0.1:{port}/", "only http and https"),
        ("http://localhost:{port}/data.npz", "localhost"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://admin:pw@127.0.0.1:{port}/data.npz", "credentials"),
    ],
)
def test_a_redirect_to_a_refused_place_is_not_followed(server, data_dir, connects, to, reason):
    """Only 127.0.0.1/32 is allowed; the redirect's target is checked like the first URL, before any connect."""
    port = server.server_port
    start = f"http://127.0.0.1:{port}/redirect?to={to.format(port=port)}"

    with pytest.raises(FetchError, match=f"redirect from .* refused: .*{reason}"):
        fetch(start, data_dir / "data.npz", 10_000, ("127.0.0.1/32",))

    assert connects == [("127.0.0.1", port)] and len(server.requests) == 1  # the first hop only
    assert files(data_dir) == []


def test_redirects_are_followed_up_to_five(server, data_dir):
    url = f"http://127.0.0.1:{server.server_port}/hops/4"  # 5 redirects, then the data
    assert fetch(url, data_dir / "data.npz", 10_000, LOOPBACK).read_bytes() == BODY
    assert len(server.requests) == 6

    with pytest.raises(FetchError, match="redirects more than 5 times"):
        fetch(f"http://127.0.0.1:{server.server_port}/hops/5", data_dir / "again.npz", 10_000, LOOPBACK)
    assert files(data_dir) == ["data.npz"]


def test_a_name_resolving_to_loopback(dns, server, data_dir):
    dns["data.test"] = ["127.0.0.1"]
    url = f"http://data.test:{server.server_port}/data.npz"

    with pytest.raises(FetchError, match="host 'data.test' resolves to 127.0.0.1, a loopback address") as refused:
        fetch(url, data_dir / "data.npz", 10_000)
    assert "allows that network (FC2_DATASET_ALLOWED_NETWORKS, a CIDR list)" in str(refused.value)
    assert server.requests == []

    # Allowed on purpose, it is fetched — from the checked address, with the name kept in the Host header.
    fetch(url, data_dir / "data.npz", 10_000, LOOPBACK)
    assert server.requests == [("/data.npz", f"data.test:{server.server_port}")]


def test_dns_rebinding_within_one_answer(dns, server, data_dir, connects):
    """A public address first and loopback second: the name is refused as a whole, nothing is connected to."""
    dns["rebind.test"] = [PUBLIC, "127.0.0.1"]
    with pytest.raises(FetchError, match="resolves to 127.0.0.1"):
        fetch(f"http://rebind.test:{server.server_port}/data.npz", data_dir / "data.npz", 10_000)
    assert connects == [] and server.requests == [] and files(data_dir) == []


def test_dns_rebinding_between_lookups(dns, server, data_dir, connects):
    """Public at the first lookup, loopback ever after: the connection goes to the address that was checked (and
    is intercepted there), never to what a second lookup would say; and the node refuses what submit time passed."""
    answers = iter([[PUBLIC]])
    dns["rebind.test"] = lambda: next(answers, ["127.0.0.1"])
    url = f"http://rebind.test:{server.server_port}/data.npz"

    with pytest.raises(FetchError, match="intercepted by the test"):
        fetch(url, data_dir / "data.npz", 10_000)
    assert connects == [(PUBLIC, server.server_port)]
    assert dns["lookups"] == ["rebind.test"]  # resolved once: no second answer was asked for

    answers = iter([[PUBLIC]])
    check_url(url)  # submit time: public
    with pytest.raises(FetchError, match="resolves to 127.0.0.1"):
        fetch(url, data_dir / "data.npz", 10_000)  # on the node: loopback now
    assert connects == [(PUBLIC, server.server_port)] and server.requests == [] and files(data_dir) == []


def test_oversize_declared_body_is_refused_before_reading(server, data_dir):
    with pytest.raises(FetchError, match=r"10000000000 bytes \(Content-Length\), more than the limit of 100000"):
        fetch(f"http://127.0.0.1:{server.server_port}/declared-big", data_dir / "big.npz", 100_000, LOOPBACK)
    assert files(data_dir) == []


def test_oversize_streamed_body_is_refused(server, data_dir):
    url = f"http://127.0.0.1:{server.server_port}/chunked/3"  # 3,000 bytes, no Content-Length
    with pytest.raises(FetchError, match="more than the limit of 2999 bytes"):
        fetch(url, data_dir / "data.npz", 2999, LOOPBACK)
    assert files(data_dir) == []

    assert fetch(url, data_dir / "data.npz", 3000, LOOPBACK).read_bytes() == b"c" * 3000  # the limit itself is fine


@pytest.mark.parametrize(
    ("path", "reason"), [("/short", "ended after 10 of 1000 bytes"), ("/missing", "answered HTTP 404 Not Found")]
)
def test_a_failed_download_leaves_nothing(server, data_dir, path, reason):
    with pytest.raises(FetchError, match=reason):
        fetch(f"http://127.0.0.1:{server.server_port}{path}", data_dir / "data.npz", 10_000, LOOPBACK)
    assert files(data_dir) == []


def test_nothing_listens(data_dir):
    with pytest.raises(FetchError, match="cannot download .*refused"):
        fetch(f"http://127.0.0.1:{unused_port()}/data.npz", data_dir / "data.npz", 10_000, LOOPBACK, timeout=5)
    assert files(data_dir) == []


# --- https: the connection goes to the checked address, SNI and the certificate are for the name ---


@pytest.fixture
def tls_server(tmp_path):
    """An HTTPS server on 127.0.0.1 with a self-signed certificate for data.test; `server.sni` lists the names asked."""
    pytest.importorskip("cryptography")  # paramiko's dependency: here wherever the platform is
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "data.test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("data.test")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    sni: list[str | None] = []
    context.sni_callback = lambda sock, server_name, ctx: sni.append(server_name)
    server = serve(context)
    server.sni = sni
    server.trusting = ssl.create_default_context(cafile=str(cert_file))
    yield server
    server.shutdown()
    server.server_close()


def test_https_verifies_the_name_on_the_checked_address(dns, tls_server, data_dir):
    dns["data.test"] = ["127.0.0.1"]
    dns["other.test"] = ["127.0.0.1"]
    port = tls_server.server_port

    path = fetch(
        f"https://data.test:{port}/data.npz", data_dir / "data.npz", 10_000, LOOPBACK, ssl_context=tls_server.trusting
    )
    assert path.read_bytes() == BODY
    assert tls_server.sni == ["data.test"] and tls_server.requests == [("/data.npz", f"data.test:{port}")]

    with pytest.raises(FetchError, match="CERTIFICATE_VERIFY_FAILED"):  # the system's CAs do not know this one
        fetch(f"https://data.test:{port}/data.npz", data_dir / "again.npz", 10_000, LOOPBACK)
    with pytest.raises(FetchError, match="CERTIFICATE_VERIFY_FAILED.*other.test"):  # right CA, wrong name
        fetch(
            f"https://other.test:{port}/data.npz",
            data_dir / "again.npz",
            10_000,
            LOOPBACK,
            ssl_context=tls_server.trusting,
        )
    assert files(data_dir) == ["data.npz"]


# --- on a node: the module alone, stdlib only ---


def test_command_line_on_a_bare_python(server, tmp_path):
    """Copied alone into a directory and run with no site-packages (-I -S), as on a node beside the agent."""
    node = tmp_path / "node"
    node.mkdir()
    script = Path(shutil.copy(safe_fetch.__file__, node / "safe_fetch.py"))
    url = f"http://127.0.0.1:{server.server_port}/data.npz"

    def run(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-I", "-S", str(script), url, str(node / "data" / "data.npz"), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    refused = run("--max-bytes", "10000")
    assert refused.returncode == 1 and refused.stderr.startswith("error: 127.0.0.1 is a loopback address")
    fetched = run("--max-bytes", "10000", "--allow", "10.0.0.0/8,127.0.0.1/32")
    assert fetched.returncode == 0, fetched.stderr
    assert (node / "data" / "data.npz").read_bytes() == BODY


# --- the platform: refused at submit time, with the reason, nothing stored ---

SSRF = [
    ("http://127.0.0.1:8000/x.npz", "127.0.0.1 is a loopback address"),
    ("http://[::1]/", "::1 is a loopback address"),
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a link-local address"),
    ("http://user:pw@example.com/x", "credentials in the URL"),
    ("example.com/x.npz", "has no scheme: give an http:// or https:// URL"),
]


@pytest.mark.parametrize(("url", "reason"), SSRF)
def test_resolve_refuses(alice, url, reason):
    with pytest.raises(datasets.DatasetError, match=reason.replace("(", r"\(")) as refused:
        datasets.resolve(alice, url)
    assert "pw" not in str(refused.value)
    assert not Dataset.objects.filter(kind=Dataset.Kind.URL).exists()


def test_resolve_takes_public_and_operator_allowed_urls(alice, settings, dns):
    dns["data.example"] = [PUBLIC]
    public = datasets.resolve(alice, "https://data.example/sets/mine.npz")
    assert (public.pk, public.kind, public.url, public.name) == (
        None,
        "url",
        "https://data.example/sets/mine.npz",
        "mine.npz",
    )

    with pytest.raises(datasets.DatasetError, match="10.1.2.3 is a private address"):
        datasets.resolve(alice, "http://10.1.2.3/x.npz")
    settings.FC2_DATASET_ALLOWED_NETWORKS = ["10.1.0.0/16"]
    assert datasets.resolve(alice, "http://10.1.2.3/x.npz").url == "http://10.1.2.3/x.npz"


def test_resolve_still_finds_names_before_calling_them_urls(alice):
    with pytest.raises(datasets.DatasetError, match=r"no dataset named 'mine' \(built-ins"):
        datasets.resolve(alice, "mine")
    with pytest.raises(datasets.DatasetError, match="no dataset named 'file:///etc/passwd', and as a URL: only http"):
        datasets.resolve(alice, "file:///etc/passwd")


def submit_job_refusal(*args: str) -> str:
    """The reason `submit_job` gives for refusing (CommandError, or `error: …` and a non-zero exit)."""
    err = StringIO()
    try:
        call_command("submit_job", *args, stdout=StringIO(), stderr=err)
    except CommandError as exc:
        return str(exc)
    except SystemExit as exc:
        assert exc.code != 0
        return err.getvalue()
    pytest.fail(f"submit_job accepted {args}")


@pytest.mark.parametrize(("url", "reason"), SSRF)
def test_submit_job_refuses(alice, example_wheel, url, reason):
    refusal = submit_job_refusal("--bundle", str(example_wheel), "--dataset", url, "--user", "alice", "--inline")
    assert reason in refusal
    assert not (Job.objects.exists() or CodeBundle.objects.exists() or Dataset.objects.filter(kind="url").exists())


@pytest.mark.parametrize(("url", "reason"), SSRF[:4])  # the form itself puts https:// before a scheme-less URL
def test_wizard_data_step_refuses(client, alice, bundle, url, reason):
    client.force_login(alice)
    assert client.post(step_url("code"), code_form(bundle=bundle)).status_code == 302

    response = client.post(step_url("data"), {"source": "url", "url": url})

    assert response.status_code == 400
    assert any(reason in error for error in response.context["form"].errors["url"])
    assert "data" not in client.session.get(SESSION_KEY, {}) and not Dataset.objects.filter(kind="url").exists()


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
