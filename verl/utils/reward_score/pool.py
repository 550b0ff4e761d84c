"""Score samples with a user's reward function so that a failing or hung call costs one sample, never the run.

:class:`RewardScorePool` runs ``fn(*args, **kwargs)`` for a list of calls and returns one :class:`ScoreResult` per
call: the value, or the traceback of what went wrong. Two modes:

- ``process`` (``num_workers >= 1``, a picklable ``fn``, POSIX): ``num_workers`` long-lived worker processes,
  started on first use as fresh interpreters (``python -c``: unlike multiprocessing's spawn they never re-import
  the caller's ``__main__``) that get the caller's ``sys.path``. A call still running after ``timeout_s`` is
  stopped by killing its process (its Python stack is dumped first with ``faulthandler``, so the report shows where
  it hung); a fresh process replaces it. A process that dies mid-call (segfault, ``os._exit``) fails only that call.
- ``thread`` (``num_workers == 0``, an ``fn`` that cannot be pickled such as a lambda, or not POSIX): each call runs
  in a daemon thread of this process; one still running after ``timeout_s`` is abandoned (it cannot be killed, but
  it no longer blocks anything, not even interpreter exit).

``timeout_s`` of None or ≤ 0 means no limit. Async functions (returning an awaitable) are awaited. A pool is used
from one thread at a time.
"""

from __future__ import annotations

import asyncio
import collections
import faulthandler
import inspect
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import verl

__all__ = ["FailureLog", "RewardScorePool", "ScoreResult", "call_score_fn"]

logger = logging.getLogger(__name__)

Call = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass
class ScoreResult:
    """What one call gave: ``value``, or ``error`` (a traceback text); ``timed_out`` when it ran past the limit."""

    value: Any = None
    error: str | None = None
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


