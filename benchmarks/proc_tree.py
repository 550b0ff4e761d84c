"""Memory of a process and all its descendants, sampled from ``/proc`` (Linux): the peak of the summed PSS (each
shared page counted once, split between the processes that map it), and each process's own peak.

    with TreeMemory(proc.pid) as memory:
        proc.wait()
    memory.peak_mib, memory.per_process()   # {"raylet": 35.1, "ray::WorkerDict": 1510.2, ...}

Ray's daemons and workers are children of the driver that started them, so a run's tree holds every process it
made (driver, GCS, raylet, workers, reward and data-loader processes).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import defaultdict

__all__ = ["TreeMemory", "descendants", "pss_mib"]


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                out.extend(int(c) for c in f.read().split())
    except OSError:
        pass
    return out


def descendants(pid: int) -> list[int]:
    """``pid`` and every live process below it."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(_children(current))
    return found


def pss_mib(pid: int) -> float | None:
    """The process's proportional set size in MiB (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def _label(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return "?"
    if not argv:
        return "?"
    if argv[0].startswith("ray::"):  # Ray names its worker processes after the actor class
        return argv[0].split()[0]
    name = os.path.basename(argv[0])
    if name.startswith("python") and len(argv) > 1:
        script = argv[2] if argv[1] == "-m" and len(argv) > 2 else os.path.basename(argv[1])
        if "multiprocessing" in " ".join(argv):
            return "python (multiprocessing child)"
        return f"python {script}"
    return name


class TreeMemory:
    """Samples the PSS of ``root`` and its descendants in a thread, from ``__enter__`` to ``__exit__``: every
    ``interval_s``, or less often when a sample costs more than ``max_share`` of one core.

    Reading ``smaps_rollup`` walks a process's page tables: for a run of a dozen processes holding gigabytes one
    sample costs tens of milliseconds of kernel time, and sampled every 0.2 s it took 17–29% of a core from the run
    it measured (a Ray worker, at Ray's niceness 15, yields to it). So the thread runs at niceness 19 and keeps its
    CPU time to ``max_share`` of one core; ``cpu_share`` reports what it took."""

    def __init__(self, root: int, interval_s: float = 0.2, max_share: float = 0.02):
        self.root, self.interval_s, self.max_share = root, interval_s, max_share
        self.peak_mib = 0.0
        self.cpu_s, self.wall_s = 0.0, 0.0
        self._per_pid: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> float:
        """One sample: the summed PSS now (MiB); updates the peaks."""
        total = 0.0
        for pid in descendants(self.root):
            mib = pss_mib(pid)
            if mib is None:
                continue
            total += mib
            label, peak = self._per_pid.get(pid, ("", 0.0))
            if not label.startswith("ray::") or label == "ray::IDLE":  # Ray retitles a worker when it takes a task
                label = _label(pid)
            self._per_pid[pid] = (label, max(peak, mib))
        self.peak_mib = max(self.peak_mib, total)
        return total

    @property
    def cpu_share(self) -> float:
        """The sampler's CPU time over its wall time (of one core)."""
        return self.cpu_s / self.wall_s if self.wall_s else 0.0

    def _run(self) -> None:
        with contextlib.suppress(OSError):  # Linux: a thread's own niceness
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        start = time.perf_counter()
        while not self._stop.is_set():
            cpu = time.thread_time()
            self.sample()
            cost = time.thread_time() - cpu
            self.cpu_s += cost
            self._stop.wait(max(self.interval_s, cost / self.max_share - cost))
        self.wall_s = time.perf_counter() - start

    def per_process(self) -> dict[str, tuple[int, float]]:
        """``{label: (processes, summed peak MiB)}`` over every process seen, largest first (the sum of per-process
        peaks, which may exceed the tree's peak when they did not coincide)."""
        groups: dict[str, list[float]] = defaultdict(list)
        for label, peak in self._per_pid.values():
            groups[label].append(peak)
        rows = {label: (len(p), sum(p)) for label, p in groups.items()}
        return dict(sorted(rows.items(), key=lambda kv: -kv[1][1]))
