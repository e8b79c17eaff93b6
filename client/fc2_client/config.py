"""Where the client keeps the platform's address and the user's API token: one JSON file, readable by its owner only
(`$XDG_CONFIG_HOME/fc2/config.json`, else `~/.config/fc2/config.json`). FC2_URL and FC2_TOKEN override it, for
scripts and CI that should not write a file."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


class ConfigError(Exception):
    """The client does not know where or as whom to connect; the message says what to do."""


@dataclass(frozen=True)
class Login:
    url: str  # the platform's address, without a trailing slash: http://127.0.0.1:8000
    token: str  # a personal API token, sent as `Authorization: Token <token>`


def config_path(env: Mapping[str, str] = os.environ) -> Path:
    # The XDG spec says a relative XDG_CONFIG_HOME is invalid and to be ignored.
    base = env.get("XDG_CONFIG_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "fc2" / "config.json"


def load(path: Path | None = None) -> Login | None:
    """The stored login, or None when there is none."""
    path = path or config_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Login(url=str(data["url"]), token=str(data["token"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"cannot read {path} ({exc}): run `fc2 login URL` again") from None


def save(login: Login, path: Path | None = None) -> Path:
    """Store `login`, replacing whatever was there, in a file only its owner can read — from its first byte: the file
    is made by mkstemp (os.open with O_CREAT | O_EXCL and mode 0600) beside the target and renamed over it, so
    neither a reader nor a file left with a wider mode ever sees the token."""
    path = path or config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)  # mkdir's mode is narrowed by the umask and ignored for a folder that exists
    fd, temporary = tempfile.mkstemp(prefix=".config-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({"url": login.url, "token": login.token}, out, indent=2)
            out.write("\n")
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
    return path


def remove(path: Path | None = None) -> bool:
    """Forget the stored login; False when there was none."""
    try:
        (path or config_path()).unlink()
    except FileNotFoundError:
        return False
    return True


def current(env: Mapping[str, str] = os.environ, path: Path | None = None) -> Login:
    """The login to use: FC2_URL and FC2_TOKEN where set, else the stored one."""
    stored = None if env.get("FC2_URL") and env.get("FC2_TOKEN") else load(path)
    url = env.get("FC2_URL") or (stored.url if stored else "")
    token = env.get("FC2_TOKEN") or (stored.token if stored else "")
    if not url or not token:
        raise ConfigError("not logged in: run `fc2 login URL` (or set FC2_URL and FC2_TOKEN)")
    return Login(url=normalise_url(url), token=token)


def normalise_url(url: str) -> str:
    """The platform's address as the client joins paths to it.

    >>> normalise_url(" http://127.0.0.1:8000/ ")
    'http://127.0.0.1:8000'
    >>> normalise_url("fc2.example.org")
    Traceback (most recent call last):
    ...
    fc2_client.config.ConfigError: 'fc2.example.org' is not an http:// or https:// address
    """
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")) or len(url.split("://", 1)[1]) == 0:
        raise ConfigError(f"{url!r} is not an http:// or https:// address")
    return url
