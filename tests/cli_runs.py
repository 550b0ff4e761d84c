"""The suite's CLI runs: one registry, one scheduler, one shared Ray cluster, one budget.

An end-to-end test reads the output, file-logger records and folder of a real command-line run (``python -m
verl.trainer.main_ppo``, a recipe's main, ...). Most of such a run is start-up, which overlaps well across runs,
so runs are not started by the tests that read them:

- a run is **declared once**, in the test module that reads it: ``@cli_run("name", cost_s=...)`` on a function
  that prepares its folder (files it needs) and returns its overrides and environment (`Prepared`);
- a test **names the runs it reads** with ``@needs("name", ...)`` and gets them from the ``cli_runs`` fixture
  (``cli_runs["name"]`` waits for that run only; asking for a run the test did not name is an error);
- the **scheduler** starts, at the beginning of the session, every run that a selected test needs (and the runs
  those depend on, ``after=``), `PARALLEL_RUNS` at a time, the costliest first — a run a test is waiting for jumps
  the queue —, while the other tests go on; it kills a run that outlives `TIMEOUT_S`;
- runs share **one Ray cluster** (``ray start --head`` of this session, `SHARED_CLUSTER_CPUS` logical CPUs): a run
  connects to it through ``RAY_ADDRESS`` instead of starting its own (~3 s and ~400 MB each). A run that must own
  its cluster says why (``own_cluster="..."``);
- the **budget**: `RUN_BUDGET` CLI runs per session, counted here (scheduled runs and `run_main` calls alike);
  ``tests/conftest.py`` fails the session past it and prints every run with its wall time.

How to add a test without adding a run: add assertions to a test that already reads a run whose configuration
shows the behaviour, or add an override to an existing run when it changes nothing the other tests of that run
assert (see docs/testing.md).
"""

from __future__ import annotations

import contextlib
import heapq
import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple

import pytest

TIMEOUT_S = 600  # one run
PARALLEL_RUNS = 3
# A test waits for its runs, which may queue behind others: more than the ini's 300 s per test.
WAIT_TIMEOUT_S = 1800
POOL_TIMEOUT_S = WAIT_TIMEOUT_S  # the older name
SHARED_CLUSTER_CPUS = 32  # logical: bundles of {"CPU": 1} for the runs that share the cluster at once
# CLI runs one session may start (scheduled and `run_main` alike); tests/conftest.py fails the session past it.
RUN_BUDGET = 70
ROOT = Path(__file__).resolve().parents[1]


class Prepared(NamedTuple):
    """What a run's preparation returns: its command-line overrides, extra environment variables (None: unset
    one), the module it runs (``python -m <module>``), and what to call once it ended (e.g. stop the Ray nodes
    it was given). With ``argv``, the run is that command line instead (overrides and module unused)."""

    overrides: list[str]
    env: dict[str, str | None]
    module: str = "verl.trainer.main_ppo"
    cleanup: Callable[[], None] | None = None
    argv: list[str] | None = None  # another command line (a script): run as given, with the runs' environment


class MainRun(NamedTuple):
    """A finished run: exit code, stdout and stderr together, the file logger's records, and its folder."""

    returncode: int
    output: str
    records: list
    work: Path


@dataclass(frozen=True)
class RunSpec:
    """A declared run. ``prepare(work)`` (or ``prepare(work, deps)`` with ``after``: ``deps`` maps each of those
    runs to its `MainRun`) writes what the run needs into ``work`` and returns a `Prepared` (or a plain
    ``(overrides, env)`` pair). ``cost_s``: its wall time on an idle 2-core machine (the scheduler starts the
    costliest first). ``own_cluster``: why it cannot share the session's Ray cluster ("" when it can)."""

    name: str
    prepare: Callable[..., Any]
    cost_s: float
    after: tuple[str, ...] = ()
    own_cluster: str = ""


REGISTRY: dict[str, RunSpec] = {}
# every CLI run this session started: (name, wall seconds or None while running, cluster)
STARTED: list[list[Any]] = []
_started_lock = threading.Lock()


def cli_run(
    name: str, *, cost_s: float, after: tuple[str, ...] = (), own_cluster: str = ""
) -> Callable[[Callable], Callable]:
    """Declare the run ``name`` (see `RunSpec`); a name is declared once."""

    def register(prepare: Callable) -> Callable:
        known = REGISTRY.get(name)
        # pytest imports a test module by its file name, other modules import it as tests.<...>: the same code
        # twice is one declaration
        if known is not None and _where(known.prepare) != _where(prepare):
            raise ValueError(f"the CLI run {name!r} is declared twice: {_where(known.prepare)}, {_where(prepare)}")
        REGISTRY[name] = RunSpec(name, prepare, cost_s, tuple(after), own_cluster)
        return prepare

    return register


