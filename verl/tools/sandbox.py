"""Run model-written Python code in an isolated child process.

Each :meth:`PythonSandbox.run` starts ``unshare`` (new network, pid, mount, IPC and UTS namespaces) running
:mod:`verl.tools.sandbox_launcher` (``python -I -S -c <its source>``) as pid 1 of the new pid namespace. It mounts a
size-limited tmpfs as the new root, bind-mounts read-only (nosuid, nodev) only ``/usr``, ``/lib*``, ``/bin``,
``sys.base_prefix`` and ``/dev/{null,zero,urandom}``, chroots into it and forks the program, which sets rlimits,
drops every capability (as host root it also becomes a fresh unprivileged uid, so RLIMIT_NPROC counts this run only)
and execs
``python -I -S -B /work/main.py <run id>``. The launcher reports on a dedicated pipe: a set-up failure (the run then
raises :class:`SandboxUnavailableError`: code never runs unisolated), readiness, and the program's exit status. When
pid 1 exits the kernel kills whatever is left in the namespace. The parent caps stdout/stderr, enforces the wall time
and kills the process group on overflow or timeout. The code gets the standard library only (no site-packages).

Not covered: no seccomp filter (the whole kernel syscall surface is reachable), no cgroup (memory and CPU limits are
per process, so a run may use up to ``max_processes`` times them, and it competes with the trainer for CPU).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import math
import os
import secrets
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

from verl.tools.base_tool import ToolUnavailableError
from verl.tools.sandbox_launcher import SETUP_FAILED

__all__ = ["PythonSandbox", "SandboxLimits", "SandboxResult", "SandboxUnavailableError"]

logger = logging.getLogger(__name__)

# after a run is killed for its output, how long its pipes and exit may take before it is killed and reaped again
REAP_GRACE_S = 5.0
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/work", "PYTHONDONTWRITEBYTECODE": "1"}
_UID_BASE, _UID_SPAN, _NOBODY = 0x70000000, 1 << 24, 65534  # per-run uids: RLIMIT_NPROC then counts one run only
_PROBE = """import ctypes, json, os, socket
def attempt(action):
    try:
        action()
        return "allowed"
    except OSError:
        return "denied"
print(json.dumps({"pid": os.getpid(), "ifaces": [n for _, n in socket.if_nameindex()], "host_file": os.path.exists(%r),
    "connect": attempt(lambda: socket.create_connection(("127.0.0.1", 9), timeout=1)),
    "chroot": attempt(lambda: os.chroot("/")), "root": sorted(os.listdir("/")),
    "userns": ctypes.CDLL(None).unshare(0x10000000) == 0}))
