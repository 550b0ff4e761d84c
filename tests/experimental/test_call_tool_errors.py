"""``ToolAgentLoop._call_tool`` with an agent-data object carrying only ``tools_kwargs`` (veRL 0.10's contract):
error texts for unknown names and bad arguments, and ``left`` / ``right`` truncation."""

import asyncio
from types import SimpleNamespace

from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
from verl.tools.schemas import ToolResponse


class _Echo:
    name = "echo"

    async def create(self, create_kwargs=None):
        return "id", ToolResponse()

    async def execute(self, instance_id, parameters, **kwargs):
        if parameters.get("fail"):
            raise RuntimeError("boom")
        return ToolResponse(text="0123456789"), 0.5, {}

    async def release(self, instance_id, **kwargs):
        pass


def _call(arguments, name="echo", side="left"):
    loop = object.__new__(ToolAgentLoop)
    loop.tools, loop.max_tool_response_length, loop.tool_response_truncate_side = {"echo": _Echo()}, 4, side
    call = SimpleNamespace(name=name, arguments=arguments)
    return asyncio.run(loop._call_tool(call, {}, SimpleNamespace(tools_kwargs={})))


def test_call_tool_errors_and_truncation():
    assert _call("{}", side="left")[:2] == (ToolResponse(text="(truncated)...6789"), 0.5)
    assert _call("{}", side="right")[0].text == "0123...(truncated)"
    assert _call("{}", name="ech")[0].text == "Unknown function 'ech'. Available tools: ['echo']"
    for bad in (None, "", "{x", "[1]"):
        response, reward, _ = _call(bad)
        assert response.text.startswith("Invalid JSON in arguments for 'echo': ") and reward == 0.0, bad
    assert _call('{"fail": true}')[0].text == "Error executing tool 'echo': boom"