def _where(fn: Callable) -> tuple[str, int]:
    code = fn.__code__
    return code.co_filename, code.co_firstlineno


def needs(*names: str) -> Callable:
    """Mark a test as reading these runs from the ``cli_runs`` fixture."""

    def mark(test: Callable) -> Callable:
        test.cli_runs_needed = names
        return pytest.mark.timeout(WAIT_TIMEOUT_S)(test)

    return mark


def needed_by(item: Any) -> tuple[str, ...]:
    """The runs a collected test item declared with `needs`."""
    return getattr(getattr(item, "function", None), "cli_runs_needed", ())


def _count(name: str, cluster: str) -> list[Any]:
    entry = [name, None, cluster]
    with _started_lock:
        STARTED.append(entry)
    return entry


# ------------------------------------------------------------------------------------------- one run, its command
def main_command(tmp_path: Path, *overrides: str, name: str = "run", env: dict | None = None, module: str = ""):
    """``(argv, environment, jsonl path)`` of a CLI run with the file logger into ``tmp_path``."""
    log = tmp_path / f"{name}.jsonl"
    environ = dict(os.environ)
    environ.update(
        VERL_FILE_LOGGER_PATH=str(log),
        VERL_CACHE_DIR=str(tmp_path.parent / "verl_cache"),
        RAY_AUTH_MODE="disabled",
        HYDRA_FULL_ERROR="1",
    )
    environ.update(env or {})
    environ = {key: value for key, value in environ.items() if value is not None}  # None: unset it
    args = [
        sys.executable,
        "-m",
        module or "verl.trainer.main_ppo",
        "trainer.logger=[console,file]",
        f"hydra.run.dir={tmp_path / 'hydra'}",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        *overrides,
    ]
    return args, environ, log


def read_records(log: Path) -> list:
    """The file logger's records (none when the run never logged)."""
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def run_main(tmp_path: Path, *overrides: str, name: str = "run", env: dict | None = None) -> tuple[int, str, list]:
    """Run the CLI now, in this thread, on a Ray cluster of its own (counted in the budget); returns (exit code,
    output, the jsonl records). For the runs that cannot be scheduled: one that fails before Ray, one of the
    vllm venv."""
    args, environ, log = main_command(tmp_path, *overrides, name=name, env=env)
    entry, start = _count(f"{tmp_path.name}/{name}", "own"), time.monotonic()
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S, env=environ, cwd=tmp_path)
    finally:
        entry[1] = time.monotonic() - start
    return proc.returncode, proc.stdout + proc.stderr, read_records(log)


def run_command(argv: list[str], cwd: Path, env: dict | None = None, timeout: float = TIMEOUT_S):
    """Run another command line now (a script, another entry point), counted in the budget like `run_main`;
    returns the finished ``subprocess.CompletedProcess`` (text output captured)."""
    environ = {**os.environ, "RAY_AUTH_MODE": "disabled", "VERL_CACHE_DIR": str(cwd.parent / "verl_cache")}
    environ.update(env or {})
    environ = {key: value for key, value in environ.items() if value is not None}
    cwd.mkdir(parents=True, exist_ok=True)
    entry, start = _count(f"{cwd.name}/{Path(argv[1] if len(argv) > 1 else argv[0]).name}", "own"), time.monotonic()
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=environ, cwd=cwd)
    finally:
        entry[1] = time.monotonic() - start


class Cli:
    """What the ``cli`` fixture gives a test that runs a command line itself: ``cli(tmp_path, *overrides)`` is
    `run_main`, ``cli.command(argv, cwd)`` is `run_command`."""

    __call__ = staticmethod(run_main)
    command = staticmethod(run_command)


