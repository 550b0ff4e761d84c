"""The sandboxed Python interpreter: real ``unshare`` sandboxes (no mocks), with small limits."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

import pytest

from verl.tools.base_tool import ToolUnavailableError
from verl.tools.python_sandbox_tool import PythonSandboxTool
from verl.tools.sandbox import PythonSandbox, SandboxLimits, SandboxResult, SandboxUnavailableError

REPO = Path(__file__).resolve().parents[2]
LIMITS = SandboxLimits(cpu_seconds=1, wall_seconds=5, memory_mb=256, output_bytes=4096, max_processes=8)

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("unshare") is None, reason="needs Linux and unshare"
)


@pytest.fixture(scope="module")
def sandbox() -> PythonSandbox:
    box = PythonSandbox(LIMITS)
    box.check()
    return box


def run(box: PythonSandbox, code: str) -> SandboxResult:
    return asyncio.run(box.run(code))


def timed_run(box: PythonSandbox, code: str) -> tuple[SandboxResult, float]:
    start = time.monotonic()
    result = run(box, code)
    return result, time.monotonic() - start


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_stdout_and_stderr_come_back(sandbox: PythonSandbox) -> None:
    result = run(sandbox, "import sys\nprint('hello', 6 * 7)\nprint('oops', file=sys.stderr)\nsys.exit(3)")
    assert (result.stdout, result.stderr, result.exit_code) == ("hello 42\n", "oops\n", 3)
    assert result.signal is None and not result.timed_out and not result.output_truncated
    assert result.error == "exit code 3"
    assert result.to_text() == "hello 42\noops\n[error: exit code 3]"
    clean = run(sandbox, "print('fine')")
    assert (clean.exit_code, clean.error, clean.to_text()) == (0, None, "fine")


def test_no_network(sandbox: PythonSandbox) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = f"""import json, socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=1)
    reached = True
except OSError:
    reached = False
print(json.dumps({{"reached": reached, "ifaces": [name for _, name in socket.if_nameindex()]}}))"""
        seen = json.loads(run(sandbox, code).stdout)
    assert seen == {"reached": False, "ifaces": ["lo"]}


def test_trainer_env_not_visible(sandbox: PythonSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_SANDBOX_SECRET", "hunter2")
    env = json.loads(run(sandbox, "import json, os\nprint(json.dumps(dict(os.environ)))").stdout)
    assert "VERL_SANDBOX_SECRET" not in env and "hunter2" not in json.dumps(env)
    assert set(env) <= {"PATH", "LANG", "HOME", "PYTHONDONTWRITEBYTECODE", "LC_CTYPE"}


def test_host_files_not_reachable(sandbox: PythonSandbox, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host data")
    prefix = Path(os.path.realpath(sys.base_prefix))
    below = [*list(reversed(prefix.parents))[1:], prefix]  # e.g. /root, /root/.pyenv, ..., sys.base_prefix
    if prefix.parts[1] in ("usr", "lib", "lib64", "bin"):  # a system Python: its directories are shared anyway
        below = []
    ancestors = [str(path) for path in below[:-1]]
    code = f"""import json, os
paths = {[str(secret), str(REPO / "pyproject.toml"), str(tmp_path)]!r}
listings = [os.listdir(d) for d in {ancestors!r}]
print(json.dumps({{"exists": [os.path.exists(p) for p in paths], "listings": listings}}))"""
    seen = json.loads(run(sandbox, code).stdout)
    assert seen["exists"] == [False, False, False]
    # Of the interpreter's ancestors (e.g. /root) only the path down to sys.base_prefix is there, nothing else.
    assert seen["listings"] == [[child.name] for child in below[1:]]


def test_working_dir_is_private_and_removed(sandbox: PythonSandbox) -> None:
    code = "import os\nopen('out.txt', 'w').write('data')\nprint(os.getcwd(), sorted(os.listdir('.')))"
    result = run(sandbox, code)
    assert result.stdout == "/work ['main.py', 'out.txt']\n"
    assert result.host_dir and not os.path.exists(result.host_dir)
    assert run(sandbox, "import os\nprint(sorted(os.listdir('.')))").stdout == "['main.py']\n"


def test_cpu_time_limit() -> None:
    box = PythonSandbox(SandboxLimits(cpu_seconds=1, wall_seconds=15))
    result, elapsed = timed_run(box, "while True:\n    pass")
    assert result.error == "CPU-time limit of 1 s exceeded" and not result.timed_out
    assert result.signal in ("SIGXCPU", "SIGKILL") and result.exit_code is None
    assert elapsed < 10


def test_wall_time_limit() -> None:
    box = PythonSandbox(SandboxLimits(wall_seconds=1.5))
    result, elapsed = timed_run(box, "import time\nprint('started', flush=True)\ntime.sleep(60)")
    assert result.timed_out and result.error == "wall-time limit of 1.5 s exceeded"
    assert result.stdout == "started\n" and result.signal == "SIGKILL" and result.exit_code is None
    assert 1.5 <= elapsed < 10  # killed at 1.5 s; the rest is start-up and reaping on a loaded machine


def test_crash_names_the_signal(sandbox: PythonSandbox) -> None:
    result = run(sandbox, "import ctypes\nctypes.string_at(0)")
    assert (result.signal, result.error, result.exit_code) == ("SIGSEGV", "killed by SIGSEGV", None)
    assert result.to_text().endswith("[error: killed by SIGSEGV]")


# A wall limit far above what a loaded CI machine needs to start a sandbox: what stops these runs must be the limit
# under test (the error says which), not the clock.
ROOMY = SandboxLimits(cpu_seconds=5, wall_seconds=60, memory_mb=256, output_bytes=4096, max_processes=8)


def test_output_flood_is_truncated() -> None:
    result, elapsed = timed_run(PythonSandbox(ROOMY), "while True:\n    print('x' * 1000)")
    assert result.output_truncated and result.error == "output exceeded 4096 bytes", result.error
    assert len(result.stdout.encode()) == ROOMY.output_bytes
    assert not result.timed_out and elapsed < ROOMY.wall_seconds


def test_fork_bomb_is_bounded() -> None:
    code = """import os, time
count = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        count += 1
except BlockingIOError as exc:
    print("stopped after", count, type(exc).__name__)"""
    result, elapsed = timed_run(PythonSandbox(ROOMY), code)
    words = result.stdout.split()
    assert words[:2] == ["stopped", "after"] and words[3] == "BlockingIOError", result.to_text()
    assert int(words[2]) < ROOMY.max_processes
    assert not result.timed_out and elapsed < ROOMY.wall_seconds and not processes_with(result.run_id)


def test_forked_children_do_not_outlive_the_run(sandbox: PythonSandbox) -> None:
    code = """import os, time
for detach in (False, True):
    if os.fork() == 0:
        if detach:
            os.setsid()
        time.sleep(1000)
print("parent done")"""
    result = run(sandbox, code)
    assert result.stdout == "parent done\n" and result.exit_code == 0
    assert result.run_id and not processes_with(result.run_id)


def test_memory_limit(sandbox: PythonSandbox) -> None:
    result = run(sandbox, "data = bytearray(2 * 1024**3)")
    assert "MemoryError" in result.stderr and result.exit_code == 1
    assert run(sandbox, "print(len(bytearray(10 * 1024**2)))").stdout == "10485760\n"


@pytest.mark.parametrize("unshare_path", ["/nonexistent/unshare", "/bin/false"])
def test_isolation_unavailable_is_an_error(unshare_path: str) -> None:
    box = PythonSandbox(LIMITS, unshare_path=unshare_path)
    with pytest.raises(SandboxUnavailableError, match="refus"):
        box.check()
    with pytest.raises(SandboxUnavailableError, match="refus"):
        run(box, "print('must not run')")
    with pytest.raises(SandboxUnavailableError) as raised:
        PythonSandboxTool({"type": "native", "unshare_path": unshare_path}, None)
    assert isinstance(raised.value, ToolUnavailableError)  # the tool agent loop re-raises it: the run stops


def test_concurrent_runs(sandbox: PythonSandbox) -> None:
    async def many() -> list[SandboxResult]:
        return await asyncio.gather(*(sandbox.run(f"print({i} * {i})") for i in range(4)))

    results = asyncio.run(many())
    assert [result.stdout for result in results] == ["0\n", "1\n", "4\n", "9\n"]
    assert len({result.run_id for result in results}) == 4


def test_limits_are_validated() -> None:
    for bad in ({"cpu_seconds": 0}, {"memory_mb": 1.5}, {"wall_seconds": -1}, {"output_bytes": True}):
        with pytest.raises(ValueError, match=f"SandboxLimits.{next(iter(bad))}"):
            SandboxLimits(**bad)


def test_tool_execute() -> None:
    tool = PythonSandboxTool({"type": "native", "wall_seconds": 5, "cpu_seconds": 1, "max_concurrency": 2}, None)
    assert tool.name == "code_interpreter"
    assert tool.tool_schema.function.parameters.required == ["code"]

    async def calls() -> list[tuple]:
        instance_id, _ = await tool.create()
        return [
            await tool.execute(instance_id, {}),
            await tool.execute(instance_id, {"code": 42}),
            await tool.execute(instance_id, {"code": "print('hi')\nraise SystemExit(2)"}),
        ]

    missing, not_string, ran = asyncio.run(calls())
    for response, reward, metrics in (missing, not_string):
        assert "'code' parameter" in response.text and reward == 0.0 and metrics["error"] is True
    response, reward, metrics = ran
    assert response.text == "hi\n[error: exit code 2]" and reward == 0.0
    assert metrics == {"exit_code": 2, "timed_out": False, "error": True, "output_truncated": False}


def test_tool_rejects_unknown_config_key() -> None:
    with pytest.raises(ValueError, match="memory_limit"):
        PythonSandboxTool({"type": "native", "memory_limit": 512}, None)
