"""Two Ray nodes on one machine, as the multi-node tests need them: a head whose node offers the custom resource
``train_pool`` and a second raylet that offers ``rollout_pool``, one logical CPU each, every port of their own and
short temp folders (Unix socket paths must stay under ~107 characters). Each ``ray start --block`` runs in a session
of its own and is stopped by its process group — never ``ray stop``, which ends every Ray process on the machine
(the other tests' clusters too).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

START_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_start(args: list[str], log: Path) -> subprocess.Popen:
    ray = Path(sys.executable).with_name("ray")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    with open(log, "w") as out:
        return subprocess.Popen(
            [str(ray), "start", "--block", "--node-ip-address=127.0.0.1", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen) -> None:
    """End a node: its ``ray start`` and everything it started (GCS, raylet, workers) share its process group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _nodes(address: str) -> int:
    """How many alive nodes the cluster at ``address`` has (asked from a child process, which leaves no Ray state
    in this one)."""
    code = "import ray; ray.init(address=%r, log_to_driver=False); print(sum(n['Alive'] for n in ray.nodes()))"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    out = subprocess.run(
        [sys.executable, "-c", code % address], capture_output=True, text=True, timeout=60, env=env, check=True
    )
    return int(out.stdout.strip().splitlines()[-1])


def wait_for_nodes(address: str, count: int, started: list[subprocess.Popen], work: Path) -> None:
    """Wait until the cluster at ``address`` has ``count`` alive nodes; an exited ``ray start`` of ``started`` or
    `START_TIMEOUT_S` is an error naming the logs in ``work``."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if any(p.poll() is not None for p in started):
            raise RuntimeError(f"ray start exited early; see the ray_*.log files in {work}")
        with contextlib.suppress(subprocess.SubprocessError, ValueError, IndexError):
            if _nodes(address) == count:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} Ray node(s) did not come up within {START_TIMEOUT_S} s; see {work}")
        time.sleep(1)


@contextlib.contextmanager
def two_nodes(work: Path) -> Iterator[str]:
    """Start the head (``train_pool``) and the second node (``rollout_pool``); yields the cluster's address."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    temp = Path(tempfile.mkdtemp(prefix="rn", dir="/tmp"))  # short: /tmp/rnXXXXXXXX/{h,w}
    started: list[subprocess.Popen] = []
    try:
        started.append(
            _ray_start(
                [
                    "--head",
                    f"--port={port}",
                    "--num-cpus=1",
                    f"--resources={json.dumps({'train_pool': 1})}",
                    "--include-dashboard=false",
                    f"--ray-client-server-port={free_port()}",
                    f"--dashboard-agent-listen-port={free_port()}",
                    f"--temp-dir={temp / 'h'}",
                ],
                work / "ray_head.log",
            )
        )
        wait_for_nodes(address, 1, started, work)  # the head is up before the second node joins it
        started.append(
            _ray_start(
                [
                    f"--address={address}",
                    "--num-cpus=1",
                    f"--resources={json.dumps({'rollout_pool': 1})}",
                    f"--dashboard-agent-listen-port={free_port()}",
                    f"--temp-dir={temp / 'w'}",
                ],
                work / "ray_worker.log",
            )
        )
        wait_for_nodes(address, 2, started, work)
        yield address
    finally:
        for proc in reversed(started):
            _stop(proc)