"""


class SandboxUnavailableError(ToolUnavailableError):
    """Isolation cannot be set up; the sandbox refuses to run code without it (the tool agent loop stops the run)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run resource limits (all positive; ``wall_seconds`` may be fractional)."""

    cpu_seconds: int = 5
    wall_seconds: float = 10
    memory_mb: int = 256  # RLIMIT_AS
    output_bytes: int = 8192  # stdout and stderr, each
    max_processes: int = 16  # RLIMIT_NPROC
    max_file_mb: int = 16  # RLIMIT_FSIZE
    tmpfs_mb: int = 64  # the whole writable file system (/work and /tmp)

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = getattr(self, spec.name)
            integral = spec.name != "wall_seconds"
            kinds = int if integral else (int, float)
            if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) or value <= 0:
                kind = "integer" if integral else "number"
                raise ValueError(f"SandboxLimits.{spec.name} must be a positive {kind}, got {value!r}")


@dataclass
class SandboxResult:
    """What one run produced; ``run_id`` (in the program's argv) and ``host_dir`` (the removed host temp dir) are
    there for diagnostics."""

    stdout: str
    stderr: str
    exit_code: int | None
    signal: str | None
    timed_out: bool
    output_truncated: bool
    error: str | None
    run_id: str = ""
    host_dir: str = ""

    def to_text(self) -> str:
        """The text the model sees: stdout, stderr, then ``[error: ...]`` when there is one."""
        parts = [text.rstrip("\n") for text in (self.stdout, self.stderr) if text]
        if self.error:
            parts.append(f"[error: {self.error}]")
        return "\n".join(parts) or "[no output]"


class PythonSandbox:
    """Runs Python code under namespace isolation and rlimits; see the module docstring."""

    _verified: ClassVar[set[tuple[type, str]]] = set()

    def __init__(self, limits: SandboxLimits, unshare_path: str = "unshare") -> None:
        self.limits = limits
        self.unshare_path = unshare_path
        self.python = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)

    def check(self) -> None:
        """Probe once per (class, unshare_path) that isolation really works; raises SandboxUnavailableError."""
        key = (type(self), self.unshare_path)
        if key in self._verified:
            return
        host_file = os.path.realpath(__file__)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # works whether or not an event loop is running
            result = pool.submit(asyncio.run, self.run(_PROBE % host_file)).result()
        problem = _probe_problem(result, host_file)
        if problem:
            raise SandboxUnavailableError(f"sandbox isolation check failed: {problem}; refusing to run code")
        self._verified.add(key)
        logger.info("python sandbox: isolation verified (unshare=%s)", self.unshare_path)

    async def run(self, code: str) -> SandboxResult:
        """Run ``code`` in a fresh sandbox; raises SandboxUnavailableError when isolation cannot be set up."""
        run_id = f"verl-sandbox-{secrets.token_hex(8)}"
        host_dir = tempfile.mkdtemp(prefix="verl-sandbox-")
        status_r, status_w = os.pipe()
        try:
            try:
                proc = await self._spawn(status_w)
            finally:
                os.close(status_w)
            outcome = await self._supervise(proc, self._config(code, run_id, host_dir))
            outcome.status = _read_status(status_r)
        finally:
            os.close(status_r)
            shutil.rmtree(host_dir, ignore_errors=True)
        status = outcome.status
        unready = "ready" not in status and not (outcome.timed_out or outcome.truncated)
        if "setup_error" in status or proc.returncode == SETUP_FAILED or unready:
            reason = status.get("setup_error") or f"launcher exited with {proc.returncode} before isolation was set up"
            stderr = outcome.err.decode(errors="replace").strip()[-500:]
            raise SandboxUnavailableError(
                f"sandbox isolation could not be set up ({reason}; stderr: {stderr!r}); refusing to run code without it"
            )
        result = outcome.result(self.limits, run_id, host_dir)
        logger.debug("sandbox %s: exit=%s signal=%s error=%s", run_id, result.exit_code, result.signal, result.error)
        return result

    async def _spawn(self, status_w: int) -> asyncio.subprocess.Process:
        flags = ["--net", "--pid", "--mount", "--ipc", "--uts", "--fork", "--kill-child"]
        if os.geteuid() != 0:
            flags.append("--map-root-user")  # the program keeps the mapped uid; RLIMIT_NPROC counts in that namespace
        argv = [self.unshare_path, *flags, self.python, "-I", "-S", "-B", "-c", _launcher_source()]
        pipe = asyncio.subprocess.PIPE
        try:
            return await asyncio.create_subprocess_exec(
                *argv, "--sandbox-launcher", str(status_w), stdin=pipe, stdout=pipe, stderr=pipe,
                env=_ENV, cwd="/", start_new_session=True, pass_fds=(status_w,),
            )  # fmt: skip
        except OSError as exc:
            raise SandboxUnavailableError(
                f"cannot start {self.unshare_path!r} ({exc}); the sandbox refuses to run code without isolation"
            ) from exc

    def _config(self, code: str, run_id: str, host_dir: str) -> bytes:
        uid = None if os.geteuid() != 0 else _per_run_uid()
        prefix = os.path.realpath(sys.base_prefix)
        config = {"code": code, "run_id": run_id, "root": host_dir, "uid": uid, "python": self.python}
        return json.dumps({**config, "prefix": prefix, "limits": asdict(self.limits)}).encode()

    async def _supervise(self, proc: asyncio.subprocess.Process, config: bytes) -> _Outcome:
        """Feed the config, collect capped output, enforce the wall time; always kills and reaps the process."""
        outcome = _Outcome()

        def overflow() -> None:
            outcome.truncated = True
            _kill_group(proc)

        async def feed() -> None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                proc.stdin.write(config)
                await proc.stdin.drain()
                proc.stdin.close()

        cap = self.limits.output_bytes
        jobs = (
            feed(),
            proc.wait(),
            _read_capped(proc.stdout, outcome.out, cap, overflow),
            _read_capped(proc.stderr, outcome.err, cap, overflow),
        )
        tasks = [asyncio.ensure_future(job) for job in jobs]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.wall_seconds
        pending: set[asyncio.Future] = set(tasks)
        try:
            while pending:
                left = deadline - loop.time()
                if outcome.truncated:  # killed for its output: only the reaping is left, which the finally redoes
                    left = min(left, REAP_GRACE_S)
                if left <= 0:
                    break
                _, pending = await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            _kill_group(proc)
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
            await proc.wait()
        outcome.timed_out = bool(pending) and not outcome.truncated
        failed = [task.exception() for task in tasks if not task.cancelled() and task.exception()]
        if failed:
            raise failed[0]
        return outcome


@dataclass
class _Outcome:
    """What the parent saw of one run."""

    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    status: dict[str, Any] = field(default_factory=dict)  # the launcher's reports, merged
    timed_out: bool = False
    truncated: bool = False

    def result(self, limits: SandboxLimits, run_id: str, host_dir: str) -> SandboxResult:
        """The :class:`SandboxResult` (a run we killed has no exit code and died of SIGKILL)."""
        killed = self.timed_out or self.truncated
        exit_code = None if killed else self.status.get("exit_code")
        signal_name = "SIGKILL" if killed else self.status.get("signal")
        stdout, stderr = self.out.decode(errors="replace"), self.err.decode(errors="replace")
        result = SandboxResult(
            stdout, stderr, exit_code, signal_name, self.timed_out, self.truncated, None, run_id, host_dir
        )
        result.error = self._error(limits, result)
        return result

    def _error(self, limits: SandboxLimits, result: SandboxResult) -> str | None:
        if result.timed_out:
            return f"wall-time limit of {limits.wall_seconds:g} s exceeded"
        if result.output_truncated:
            return f"output exceeded {limits.output_bytes} bytes"
        cpu_killed = result.signal == "SIGKILL" and self.status.get("cpu", 0) >= limits.cpu_seconds
        if result.signal == "SIGXCPU" or cpu_killed:
            return f"CPU-time limit of {limits.cpu_seconds} s exceeded"
        if result.signal:
            return f"killed by {result.signal}"
        if result.exit_code is None:
            return "the sandbox ended without reporting an exit status"
        return f"exit code {result.exit_code}" if result.exit_code else None


def _probe_problem(result: SandboxResult, host_file: str) -> str | None:
    """Why the probe's output shows a broken isolation (None: it is isolated)."""
    try:
        seen = json.loads(result.stdout)
    except ValueError:
        return f"the probe program failed: {result.to_text()[-500:]!r}"
    allowed = {"bin", "dev", "lib", "lib64", "tmp", "usr", "work", Path(sys.base_prefix).resolve().parts[1]}
    checks = (
        (seen.get("pid") == 2, "the program is not in a fresh pid namespace"),
        (seen.get("ifaces") == ["lo"], f"it sees the network interfaces {seen.get('ifaces')} (expected only lo)"),
        (seen.get("connect") == "denied", "it could connect to 127.0.0.1"),
        (seen.get("chroot") == "denied", "it still holds CAP_SYS_CHROOT"),
        (seen.get("userns") is False, "it can create a user namespace (and so escape the chroot)"),
        (seen.get("host_file") is False, f"it can see the host file {host_file}"),
        (set(seen.get("root", ["?"])) <= allowed, f"it sees {seen.get('root')} at / (expected only {sorted(allowed)})"),
    )
    return next((problem for ok, problem in checks if not ok), None)


def _per_run_uid() -> int:
    """An unprivileged uid (and gid) for one run: a fresh one when the range is mapped here, else nobody."""
    uid = _UID_BASE + secrets.randbelow(_UID_SPAN)
    for name in ("uid_map", "gid_map"):
        try:
            rows = [line.split() for line in Path(f"/proc/self/{name}").read_text().splitlines() if line.strip()]
        except OSError:
            return _NOBODY
        if not any(int(row[0]) <= uid < int(row[0]) + int(row[2]) for row in rows):
            return _NOBODY
    return uid


@cache
def _launcher_source() -> str:
    return (Path(__file__).parent / "sandbox_launcher.py").read_text()


async def _read_capped(stream: asyncio.StreamReader, buf: bytearray, cap: int, overflow: Callable[[], None]) -> None:
    """Append ``stream`` to ``buf`` up to ``cap`` bytes; past it, call ``overflow`` and stop."""
    while chunk := await stream.read(65536):
        room = cap - len(buf)
        buf += chunk[:room]
        if len(chunk) > room:
            overflow()
            return


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the process group (unshare; ``--kill-child`` then takes the whole pid namespace down)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _read_status(fd: int) -> dict[str, Any]:
    """The launcher's JSON status lines, merged (without blocking: a killed launcher may still be dying)."""
    os.set_blocking(fd, False)
    data = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 65536):
            data += chunk
    status: dict[str, Any] = {}
    for line in data.decode(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            status.update(json.loads(line))
    return status