# ------------------------------------------------------------------------------------------------ the cluster
class SharedCluster:
    """``ray start --head --block`` in a session of its own (stopped by its process group, never ``ray stop``),
    started on first use; its workers compute with the suite's ``OMP_NUM_THREADS`` and no idle workers are
    prestarted for each driver that connects."""

    def __init__(self, tmp_path_factory: Any) -> None:
        self._factory = tmp_path_factory
        self.proc: subprocess.Popen | None = None
        self.address = ""

    def start(self) -> str:
        if self.proc is not None:
            return self.address
        from tests.trainer.ray_nodes import free_port, wait_for_nodes

        self.work = self._factory.mktemp("shared_ray")

        port = free_port()
        temp = Path(tempfile.mkdtemp(prefix="rs", dir="/tmp"))  # short: Unix socket paths stay under ~107 chars
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_prestart_worker_first_driver": "0"}
        env.pop("RAY_ADDRESS", None)
        args = [
            str(Path(sys.executable).with_name("ray")),
            "start",
            "--block",
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            f"--num-cpus={SHARED_CLUSTER_CPUS}",
            "--include-dashboard=false",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--temp-dir={temp}",
        ]
        with open(self.work / "ray_head.log", "w") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.address = f"127.0.0.1:{port}"
        wait_for_nodes(self.address, 1, [self.proc], self.work)
        return self.address

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def job_environment(environ: dict[str, str]) -> dict[str, str]:
    """What a run's driver needs so that its Ray workers on the shared cluster see the run's environment, as they
    would on a cluster of its own (whose workers inherit the driver's): the variables the run sets or changes,
    given to Ray as the job's runtime env (the way ``ray job submit`` hands one to its entrypoint), merged under
    what ``ray.init`` and each actor pass themselves."""
    changed = {k: v for k, v in environ.items() if os.environ.get(k) != v and not k.startswith("RAY_")}
    return {
        "RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"runtime_env": {"env_vars": changed}}),
        "RAY_OVERRIDE_JOB_RUNTIME_ENV": "1",
    }


# ------------------------------------------------------------------------------------------------ the scheduler
class _Running(NamedTuple):
    proc: subprocess.Popen
    out: IO[str]
    log: Path
    work: Path
    start: float
    entry: list
    cleanup: Callable[[], None] | None

    def end(self) -> None:
        """Kill the run if it still runs, close its output, and clean up after it."""
        if self.proc.poll() is None:
            _kill(self.proc)
        self.out.close()
        if self.cleanup is not None:
            self.cleanup()