def call_score_fn(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``fn(*args, **kwargs)``, awaited when it returns an awaitable (``async def compute_score``)."""
    value = fn(*args, **kwargs)
    if inspect.isawaitable(value):

        async def _wait() -> Any:
            return await value

        value = asyncio.run(_wait())
    return value


def _worker_main(conn: Any, payload: bytes, dump_path: str | None) -> None:
    """Body of a scoring process: load ``fn``, then answer ``(task_id, args, kwargs)`` messages until told to stop."""
    if dump_path is not None and hasattr(signal, "SIGUSR1"):
        dump_file = open(dump_path, "w")  # noqa: SIM115 - stays open for faulthandler until the process ends
        faulthandler.register(signal.SIGUSR1, file=dump_file, all_threads=False)
    try:
        fn = pickle.loads(payload)
    except BaseException:
        conn.send(("init_error", None, traceback.format_exc()))
        return
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the parent went away
            return
        if message is None:
            return
        task_id, args, kwargs = message
        try:
            reply = ("ok", task_id, call_score_fn(fn, args, kwargs))
        except BaseException:  # the user's function may raise anything, SystemExit included
            reply = ("error", task_id, traceback.format_exc())
        try:
            conn.send(reply)
        except Exception:
            conn.send(("error", task_id, "the result could not be sent back:\n" + traceback.format_exc()))


def _exit_when_orphaned(parent_pid: int) -> None:
    """Watchdog thread of a scoring process: exit once the parent is gone, even if a call hangs."""
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(1)


def _worker_entry() -> None:
    """Entry point of a scoring process: ``python -c ... <connection fd> <stack dump path>``.

    A fresh interpreter (not ``multiprocessing`` spawn), so the parent's ``__main__`` is never re-imported.
    """
    conn = multiprocessing.connection.Connection(int(sys.argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it stops us
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()
    parent_sys_path, payload = conn.recv()
    sys.path.extend(p for p in parent_sys_path if p not in sys.path)  # modules the parent can import
    _worker_main(conn, payload, sys.argv[2])


_VERL_PARENT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(verl.__file__)))  # importable in the child
_ENTRY = "from verl.utils.reward_score.pool import _worker_entry; _worker_entry()"


class _Worker:
    """One scoring process, its pipe, and the call it is running."""

    def __init__(self, payload: bytes, dump_dir: str):
        self.dump_path = os.path.join(dump_dir, f"{uuid.uuid4().hex}.stack")
        self.conn, child_conn = multiprocessing.Pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_VERL_PARENT_DIR, env.get("PYTHONPATH")) if p)
        fd = child_conn.fileno()
        self.process = subprocess.Popen(
            [sys.executable, "-c", _ENTRY, str(fd), self.dump_path],
            pass_fds=(fd,),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        child_conn.close()
        self.conn.send((list(sys.path), payload))
        self.task: int | None = None
        self.deadline = float("inf")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stack_dump(self) -> str:
        """Ask the process to write its Python stack (SIGUSR1 → faulthandler) and return what it wrote."""
        if not hasattr(signal, "SIGUSR1") or not self.alive():
            return ""
        try:
            os.kill(self.process.pid, signal.SIGUSR1)
        except OSError:
            return ""
        text, deadline = "", time.monotonic() + 2.0
        while time.monotonic() < deadline:
            time.sleep(0.05)
            try:
                with open(self.dump_path) as f:
                    current = f.read()
            except OSError:
                current = ""
            if current and current == text:  # complete: unchanged since the last look
                break
            text = current
        return text

    def kill(self) -> None:
        if self.alive():
            self.process.kill()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            logger.warning("scoring process %d did not exit after SIGKILL", self.process.pid)
        self.conn.close()

    def stop(self) -> None:
        """Ask an idle process to exit; kill it if it does not."""
        try:
            self.conn.send(None)
            self.process.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


def _stop_all(workers: list[_Worker]) -> None:
    """Stop idle processes politely and kill busy ones; empties ``workers``."""
    for worker in workers:
        if worker.task is None:
            worker.stop()
        else:
            worker.kill()
    workers.clear()


def _shutdown(workers: list[_Worker], dump_dir: str) -> None:
    _stop_all(workers)
    if dump_dir:
        shutil.rmtree(dump_dir, ignore_errors=True)


class RewardScorePool:
    """Runs ``fn`` over many calls with a per-call timeout (see the module docstring for the two modes)."""

    def __init__(self, fn: Callable[..., Any], num_workers: int = 1, timeout_s: float | None = 30.0):
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"reward.num_workers={num_workers!r} must be an integer >= 0 (0: score in threads)")
        if timeout_s is not None and not isinstance(timeout_s, (int, float)):
            raise ValueError(f"reward.timeout_s={timeout_s!r} must be a number of seconds or null")
        self.fn = fn
        self.num_workers = num_workers
        self.timeout_s = float(timeout_s) if timeout_s is not None and timeout_s > 0 else None
        self._payload: bytes | None = None
        if num_workers > 0 and os.name == "posix":
            try:
                self._payload = pickle.dumps(fn)
            except Exception as e:
                logger.warning(
                    "reward function %r cannot be sent to a scoring process (%s: %s); scoring in threads of this "
                    "process instead (define it at module level, or use reward.custom_reward_function.path)",
                    fn,
                    type(e).__name__,
                    e,
                )
        self.mode = "process" if self._payload is not None else "thread"
        self._workers: list[_Worker] = []
        self._idle_deaths = 0  # processes found dead before taking a call, since the last result
        self._dump_dir = tempfile.mkdtemp(prefix="verl-reward-") if self.mode == "process" else ""
        self._finalizer = weakref.finalize(self, _shutdown, self._workers, self._dump_dir)

    def close(self) -> None:
        """Stop the worker processes (idempotent); the pool restarts them if used again."""
        _stop_all(self._workers)

    def __enter__(self) -> RewardScorePool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def run(self, calls: Sequence[Call]) -> list[ScoreResult]:
        """One :class:`ScoreResult` per ``(args, kwargs)`` call, in order."""
        if self.mode == "thread":
            return [self._run_in_thread(args, kwargs) for args, kwargs in calls]
        return self._run_in_processes(calls)

    # -- thread mode ------------------------------------------------------------------------------------------------
    def _run_in_thread(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ScoreResult:
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = call_score_fn(self.fn, args, kwargs)
            except BaseException:
                box["error"] = traceback.format_exc()

        thread = threading.Thread(target=target, name="verl-reward-score", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():
            frame = sys._current_frames().get(thread.ident)  # type: ignore[arg-type]
            stack = "".join(traceback.format_stack(frame)) if frame is not None else ""
            return ScoreResult(
                error=f"timed out after {self.timeout_s:g} s (thread abandoned); stack:\n{stack}", timed_out=True
            )
        if "error" in box:
            return ScoreResult(error=box["error"])
        return ScoreResult(value=box.get("value"))

    # -- process mode -----------------------------------------------------------------------------------------------
    def _new_worker(self) -> _Worker:
        assert self._payload is not None
        return _Worker(self._payload, self._dump_dir)

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers[self._workers.index(worker)] = self._new_worker()

    def _run_in_processes(self, calls: Sequence[Call]) -> list[ScoreResult]:
        while len(self._workers) < self.num_workers:
            self._workers.append(self._new_worker())
        results: list[ScoreResult | None] = [None] * len(calls)
        queue = collections.deque(range(len(calls)))
        while queue or any(w.task is not None for w in self._workers):
            for worker in list(self._workers):
                if worker.task is None and queue:
                    self._dispatch(worker, queue, calls, results)
            busy = [w for w in self._workers if w.task is not None]
            if not busy:
                continue
            wait_s = None
            if self.timeout_s is not None:
                wait_s = max(0.0, min(w.deadline for w in busy) - time.monotonic())
            ready = multiprocessing.connection.wait([w.conn for w in busy], timeout=wait_s)
            for worker in busy:
                self._collect(worker, ready, results)
        return [r if r is not None else ScoreResult(error="internal error: no result") for r in results]

    def _dispatch(self, worker: _Worker, queue: collections.deque, calls: Sequence[Call], results: list) -> None:
        if not worker.alive():  # died while idle (or right after its last reply)
            self._raise_if_init_error(worker)
            self._idle_deaths += 1
            if self._idle_deaths > 3 * self.num_workers:
                self.close()
                raise RuntimeError(f"scoring processes for {self.fn!r} keep exiting before they take a call")
            self._replace(worker)
            return
        index = queue.popleft()
        args, kwargs = calls[index]
        try:
            worker.conn.send((index, tuple(args), dict(kwargs)))
        except (pickle.PicklingError, TypeError, AttributeError):
            results[index] = ScoreResult(error="the call's arguments cannot be pickled:\n" + traceback.format_exc())
            return
        except OSError:  # the idle process is gone: replace it and retry the call
            queue.appendleft(index)
            self._replace(worker)
            return
        worker.task = index
        worker.deadline = time.monotonic() + self.timeout_s if self.timeout_s is not None else float("inf")

    def _raise_init_error(self, details: str) -> None:
        self.close()
        raise RuntimeError(f"the reward function {self.fn!r} cannot be loaded in a scoring process:\n{details}")

    def _raise_if_init_error(self, worker: _Worker) -> None:
        try:
            if worker.conn.poll():
                kind, _, payload = worker.conn.recv()
                if kind == "init_error":
                    self._raise_init_error(payload)
        except (EOFError, OSError):
            pass

    def _collect(self, worker: _Worker, ready: list, results: list) -> None:
        index = worker.task
        if worker.conn in ready or worker.conn.poll():
            try:
                kind, _, payload = worker.conn.recv()
            except (EOFError, OSError):
                kind, payload = "died", None
            if kind == "init_error":
                self._raise_init_error(payload)
            if kind != "died":
                self._idle_deaths = 0
                results[index] = ScoreResult(value=payload) if kind == "ok" else ScoreResult(error=payload)
                worker.task = None
                return
        elif time.monotonic() < worker.deadline:
            return  # still running, within its time
        if worker.alive() and time.monotonic() >= worker.deadline:
            stack = worker.stack_dump()
            results[index] = ScoreResult(
                error=f"timed out after {self.timeout_s:g} s (process killed); stack:\n{stack}", timed_out=True
            )
        else:
            try:
                code = worker.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            results[index] = ScoreResult(error=f"the scoring process died during the call (exit code {code})")
        worker.task = None
        self._replace(worker)


class FailureLog:
    """Logs each distinct failure (exception type and where it was raised) once, with its traceback."""

    def __init__(self, log: logging.Logger | None = None):
        self._seen: set[tuple[str, str]] = set()
        self._log = log or logger

    @staticmethod
    def signature(result: ScoreResult) -> tuple[str, str]:
        lines = (result.error or "").strip().splitlines()
        where = next((ln.strip() for ln in reversed(lines) if ln.strip().startswith("File ")), "")
        kind = "timeout" if result.timed_out else (lines[-1].split(":")[0] if lines else "")
        return kind, where

    def report(self, result: ScoreResult, context: str) -> bool:
        """Log ``result``'s failure unless one like it was logged before; True when it was logged now."""
        key = self.signature(result)
        if key in self._seen:
            self._log.debug("reward failure again (%s): %s", context, key)
            return False
        self._seen.add(key)
        what = "timed out" if result.timed_out else "failed"
        self._log.warning(
            "reward function %s for %s; the sample scores 0 (counted in reward/%s_count; further failures like this "
            "one are not logged):\n%s",
            what,
            context,
            "timeout" if result.timed_out else "error",
            result.error,
        )
        return True
