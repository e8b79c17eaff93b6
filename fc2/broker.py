"""The embedded broker: kombu's filesystem transport, made safe for several processes sharing one queue folder.

kombu's filesystem transport (`filesystem://`) creates a message file under its final `.msg` name and only then locks
and writes it, while a consumer moves and reads `.msg` files without a lock (celery/kombu#1551): a worker that lists the
folder between the two reads a half-written message, and an undecodable message is an unrecoverable error that stops
the worker ("Unrecoverable error: JSONDecodeError"). Beat queueing a sweep every few seconds beside the worker meets
that race within hours.

This transport changes three things and reuses the rest of kombu's (fanout, purge, size):

- put writes the message under a temporary name that no consumer looks at (it does not end in `.msg`), fsyncs it and
  renames it into place: a rename within one folder is atomic, so a consumer sees a whole message or none.
- get claims a message by renaming it into the processed folder (so two consumers never take the same one), and a
  message it cannot decode — garbage, a half-written file left by a stock kombu producer or a crash — is set aside in
  the rejected folder with one log line naming it, and the next message is read: the worker goes on.
- an exchange's table (which queues it routes to) is never seen empty: kombu creates the file before it locks and
  writes it, the same race on the control folder (a publisher's first bind, beside the worker's).

Settings select it with CELERY_BROKER_TRANSPORT = "fc2.broker:Transport" (an explicit transport wins over the URL's
scheme). The queue, processed and rejected folders must be on one filesystem (they are, under FC2_VAR_DIR/broker).
"""

from __future__ import annotations

import logging
import os
import uuid
from contextlib import suppress
from pathlib import Path
from queue import Empty
from time import monotonic, time
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

logger = logging.getLogger(__name__)


# A put's temporary file or a claimed message this old belongs to a process that died mid-way (a put takes
# milliseconds, a claim is read at once): removed when a channel opens. A lost message is the sweep's to resend.
LEFT_BEHIND_S = 3600


class Channel(filesystem.Channel):
    """kombu's filesystem channel with an atomic put and a get that sets an unreadable message aside."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._remove_left_behind()

    def _remove_left_behind(self) -> None:
        """Remove what a process killed during a put (`.part`) or a get (a claimed message) left, once it is
        LEFT_BEHIND_S old, with one log line each; claimed messages only where processed ones are not kept."""
        places = [(Path(self.data_folder_out), ".part")]
        if not self.store_processed:
            places.append((Path(self.processed_folder), ".msg"))
        cutoff = time() - LEFT_BEHIND_S
        for folder, suffix in places:
            with suppress(OSError):
                for entry in os.scandir(folder):
                    with suppress(OSError):
                        if entry.name.endswith(suffix) and entry.stat().st_mtime < cutoff:
                            os.unlink(entry.path)
                            logger.warning("broker: removed %s, left behind by a process that died", entry.path)

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        # kombu's own name: the millisecond stamp first, so that a sorted listing is the queue's order.
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        folder = Path(self.data_folder_out)
        part = folder / f".{uuid.uuid4()}.part"
        try:
            with open(part, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
                f.flush()
                # On disk before it has its name: a machine that crashes right after leaves no empty `.msg`.
                os.fsync(f.fileno())
            os.rename(part, folder / name)
        except OSError as exc:
            with suppress(OSError):
                part.unlink()
            raise ChannelError(f"Cannot add file {name!r} to {folder}") from exc

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        # kombu creates an exchange's table file empty and then locks and writes it, while another process's bind or
        # lookup may open it between the two and fail to decode it. Made here whole (an empty table) and linked into
        # place only if absent, the file is never empty; kombu's own locked update then adds the queue to it.
        table = self._exchange_file(exchange)
        if not table.exists():
            self.control_folder.mkdir(exist_ok=True)
            part = table.with_name(f".{uuid.uuid4()}.part")
            try:
                part.write_bytes(str_to_bytes(dumps([])))
                with suppress(FileExistsError):
                    os.link(part, table)
            except OSError as exc:
                raise ChannelError(f"Cannot create {table}") from exc
            finally:
                with suppress(OSError):
                    part.unlink()
        super()._queue_bind(exchange, routing_key, pattern, queue)

    def _get(self, queue: str) -> Any:
        suffix = f"{queue}.msg"
        folder = Path(self.data_folder_in)
        processed = Path(self.processed_folder)
        for name in sorted(os.listdir(folder)):
            if name.partition(".")[2] != suffix:
                continue
            claimed = processed / name
            try:
                os.rename(folder / name, claimed)
            except FileNotFoundError:
                continue  # another consumer took it first
            except OSError as exc:
                raise ChannelError(f"Cannot take {name!r} from {folder}") from exc
            try:
                raw = claimed.read_bytes()
            except OSError as exc:
                raise ChannelError(f"Cannot read {claimed}") from exc
            try:
                payload = loads(bytes_to_str(raw))
                # What the worker will do with it next; a message that fails here would stop the worker there.
                self.Message(payload, channel=self)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                self._set_aside(claimed, exc)
                continue
            if not self.store_processed:
                claimed.unlink()
            return payload
        raise Empty()

    def _set_aside(self, claimed: Path, exc: Exception) -> None:
        rejected = Path(self.rejected_folder)
        rejected.mkdir(parents=True, exist_ok=True)
        os.replace(claimed, rejected / claimed.name)
        logger.warning(
            "broker: message %s is unreadable (%s: %s), set aside in %s",
            claimed.name,
            type(exc).__name__,
            str(exc)[:200],
            rejected,
        )

    @property
    def rejected_folder(self) -> str:
        return str(self.transport_options.get("rejected_folder", "rejected"))


class Transport(filesystem.Transport):
    """kombu's filesystem transport with fc2.broker.Channel."""

    Channel = Channel
