"""Lost workers and cancel on the local provider: seconds from a Celery worker's SIGKILL (inside each step) to the job
moving on and to its end, cancel's response time and how soon the cluster is gone after, and a PS job's time in
`collecting`.

The figures come from the scenarios tests/test_faults.py checks (real TensorFlow jobs, one mirrored worker, a lease of
3 s, the sweep every 0.5 s): this runs them, with the filesystem broker and, when a Redis answers at --redis-url, with
Redis, in a scratch FC2_VAR_DIR (nothing of the developer's var/ is touched), and prints what they measured:

    .venv/bin/python benchmarks/worker_loss.py [--brokers filesystem,redis] [--redis-url redis://127.0.0.1:6379/15]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent


def run(broker: str, redis_url: str) -> list[str]:
    env = {**os.environ, "FC2_VAR_DIR": tempfile.mkdtemp(prefix="fc2-worker-loss-")}
    env.pop("REDIS_URL", None)
    if broker == "redis":
        env["REDIS_URL"] = redis_url
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider", "tests/test_faults.py"],
        cwd=PROJECT_DIR, env=env, capture_output=True, text=True,
    )  # fmt: skip
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "no output"
    figures = [line.removeprefix("FIGURE ") for line in result.stdout.splitlines() if line.startswith("FIGURE ")]
    return [*figures, f"tests: {summary}"]


def redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", default="filesystem,redis")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/15")
    args = parser.parse_args()
    for broker in args.brokers.split(","):
        if broker == "redis" and not redis_answers(args.redis_url):
            print(f"\n== redis: skipped, nothing answers at {args.redis_url}")
            continue
        print(f"\n== {broker} broker", flush=True)
        for line in run(broker, args.redis_url):
            print("  " + re.sub(r"\s+", " ", line), flush=True)


if __name__ == "__main__":
    main()
