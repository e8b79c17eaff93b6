#!/usr/bin/env python3
"""Safe download of URL datasets: http(s) from public addresses only, checked at every hop and at connect time.

Where it runs, and why there: a URL dataset is downloaded by the cluster node that needs it, beside the node agent
(monitor/agent.py), not by the platform's Celery worker. The worker sits next to the platform's database, broker,
admin pages and the cloud's metadata service (169.254.169.254), so a URL that reaches "inside" from there reaches the
most — and the body would be handed to the user's code. The platform still calls `check_url` when a job is submitted
(fc2.services.datasets.resolve), for an early and clear refusal; the node calls `fetch`, which checks everything
again, because a check at submit time proves nothing later (a DNS answer can change, a redirect can lead anywhere).

Standalone on purpose — stdlib only, like the agent — because it is copied onto cluster nodes that have no Django.
Run as a script it downloads one URL (`python3 safe_fetch.py URL TARGET --max-bytes N [--allow CIDR]…`) and exits 1
with `error: <reason>` on stderr when it refuses or fails.

What is refused, and where:

- the URL: schemes other than http and https (and none at all), credentials in it (`user:password@`), `localhost`,
  IPv4 addresses in spellings other than dotted decimal (`2130706433`, `0x7f.1`, `017700000001`: URL parsers and
  resolvers disagree on them), whitespace and control characters;
- every address a host is or resolves to — all of them, not just the first: anything but a global unicast address
  (loopback, RFC 1918, CGNAT 100.64/10, link-local with the metadata address, unique-local fc00::/7, unspecified,
  multicast, reserved, documentation ranges), and IPv4 addresses inside IPv6 ones (mapped ::ffff:a.b.c.d, NAT64,
  6to4) judged as the IPv4 address they reach — unless the address lies in a network the operator allows on purpose
  (`allowed_networks`, the platform's FC2_DATASET_ALLOWED_NETWORKS);
- every hop: redirects are followed here, not by a library (at most 5), each target checked like the first URL; a
  host name is resolved once per hop and the socket goes to a checked address itself — the Host header and TLS (SNI
  and the certificate check) stay with the name — so a DNS answer that changes between check and connect (rebinding)
  cannot steer the connection anywhere unchecked;
- the body: at most `max_bytes`, judged from Content-Length before reading and counted while streaming; written to a
  temporary file beside the target and renamed into place only when complete, so a failure leaves no partial file.

No proxy is used, whatever the environment says (http_proxy, HTTPS_PROXY…): http.client is used directly, never
urllib's opener, which would honour them and resolve the name itself.
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import os
import re
import socket
import ssl
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urljoin, urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_REDIRECTS = 5
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
CHUNK_BYTES = 1 << 20
# identity: the body is stored as sent, never decompressed here (no bomb to defuse, the limit counts what is stored).
REQUEST_HEADERS = {"User-Agent": "fc2-safe-fetch", "Accept-Encoding": "identity"}

# Refused even where `is_global` says yes: Python's tables change between patch releases, and in 3.11 multicast and
# NAT64 count as global. These are the IANA special-purpose ranges that must never be fetched from.
DENIED_NETWORKS: tuple[Network, ...] = tuple(
    ipaddress.ip_network(network)
    for network in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.88.99.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",
        "240.0.0.0/4",  # with 255.255.255.255
        "::/8",  # unspecified, loopback, IPv4-compatible; NAT64 is unwrapped before this is asked
        "64:ff9b:1::/48",
        "100::/64",
        "2001::/23",
        "2001:db8::/32",
        "fc00::/7",
        "fe80::/10",
        "fec0::/10",
        "ff00::/8",
    )
)
CGNAT = ipaddress.ip_network("100.64.0.0/10")
NAT64 = ipaddress.ip_network("64:ff9b::/96")

# What URL parsers and inet_aton read as an IPv4 number: a last label of digits or 0x-hex (DNS never serves those).
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*", re.IGNORECASE)
_HOST_NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*\.?")
# Characters left as they are when the path is percent-encoded for the request line: RFC 3986's reserved and
# unreserved ones, and % so that what is encoded already stays so.
_PATH_SAFE = "/?#[]@!$&'()*+,;=:-._~%"


class FetchError(ValueError):
    """A URL is refused or its download failed; the message says why."""


@dataclass(frozen=True)
class _Target:
    url: str  # as given, for messages
    tls: bool  # https
    host: str  # ASCII host name or address literal: the Host header, SNI and the certificate check use it
    port: int
    path: str  # path and query for the request line, percent-encoded
    addresses: tuple[IPAddress, ...]  # every address of the host, each checked; connections go only to these


def check_url(url: str, allowed_networks: Iterable[str | Network] = ()) -> None:
    """Raise FetchError, saying why, unless `url` is http(s) to a public address (or one in `allowed_networks`).

    Host names are resolved here and every address they resolve to is checked. Address literals need no DNS:

    >>> check_url("https://93.184.216.34/data.npz")
    >>> check_url("http://10.1.2.3/data.npz", allowed_networks=["10.0.0.0/8"])
    >>> for url in ("http://169.254.169.254/latest/meta-data/", "http://[::ffff:127.0.0.1]/", "http://0x7f.1/",
    ...             "example.com/data.npz", "file:///etc/passwd", "http://user:pw@example.com/"):
    ...     try:
    ...         check_url(url)
    ...     except FetchError as exc:
    ...         print(exc)
    169.254.169.254 is a link-local address (where clouds serve instance metadata)
    ::ffff:7f00:1 is a loopback address (as IPv4 127.0.0.1)
    host '0x7f.1' is an IPv4 address in a non-standard spelling; write it as dotted decimal
    'example.com/data.npz' has no scheme: give an http:// or https:// URL
    only http and https URLs are allowed, not file:
    credentials in the URL (user:password@host) are not allowed; use a URL that needs none
    """
    _vet(url, _networks(allowed_networks))


def fetch(
    url: str,
    target_path: str | os.PathLike,
    max_bytes: int,
    allowed_networks: Iterable[str | Network] = (),
    timeout: float = 60,
    *,
    ssl_context: ssl.SSLContext | None = None,
) -> Path:
    """Download `url` to `target_path` (replaced only once the whole body is in) and return it as a Path.

    The URL and every redirect's target are checked as `check_url` does, at most MAX_REDIRECTS redirects are followed,
    and each connection goes to an address checked in the same hop. More than `max_bytes` of body — declared in
    Content-Length or counted while streaming — is refused. `timeout` bounds the connect and each read, in seconds.
    `ssl_context` verifies https (default: the system's trusted CAs, host name checked). Any refusal or failure is a
    FetchError, and leaves no file behind.
    """
    networks = _networks(allowed_networks)
    target_path = Path(target_path)
    context = ssl_context or ssl.create_default_context()
    current = url
    for hop in range(MAX_REDIRECTS + 1):
        try:
            target = _vet(current, networks)
        except FetchError as exc:
            raise (FetchError(f"redirect from {url} to {current} refused: {exc}") if hop else exc) from None
        connection = _PinnedConnection(target, timeout, context)
        try:
            connection.request("GET", target.path, headers=REQUEST_HEADERS)
            response = connection.getresponse()
            if response.status in REDIRECT_STATUSES:
                location = response.getheader("Location")
                if not location:
                    raise FetchError(f"{current} answered HTTP {response.status} without a Location to go to")
                current = urljoin(current, location.strip())
                continue
            if response.status != 200:
                raise FetchError(f"{current} answered HTTP {response.status} {response.reason}")
            return _save(response, target_path, max_bytes, current)
        except (OSError, http.client.HTTPException) as exc:
            raise FetchError(f"cannot download {current}: {type(exc).__name__}: {exc}") from exc
        finally:
            connection.close()
    raise FetchError(f"{url} redirects more than {MAX_REDIRECTS} times")


def _networks(allowed: Iterable[str | Network]) -> tuple[Network, ...]:
    """The operator's allowed networks, parsed (a host address is a network of one).

    >>> _networks(["10.1.0.0/16", " 192.168.7.7 "])
    (IPv4Network('10.1.0.0/16'), IPv4Network('192.168.7.7/32'))
    """
    networks = []
    for network in allowed:
        try:
            value = network.strip() if isinstance(network, str) else network
            networks.append(ipaddress.ip_network(value, strict=False))
        except ValueError as exc:
            raise FetchError(f"allowed network {network!r} is not a network such as 10.1.0.0/16: {exc}") from exc
    return tuple(networks)


def _vet(url: str, networks: tuple[Network, ...]) -> _Target:
    """The URL taken apart, its host resolved once and every address checked; FetchError with the reason if refused."""
    if any(ord(char) <= 0x20 or ord(char) == 0x7F for char in url) or "\\" in url:
        # Parsers disagree on these (a browser reads \ as /); nothing legitimate needs them unencoded.
        raise FetchError(f"{url!r} contains whitespace, control characters or backslashes")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise FetchError(f"{url!r} is not a valid URL: {exc}") from exc
    if parts.scheme not in ("http", "https"):
        if not parts.scheme or parts.path[:1].isdigit():  # "host:8000/x" reads as scheme "host"
            raise FetchError(f"{url!r} has no scheme: give an http:// or https:// URL")
        raise FetchError(f"only http and https URLs are allowed, not {parts.scheme}:")
    if "@" in parts.netloc:
        # Said without echoing the URL: it holds a password.
        raise FetchError("credentials in the URL (user:password@host) are not allowed; use a URL that needs none")
    host = parts.hostname
    if not host:
        raise FetchError(f"{url!r} has no host")
    if port == 0:
        raise FetchError(f"{url!r} has port 0")
    port = port or (443 if parts.scheme == "https" else 80)

    address = _literal_address(host)
    if address is not None:
        reason = _refusal(address, networks)
        if reason:
            raise FetchError(f"{address} is {reason}")
        addresses: tuple[IPAddress, ...] = (address,)
    else:
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise FetchError(f"host {host!r} is not a valid host name: {exc}") from exc
        if not _HOST_NAME.fullmatch(host):
            raise FetchError(f"host {host!r} is not a valid host name")
        if host.rstrip(".") == "localhost" or host.rstrip(".").endswith(".localhost"):
            raise FetchError(f"host {host!r} is this machine (localhost)")
        addresses = _resolve(host, port)
        for address in addresses:
            reason = _refusal(address, networks)
            if reason:
                raise FetchError(
                    f"host {host!r} resolves to {address}, {reason}; datasets come from public addresses only, unless "
                    "the platform's administrator allows that network (FC2_DATASET_ALLOWED_NETWORKS, a CIDR list)"
                )

    path = quote(parts.path or "/", safe=_PATH_SAFE)
    if parts.query:
        path += "?" + quote(parts.query, safe=_PATH_SAFE)
    return _Target(url, parts.scheme == "https", host, port, path, addresses)


def _literal_address(host: str) -> IPAddress | None:
    """The address a URL's host spells, or None for a host name; FetchError for IPv4 not in dotted decimal.

    >>> _literal_address("93.184.216.34"), _literal_address("data.example.com")
    (IPv4Address('93.184.216.34'), None)
    """
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        if getattr(address, "scope_id", None):
            raise FetchError(f"host {host!r} has a zone id; only global addresses are allowed")
        return address
    if _NUMERIC_LABEL.fullmatch(host.rstrip(".").rsplit(".", 1)[-1]):
        raise FetchError(f"host {host!r} is an IPv4 address in a non-standard spelling; write it as dotted decimal")
    return None


def _resolve(host: str, port: int) -> tuple[IPAddress, ...]:
    """Every address `host` resolves to, in the resolver's order; FetchError if none."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise FetchError(f"cannot resolve host {host!r}: {exc}") from exc
    addresses: dict[IPAddress, None] = {}
    for family, _type, _proto, _canonname, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        try:
            addresses[ipaddress.ip_address(sockaddr[0])] = None
        except ValueError as exc:
            raise FetchError(f"host {host!r} resolves to {sockaddr[0]!r}, not an IP address") from exc
    if not addresses:
        raise FetchError(f"host {host!r} resolves to no IP address")
    return tuple(addresses)


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address reaches: mapped (::ffff:a.b.c.d), NAT64 (64:ff9b::a.b.c.d) or 6to4.

    >>> _embedded_ipv4(ipaddress.ip_address("64:ff9b::a9fe:a9fe"))
    IPv4Address('169.254.169.254')
    """
    if address.version == 4:
        return None
    if address.ipv4_mapped:
        return address.ipv4_mapped
    if address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


def _refusal(address: IPAddress, networks: tuple[Network, ...]) -> str | None:
    """Why nothing may be fetched from `address`, or None if it may: public, or in an operator-allowed network.

    >>> _refusal(ipaddress.ip_address("8.8.8.8"), ())
    >>> _refusal(ipaddress.ip_address("100.64.0.1"), ())
    'a shared address (carrier-grade NAT, 100.64.0.0/10)'
    >>> _refusal(ipaddress.ip_address("192.168.1.10"), (ipaddress.ip_network("192.168.1.0/24"),))
    """
    embedded = _embedded_ipv4(address)
    judged = embedded or address
    if any(judged in network for network in networks):
        return None
    if judged.is_global and not judged.is_multicast and not any(judged in network for network in DENIED_NETWORKS):
        return None
    reason = _kind(judged)
    return f"{reason} (as IPv4 {embedded})" if embedded else reason


def _kind(address: IPAddress) -> str:
    """What kind of non-public address this is, in words for an error message."""
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address (where clouds serve instance metadata)"
    if address.is_multicast:
        return "a multicast address"
    if address in CGNAT:
        return "a shared address (carrier-grade NAT, 100.64.0.0/10)"
    if address.is_reserved:
        return "a reserved address"
    if address.is_private:
        return "a private address"
    return "not a public address"


class _PinnedConnection(http.client.HTTPConnection):
    """HTTP or HTTPS to addresses checked beforehand: DNS is not asked again, so what was checked is what is reached.

    Only the socket goes to the checked address; the Host header, SNI and the certificate check are for the host name.
    """

    def __init__(self, target: _Target, timeout: float, context: ssl.SSLContext):
        super().__init__(target.host, target.port, timeout=timeout)
        self.default_port = 443 if target.tls else 80  # the Host header leaves out the scheme's own port
        self._target = target
        self._context = context

    def connect(self) -> None:
        sock = _open_socket(self._target.addresses, self.port, self.timeout)
        if self._target.tls:
            try:
                sock = self._context.wrap_socket(sock, server_hostname=self.host)
            except BaseException:
                sock.close()
                raise
        self.sock = sock


def _open_socket(addresses: tuple[IPAddress, ...], port: int, timeout: float | None) -> socket.socket:
    """A TCP connection to the first of `addresses` that answers (the socket made here: no name is looked up)."""
    failures = []
    for address in addresses:
        sock = socket.socket(socket.AF_INET6 if address.version == 6 else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect((str(address), port))
        except OSError as exc:
            sock.close()
            failures.append(f"{address}: {exc}")
            continue
        return sock
    raise OSError(f"no address answered ({'; '.join(failures)})")


def _save(response: http.client.HTTPResponse, target_path: Path, max_bytes: int, url: str) -> Path:
    """The body streamed into a temporary file beside `target_path`, renamed into place only when whole and in limit."""
    declared = response.getheader("Content-Length")
    declared_bytes = int(declared) if declared and declared.strip().isdigit() else None
    if declared_bytes is not None and declared_bytes > max_bytes:
        raise FetchError(f"{url} is {declared_bytes} bytes (Content-Length), more than the limit of {max_bytes}")
    target_path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=target_path.parent, prefix=f".{target_path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            copied = 0
            # One byte more than the limit is asked for, so that a body over it is noticed without reading the rest.
            while chunk := response.read(min(CHUNK_BYTES, max_bytes + 1 - copied)):
                copied += len(chunk)
                if copied > max_bytes:
                    raise FetchError(f"{url} is more than the limit of {max_bytes} bytes")
                out.write(chunk)
        if declared_bytes is not None and copied != declared_bytes:
            # http.client's read(n) returns b"" at a premature close instead of raising: count it ourselves.
            raise FetchError(f"{url} ended after {copied} of {declared_bytes} bytes")
        os.replace(partial, target_path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return target_path


def main(argv: list[str] | None = None) -> int:
    """Command line: download one URL dataset on a node; exit 1 with `error: <reason>` on stderr if refused."""
    parser = argparse.ArgumentParser(description="Download a URL dataset: http(s) from public addresses only.")
    parser.add_argument("url")
    parser.add_argument("target", type=Path, help="file to write (replaced only once the download is whole)")
    parser.add_argument("--max-bytes", type=int, required=True, help="largest body accepted")
    parser.add_argument(
        "--allow", action="append", default=[], metavar="CIDR", help="a private network allowed on purpose (repeatable)"
    )
    parser.add_argument("--timeout", type=float, default=60, help="seconds for the connect and for each read")
    args = parser.parse_args(argv)
    allowed = [network for value in args.allow for network in value.split(",") if network.strip()]
    try:
        path = fetch(args.url, args.target, args.max_bytes, allowed, args.timeout)
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
