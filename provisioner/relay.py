"""A TCP relay from a lab cluster's gateway address to the platform's web server.

Lab nodes reach the platform only at their bridge's address (provisioner/lab/net.py: no route anywhere else), and the
platform's web server listens where its operator said (127.0.0.1:8000 by default, or the private port of
`submit_job --inline`). One relay per cluster listens on <gateway>:<port> and passes each connection through to the
platform, byte for byte in both directions, so the node agents' reports and uploads arrive as they would on a cloud.
It is a process of its own (`python -m provisioner.relay --listen HOST:PORT --to HOST:PORT`), so that it lives as long
as the cluster whatever happens to the worker that started it; the lab's teardown stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

CHUNK = 2**16


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.write_eof()


async def _serve(listen: tuple[str, int], target: tuple[str, int]) -> None:
    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        for end in (writer, up_writer):
            end.close()

    server = await asyncio.start_server(relay, *listen, reuse_address=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        await stop.wait()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, type=_address, help="HOST:PORT to listen on (the gateway)")
    parser.add_argument("--to", required=True, type=_address, help="HOST:PORT of the platform's web server")
    parser.add_argument("--cluster", default="", help="the cluster's directory: names the relay in the process list")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.listen, args.to))


if __name__ == "__main__":
    main()