class Scheduler:
    """Runs the wanted runs (and their ``after`` runs) in a background thread; `result` waits for one."""

    def __init__(self, wanted: set[str], tmp_path_factory: Any) -> None:
        unknown = sorted(wanted - set(REGISTRY))
        if unknown:
            raise KeyError(f"tests need CLI runs nobody declared: {unknown}")
        closure, stack = set(), list(wanted)
        while stack:
            name = stack.pop()
            if name not in closure:
                closure.add(name)
                stack.extend(REGISTRY[name].after)
        self.futures: dict[str, Future] = {name: Future() for name in closure}
        self.ended: dict[str, float] = {}  # when each run was seen to end (time.monotonic(), to within 0.2 s)
        self._factory = tmp_path_factory
        self._urgent: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.cluster = SharedCluster(tmp_path_factory)
        self._thread = threading.Thread(target=self._loop, name="cli-runs", daemon=True)
        if closure:
            self._thread.start()

    def result(self, name: str, timeout: float = WAIT_TIMEOUT_S) -> MainRun:
        """The finished run ``name`` (it starts next if it has not started yet); a preparation that raised raises
        again here, for the tests of this run only."""
        future = self.futures[name]
        if not future.done():
            with self._lock:
                self._urgent.append(name)
        return future.result(timeout=timeout)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self.cluster.stop()

    # -------------------------------------------------------------------------------------------- the loop
    def _next(self, pending: set[str]) -> str | None:
        ready = [n for n in pending if all(self.futures[d].done() for d in REGISTRY[n].after)]
        if not ready:
            return None
        with self._lock:
            for name in self._urgent:
                wanted = [name]
                while wanted:  # the urgent run, or the first of its dependencies that can start
                    current = wanted.pop()
                    if current in ready:
                        return current
                    wanted.extend(d for d in REGISTRY.get(current, RunSpec("", print, 0)).after if d in pending)
        return heapq.nlargest(1, ready, key=lambda n: (REGISTRY[n].cost_s, n))[0]

    def _loop(self) -> None:
        pending, running = set(self.futures), {}
        try:
            self._prepare_session()
            while (pending or running) and not self._stop.is_set():
                while len(running) < PARALLEL_RUNS:
                    name = self._next(pending)
                    if name is None:
                        break
                    pending.discard(name)
                    try:
                        running[name] = self._start(REGISTRY[name])
                    except Exception as error:  # fails the tests of this run only
                        self.futures[name].set_exception(RuntimeError(f"preparing the CLI run {name!r} failed"))
                        self.futures[name].exception().__cause__ = error
                time.sleep(0.2)
                for name, run in list(running.items()):
                    if self._collect(name, run):
                        del running[name]
        finally:  # interrupted: no run outlives the scheduler
            for name, run in running.items():
                run.end()
                if not self.futures[name].done():
                    self.futures[name].set_exception(RuntimeError(f"the CLI run {name!r} was stopped"))
            for name in pending:
                if not self.futures[name].done():
                    self.futures[name].set_exception(RuntimeError(f"the CLI run {name!r} never started"))

    def _prepare_session(self) -> None:
        """Build the demo's assets once, in the cache every run shares, before several runs would race to."""
        in_subprocess(
            "import sys; from verl.utils.demo import ensure_demo_assets; ensure_demo_assets(sys.argv[1])",
            self._factory.getbasetemp() / "verl_cache",
        )

    def _start(self, spec: RunSpec) -> _Running:
        work = self._factory.mktemp(spec.name)
        deps = {d: self.futures[d].result() for d in spec.after}
        arity = len(inspect.signature(spec.prepare).parameters)
        prepared = spec.prepare(work, deps) if arity >= 2 else spec.prepare(work)
        prepared = Prepared(*prepared)
        env = dict(prepared.env)
        if not spec.own_cluster and "RAY_ADDRESS" not in env:
            env["RAY_ADDRESS"] = self.cluster.start()
        elif spec.own_cluster:
            env.setdefault("RAY_ADDRESS", None)
        args, environ, log = main_command(work, *prepared.overrides, env=env, module=prepared.module)
        if prepared.argv is not None:
            args = list(prepared.argv)
        if environ.get("RAY_ADDRESS"):  # a cluster started by this session: its workers do not inherit our env
            environ.update(job_environment(environ))
        out = open(work / "output.log", "w+")  # noqa: SIM115 - closed when the run is collected
        proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env=environ, cwd=work, start_new_session=True
        )
        entry = _count(spec.name, "own" if spec.own_cluster else "shared")
        return _Running(proc, out, log, work, time.monotonic(), entry, prepared.cleanup)

    def _collect(self, name: str, run: _Running) -> bool:
        elapsed = time.monotonic() - run.start
        if run.proc.poll() is None and elapsed < TIMEOUT_S and not self._stop.is_set():
            return False
        if run.proc.returncode is None:
            _kill(run.proc)
            run.out.seek(0, os.SEEK_END)
            run.out.write(f"\n[cli_runs] killed after {elapsed:.0f} s\n")
        run.out.seek(0)
        self.ended[name] = time.monotonic()
        run.entry[1] = elapsed
        result = MainRun(run.proc.returncode, run.out.read(), read_records(run.log), run.work)
        run.end()
        self.futures[name].set_result(result)
        return True


def in_subprocess(code: str, *args: Any) -> None:
    """Run ``code`` in a fresh interpreter (``sys.argv[1:]`` = ``args``). Preparations run in the scheduler's
    thread, beside the tests of this process: anything that builds a model there would draw on torch's global RNG
    (one per process, not per thread) between a test's seed and its model's init, so they build in a subprocess."""
    done = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT
    )
    if done.returncode != 0:
        raise RuntimeError(f"preparing in a subprocess failed ({done.returncode}):\n{done.stderr[-3000:]}")


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


class RunView(Mapping):
    """The runs one test declared, by name (each waits for its run); ``ended``: when each finished run ended."""

    def __init__(self, scheduler: Scheduler, names: tuple[str, ...]) -> None:
        self._scheduler, self._names = scheduler, names

    def __getitem__(self, name: str) -> MainRun:
        if name not in self._names:
            raise KeyError(f"the test reads the CLI run {name!r} without naming it in @needs(...): {self._names}")
        return self._scheduler.result(name)

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    @property
    def ended(self) -> dict[str, float]:
        return self._scheduler.ended


def summary() -> tuple[int, list[str]]:
    """(runs started, one line per run: name, cluster, wall seconds), costliest first."""
    with _started_lock:
        rows = sorted(STARTED, key=lambda e: -(e[1] or 0))
    return len(rows), [
        f"{name:32s} {cluster:6s} {'running' if s is None else f'{s:6.1f} s'}" for name, s, cluster in rows
    ]
