"""How often torch's gloo aborts a finished DDP process at exit, bare and through the PyTorch nodes' launcher.

torch 2.13's gloo now and then aborts a process ("terminate called without an active exception", SIGABRT, exit 134)
in the interpreter's finalization, after the code's work is done and its process group destroyed
(pytorch/pytorch#179291). PyTorch nodes run their module through monitor/launcher.py, which ends the process before
finalization. This runs N two-rank DDP runs on 127.0.0.1 (gloo, torchrun's variables, the script as a torchrun
tutorial writes it: init_process_group, a few DDP steps, an all_reduce of the loss, destroy_process_group, nothing
else) each way, alternately,
and prints how many runs had a rank abort at exit (die of SIGABRT after saying it was done), how many failed
otherwise, and how many succeeded. A rate, not a timed test: it needs no root; `--threads` sets OMP_NUM_THREADS
(torch's default: a thread per core); run it alone (a few seconds a run).

    .venv/bin/python benchmarks/gloo_exit.py [--runs 30] [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

LAUNCHER = Path(__file__).resolve().parent.parent / "monitor" / "launcher.py"
RUN_TIMEOUT_S = 120
WORLD = 2
SCRIPT = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo", init_method="env://")
    model = DDP(torch.nn.Linear(32, 1))
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(20):
        loss = model(torch.randn(64, 32)).pow(2).mean()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    total = loss.detach().clone()  # the mean loss over the ranks, as tutorials report it: a last collective
    dist.all_reduce(total)
    print(f"rank {dist.get_rank()} done, loss {total.item() / dist.get_world_size():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""
WAYS = {"bare (python -m)": ["-m"], "launcher": [str(LAUNCHER)]}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def one_run(work: Path, start: list[str], threads: int) -> str:
    """One two-rank run: "aborted" if a rank died of SIGABRT, "failed" if one failed otherwise, else "succeeded"."""
    port = str(free_port())
    ranks = []
    for rank in range(WORLD):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "GLOO_SOCKET_IFNAME": "lo"}
        env |= {"RANK": str(rank), "WORLD_SIZE": str(WORLD), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
        env |= {"OMP_NUM_THREADS": str(threads)} if threads else {}
        argv = [sys.executable, *start, "ddp_job"]
        ranks.append(subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outcomes = []
    for process in ranks:
        try:
            output, _ = process.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
        done = b" done" in output
        if process.returncode in (-signal.SIGABRT, 128 + signal.SIGABRT) and done:
            outcomes.append("aborted")
        elif process.returncode != 0 or not done:
            outcomes.append("failed")
    return "failed" if "failed" in outcomes else "aborted" if outcomes else "succeeded"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="two-rank runs each way")
    parser.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS of each rank (0: torch's default)")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    options = parser.parse_args()
    counts = {way: Counter[str]() for way in WAYS}
    with tempfile.TemporaryDirectory(prefix="fc2-gloo-exit-") as directory:
        work = Path(directory)
        (work / "ddp_job.py").write_text(SCRIPT)
        for index in range(options.runs):
            for way, start in WAYS.items():  # alternately: both ways under the same load of the machine
                counts[way][one_run(work, start, options.threads)] += 1
            print(f"{index + 1}/{options.runs}: " + "; ".join(f"{w}: {dict(c)}" for w, c in counts.items()), flush=True)
    if options.json:
        print(json.dumps({way: dict(counts[way]) for way in WAYS}))
        return
    print(f"\n{'way':<18} {'runs':>5} {'aborted at exit':>16} {'failed otherwise':>17} {'succeeded':>10}")
    for way, count in counts.items():
        print(f"{way:<18} {options.runs:>5} {count['aborted']:>16} {count['failed']:>17} {count['succeeded']:>10}")


if __name__ == "__main__":
    main()
