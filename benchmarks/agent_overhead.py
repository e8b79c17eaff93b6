"""Node agent overhead: CPU the agent itself uses while it samples at 1 Hz (and reports every 2 s) beside a command
that does nothing, as a share of one core.

The agent (monitor/agent.py, as nodes run it) reports to a local HTTP server that answers every report at once, so
the figure is the agent's own sampling and reporting, not a platform's latency. `--own-network` adds the per-node
byte counters (as on lab and EC2 nodes).

    .venv/bin/python benchmarks/agent_overhead.py [--seconds 30] [--sample-interval 1]
"""

from __future__ import annotations

import argparse
import http.server
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

AGENT = Path(__file__).resolve().parent.parent / "monitor" / "agent.py"


class Accept(http.server.BaseHTTPRequestHandler):
    reports = 0

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Accept.reports += 1
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


def measure(seconds: float, sample_interval: float, own_network: bool, url: str) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        (root / "token").write_text("benchmark")
        (root / "output").mkdir()
        command = [
            sys.executable, str(AGENT), "--url", url, "--job", "1", "--node", "worker-0",
            "--token-file", str(root / "token"), "--log", str(root / "node.log"), "--output", str(root / "output"),
            "--result", str(root / "result"), "--sample-interval", str(sample_interval),
            *(["--own-network"] if own_network else []), "--", "sleep", str(seconds + 5),
        ]  # fmt: skip
        agent = subprocess.Popen(command)
        process = psutil.Process(agent.pid)
        time.sleep(3)  # past the interpreter's start-up and the first samples
        before, started = process.cpu_times(), time.monotonic()
        reports = Accept.reports
        time.sleep(seconds)
        after, wall = process.cpu_times(), time.monotonic() - started
        reports = Accept.reports - reports
        agent.terminate()
        agent.wait(30)
    used = (after.user + after.system) - (before.user + before.system)
    return used / wall * 100, reports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--sample-interval", type=float, default=1.0)
    args = parser.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Accept)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    print(f"agent beside `sleep`, a sample every {args.sample_interval} s, {args.seconds:.0f} s measured")
    for own_network in (False, True):
        percent, reports = measure(args.seconds, args.sample_interval, own_network, url)
        what = "with its own network's counters" if own_network else "process tree only"
        print(f"  {what:<34} {percent:5.2f} % of one core ({reports} reports)")
    server.shutdown()


if __name__ == "__main__":
    main()
