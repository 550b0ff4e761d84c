"""SandboxFusionTool: a retool-style subclass loaded from a tool YAML runs real code in the local sandbox, and the
tool speaks SandboxFusion's HTTP protocol to a real server on localhost (which runs the code in a subprocess)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from verl.tools import sandbox_fusion_tools
from verl.tools.sandbox_fusion_tools import NO_OUTPUT, SandboxFusionTool
from verl.tools.schemas import ToolResponse
from verl.tools.utils.tool_registry import initialize_tools_from_config
from verl.utils.reward_score.sandbox_fusion import utils as fusion_utils

needs_sandbox = pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("unshare") is None, reason="needs Linux and unshare"
)

TOOL_YAML = """tools:
  - class_name: "{class_name}"
    config:
      sandbox_fusion_url: "{url}"
      num_workers: 4
      enable_global_rate_limit: {global_limit}
      rate_limit: {rate_limit}
      default_timeout: {timeout}
      default_language: "python"
      memory_limit_mb: 512
      type: native
    tool_schema:
      type: "function"
      function:
        name: "code_interpreter"
        description: "A tool for executing code."
        parameters:
          type: "object"
          properties:
            code:
              type: "string"
              description: "The code to execute."
          required: ["code"]
"""


class FencedCodeTool(SandboxFusionTool):
    """What recipe/retool's CustomSandboxFusionTool does with the base class: take the code out of a fenced block,
    print the last expression, and run it through ``execution_pool.execute.remote(self.execute_code, ...)``."""

    def __init__(self, config: dict, tool_schema: Any) -> None:
        super().__init__(config, tool_schema)
        self.fence = re.compile(r"```python(.*?)```", re.DOTALL)

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[Any, Any, Any]:
        code = parameters["code"]
        found = self.fence.findall(code)
        lines = (found[0].strip() if found else code).split("\n")
        if not lines[-1].startswith("print"):
            lines[-1] = f"print({lines[-1]})"
        timeout = parameters.get("timeout", self.default_timeout)
        language = parameters.get("language", self.default_language)
        pool = self.execution_pool
        result = await pool.execute.remote(self.execute_code, instance_id, "\n".join(lines), timeout, language)
        return result, None, None


def load_tool(tmp_path: Path, url: str = "", timeout: float = 5, rate_limit: int = 10, global_limit: bool = False):
    path = tmp_path / "sandbox_fusion_tool_config.yaml"
    class_name = f"{__name__}.FencedCodeTool"
    text = TOOL_YAML.format(
        class_name=class_name, url=url, timeout=timeout, rate_limit=rate_limit, global_limit=str(global_limit).lower()
    )
    path.write_text(text)
    (tool,) = initialize_tools_from_config(str(path))
    return tool


async def call(tool: SandboxFusionTool, code: str, **params: Any) -> ToolResponse:
    instance_id, _ = await tool.create(ground_truth="42")
    try:
        response, reward, metrics = await tool.execute(instance_id, {"code": code, **params})
    finally:
        await tool.release(instance_id)
    assert reward is None and metrics is None
    return response


# -- the local sandbox ------------------------------------------------------------------------------------------------
@needs_sandbox
def test_retool_style_subclass_from_yaml_runs_code_in_the_local_sandbox(tmp_path):
    tool = load_tool(tmp_path, url="", timeout=2)
    assert isinstance(tool, FencedCodeTool) and tool.name == "code_interpreter"
    assert (tool.default_timeout, tool.default_language, tool.memory_limit_mb) == (2, "python", 512)

    async def scenario():
        fenced = await call(tool, "Let me compute.\n```python\nimport math\nmath.factorial(5)\n```")
        error = await call(tool, "x = 1\nprint(x)\n1 / 0")
        hangs = await call(tool, "while True:\n    pass\nprint('never')", timeout=1)
        other = await call(tool, "print(1)", language="cpp")
        return fenced, error, hangs, other

    start = time.monotonic()
    fenced, error, hangs, other = asyncio.run(scenario())
    assert fenced.text == "120\n"  # the last expression printed, as retool's subclass arranges
    assert error.text.startswith("1\n") and "ZeroDivisionError" in error.text  # finished (exit 1): stdout + stderr
    assert hangs.text == NO_OUTPUT  # cut at the call's own 1 s timeout
    assert other.text == NO_OUTPUT  # the local sandbox runs python only
    assert time.monotonic() - start < 8


@needs_sandbox
def test_local_run_has_no_network_and_no_host_files():
    code = f"import os, socket\nprint(os.path.exists({__file__!r}))\n" + (
        "try:\n    socket.create_connection(('127.0.0.1', 9), 1)\nexcept OSError:\n    print('no network')"
    )
    response = fusion_utils.run_in_local_sandbox(
        code,
        run_timeout=3,
        memory_limit_mb=256,
    )
    assert response["status"] == "Success" and response["run_result"]["status"] == "Finished"
    assert response["run_result"]["stdout"] == "False\nno network\n"


def test_config_problems_are_refused_by_name():
    with pytest.raises(ValueError, match="unknown config key 'num_worker'"):
        SandboxFusionTool({"num_worker": 3}, None)
    with pytest.raises(ValueError, match="num_workers must be a positive integer, got 0"):
        SandboxFusionTool({"num_workers": 0, "sandbox_fusion_url": "http://127.0.0.1:1/run_code"}, None)
    with pytest.raises(ValueError, match="rate_limit must be a positive integer"):
        SandboxFusionTool({"rate_limit": True, "sandbox_fusion_url": "http://127.0.0.1:1/run_code"}, None)
    with pytest.raises(ValueError, match="default_timeout must be a positive number"):
        SandboxFusionTool({"default_timeout": -1, "sandbox_fusion_url": "http://127.0.0.1:1/run_code"}, None)
    with pytest.raises(ValueError, match="default_language='cpp' cannot run in the local sandbox"):
        SandboxFusionTool({"default_language": "cpp", "sandbox_fusion_url": "local"}, None)


# -- a SandboxFusion service on localhost -----------------------------------------------------------------------------
class FusionServer:
    """A tiny SandboxFusion ``/run_code`` service: runs Python in a subprocess and answers in SandboxFusion's shape.
    It records each request body and the most runs it had in flight at once; ``fail_first`` answers 504 first."""

    def __init__(self, fail_first: int = 0) -> None:
        self.requests: list[dict[str, Any]] = []
        self.fail_first = fail_first
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append(body)
                    if server.fail_first > 0:
                        server.fail_first -= 1
                        self.send_response(504)
                        self.end_headers()
                        return
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    reply = server.run(body)
                finally:
                    with server.lock:
                        server.in_flight -= 1
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/run_code"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @staticmethod
    def run(body: dict[str, Any]) -> dict[str, Any]:
        try:
            proc = subprocess.run(
                [sys.executable, "-I", "-c", body["code"]],
                input=body["stdin"] or "", capture_output=True, text=True, timeout=body["run_timeout"],
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            run = {"status": "TimeLimitExceeded", "return_code": None, "stdout": "", "stderr": ""}
            return {"status": "Failed", "message": "", "compile_result": None, "run_result": run}
        run = {"status": "Finished", "return_code": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
        status = "Success" if proc.returncode == 0 else "Failed"
        return {"status": status, "message": "", "compile_result": None, "run_result": {**run, "execution_time": 0}}

    def __enter__(self) -> FusionServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_the_tool_posts_verl_requests_to_a_sandbox_fusion_service(tmp_path):
    with FusionServer() as server:
        # a generous limit: a python start on a loaded machine must fit in it; the sleep must not
        tool = load_tool(tmp_path, url=server.url, timeout=5)

        async def scenario():
            return await call(tool, "```python\nsum(range(10))\n```"), await call(tool, "import time\ntime.sleep(20)")

        done, slow = asyncio.run(scenario())
    assert done.text == "45\n"
    assert slow.text == NO_OUTPUT  # the service reported TimeLimitExceeded
    expected = {
        "compile_timeout": 5, "run_timeout": 5, "code": "print(sum(range(10)))", "stdin": None,
        "memory_limit_MB": 512, "language": "python", "files": {}, "fetch_files": [],
    }  # fmt: skip
    assert server.requests[0] == expected


def test_a_504_is_retried_and_an_unreachable_service_gives_no_output(tmp_path):
    with FusionServer(fail_first=1) as server:
        response, error = fusion_utils.call_sandbox_api(server.url, "print('ok')", None, 2, 2, 256)
    assert error is None and response["run_result"]["stdout"] == "ok\n"
    assert len(server.requests) == 2  # the 504, then the retry
    response, error = fusion_utils.call_sandbox_api(server.url, "print(1)", None, 1, 1, 256, language="cobol")
    assert response is None and "Unsupported language: 'cobol'" in error
    tool = SandboxFusionTool({"sandbox_fusion_url": server.url, "enable_global_rate_limit": False}, None)
    assert asyncio.run(call(tool, "print(1)")).text == NO_OUTPUT  # the server is shut down now


@pytest.mark.parametrize(("rate_limit", "global_limit"), [(1, False), (2, True)])
def test_rate_limit_bounds_the_runs_in_flight(tmp_path, monkeypatch, rate_limit, global_limit):
    monkeypatch.setattr(sandbox_fusion_tools, "_process_limiter", None)  # a fresh process-wide limit
    import ray

    # the process-wide limit (Ray not started); in the full suite a shared Ray cluster may be up in this process
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with FusionServer() as server:
        tools = [
            load_tool(tmp_path, url=server.url, timeout=15, rate_limit=rate_limit, global_limit=global_limit)
            for _ in range(2)
        ]

        async def scenario():
            # runs long enough (1 s) to overlap even when starting a python is slow on a loaded machine
            calls = [call(tool, "import time\ntime.sleep(1)\nprint('x')") for tool in tools for _ in range(3)]
            return await asyncio.gather(*calls)

        responses = asyncio.run(scenario())
    assert [r.text for r in responses] == ["x\n"] * 6
    # per tool: each of the two tools may run rate_limit at once; global: both share one limit
    assert server.max_in_flight == (rate_limit if global_limit else 2 * rate_limit)
    assert tools[0].execution_pool.limiter.scope == ("process" if global_limit else "tool")


def test_check_correctness_grades_each_case_on_the_service():
    """veRL's per-case grading: pass, wrong answer, runtime error and timeout on one program; a call-based problem
    (``fn_name``) compared as JSON; the semaphore bounds the runs in flight; bad in_outs named."""
    program = textwrap.dedent(
        """\
        x = input()
        if x == "boom":
            raise SystemExit(3)
        if x == "slow":
            import time
            time.sleep(30)
        print(x.upper())
        """
    )
    cases = {"inputs": ["ab", "cd", "boom", "slow"], "outputs": ["AB\n", "XX", "", ""]}
    with FusionServer() as server:
        results, meta = fusion_utils.check_correctness(server.url, cases, program, timeout=5)
        assert results == [True, False, -2, -3]
        assert [m["status"] for m in meta] == ["success", "wrong_answer", "runtime_error", "timeout"]
        assert meta[1]["stdout"] == "CD\n" and meta[2]["exit_code"] == 3 and meta[0]["case_index"] == 0
        solution = "class Solution:\n    def add(self, a, b):\n        return [a + b]"
        call_based = {"fn_name": "add", "inputs": ["[1, 2]", "[3, 4]"], "outputs": ["[3]", "[8]"]}
        semaphore, server.max_in_flight = threading.Semaphore(1), 0  # the first program ran its 4 cases at once
        results, _ = fusion_utils.check_correctness(server.url, call_based, solution, concurrent_semaphore=semaphore)
        assert results == [True, False] and server.max_in_flight == 1
    for bad in (None, {}, {"inputs": ["1"]}):
        assert fusion_utils.check_correctness(server.url, bad, "print(1)") == (
            [-1],
            [{"error": "Invalid input/output data"}],
        )
    assert fusion_utils.check_correctness(server.url, {"inputs": ["1"], "outputs": []}, "")[0] == [-1]
