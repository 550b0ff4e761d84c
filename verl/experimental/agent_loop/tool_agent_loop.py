"""``tool_agent`` (veRL's ``ToolAgentLoop``): generate → parse tool calls → run them → append the answers → generate …

A state machine per sample: ``PENDING`` (chat template of ``raw_prompt`` with the tool schemas) → ``GENERATING`` →
``PROCESSING_TOOLS`` (the turn had tool calls) or ``INTERACTING`` (a simulated user, when
``multi_turn.interaction_config_path`` is set) → ``GENERATING`` … → ``TERMINATED``. Limits are veRL's
``rollout.multi_turn.*``:

- ``max_assistant_turns`` / ``max_user_turns``: stop after that many model / tool-or-user turns;
- ``max_parallel_calls``: calls of one turn run concurrently; later calls of the turn are dropped (counted);
- ``max_tool_response_length`` / ``tool_response_truncate_side`` (``left`` cuts the head, ``right`` the tail,
  ``middle`` both ends): long tool answers are cut, by characters, as in veRL;
- ``rollout.response_length``: each turn generates at most what is left of it; a tool or user turn that would fill it
  ends the conversation instead (so a trajectory ends on model tokens).

Tools are the YAML tools of ``multi_turn.tool_config_path`` and the ``@function_tool`` s of
``multi_turn.function_tool_path`` (:func:`~verl.tools.tool_registry.load_all_tools`); a sample's
``extra_info.tool_selection`` (a list of tool names) shows and runs only those for that sample. The parser's
``stop_token_ids`` are added to the sample's stop tokens. Each model turn is appended to the messages as an assistant
message whose ``tool_calls`` carry the calls' ids when the format has them (``kimi``), and each tool answer as a tool
message with the matching ``tool_call_id``.

Tool and user tokens are appended with ``response_mask`` 0 (and log-probability 0): only the model's tokens are
trained. Every turn of a conversation goes to the same server (the server manager is sticky per request id), so an
engine with a prefix cache (vLLM's is on by default) reuses the conversation's prefix. A call that fails — unknown
tool, arguments that are not JSON, a tool that raises or times out — hands the model ``Error when executing tool: …``
and is counted; a tool that reports that the machine cannot run it safely
(:class:`~verl.tools.base_tool.ToolUnavailableError`) stops the run.

Per sample, ``extra_fields`` carries ``turn_scores`` (interaction scores), ``tool_rewards`` (tools' step rewards) and
``tool_call_counts``; ``metrics`` adds ``num_tool_calls``, ``tool_errors``, ``tool_timeouts`` and
``tool_calls_dropped`` to the timings.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from enum import Enum
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, ToolListWrap, register
from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser
from verl.tools.base_tool import BaseTool, ToolUnavailableError
from verl.tools.function_tool import FunctionTool, normalize_function_tool_return
from verl.tools.schemas import ToolResponse
from verl.utils.profiler.performance import simple_timer
from verl.utils.rollout_trace import rollout_trace_op

__all__ = ["AgentData", "AgentState", "ToolAgentLoop", "truncate_tool_response"]

logger = logging.getLogger(__name__)

TRUNCATION_MARK = "...(truncated)"


class AgentState(Enum):
    """States of a tool agent's conversation."""

    PENDING = "pending"
    GENERATING = "generating"
    PROCESSING_TOOLS = "processing_tools"
    TERMINATED = "terminated"
    INTERACTING = "interacting"


class AgentData:
    """One conversation's state (veRL's fields, plus the tool-call counters)."""

    def __init__(
        self,
        messages: list[dict[str, Any]],
        image_data: Any,
        metrics: dict[str, Any],
        request_id: str,
        tools_kwargs: dict[str, Any],
        interaction: Any = None,
        interaction_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.messages = messages
        self.image_data = image_data
        self.metrics = metrics
        self.request_id = request_id
        self.tools_kwargs = tools_kwargs
        self.interaction = interaction
        self.interaction_kwargs = interaction_kwargs or {}
        self.prompt_ids: list[int] = []
        self.response_ids: list[int] = []  # the last assistant turn's tokens
        self.response_mask: list[int] = []
        self.response_logprobs: list[float] = []
        self.turn_scores: list[float] = []
        self.tool_rewards: list[float] = []
        self.user_turns = 0
        self.assistant_turns = 0
        self.tool_calls: list[FunctionCall] = []
        self.rejected_calls: list[str] = []
        self.extra_fields: dict[str, Any] = {}
        self.num_tool_calls = self.tool_errors = self.tool_timeouts = self.dropped_calls = 0
        self.tools: dict[str, BaseTool | FunctionTool] = {}  # the tools this sample may call (tool_selection)
        self.tool_schemas: list[dict[str, Any]] = []  # their schemas, as the chat template takes them


def truncate_tool_response(text: str, limit: int, side: str) -> str:
    """Cut ``text`` to ``limit`` characters (veRL 0.10's rule): ``left`` drops the head and keeps the tail,
    ``right`` keeps the head, ``middle`` keeps half of each end."""
    if len(text) <= limit:
        return text
    if side == "left":
        return "(truncated)..." + text[-limit:]
    if side == "right":
        return text[:limit] + TRUNCATION_MARK
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[len(text) - half :]


@dataclass(frozen=True)
class _Settings:
    """What every tool-agent instance of a worker shares: limits, tools, parser, interactions."""

    prompt_length: int
    response_length: int
    max_assistant_turns: int | None
    max_user_turns: int | None
    max_parallel_calls: int
    max_tool_response_length: int
    tool_response_truncate_side: str
    tools: dict[str, BaseTool | FunctionTool]
    tool_schemas: dict[str, dict[str, Any]]  # name → the schema as the chat template takes it
    tool_parser: ToolParser
    interaction_map: dict[str, Any]

    @staticmethod
    def build(rollout: Any, tokenizer: Any) -> _Settings:
        from verl.interactions.utils.interaction_registry import initialize_interactions_from_config
        from verl.tools.tool_registry import load_all_tools

        turn = rollout.multi_turn
        tools = load_all_tools(turn.tool_config_path, turn.get("function_tool_path"))
        interactions = (
            initialize_interactions_from_config(turn.interaction_config_path) if turn.interaction_config_path else {}
        )
        return _Settings(
            prompt_length=int(rollout.prompt_length),
            response_length=int(rollout.response_length),
            max_assistant_turns=turn.max_assistant_turns,
            max_user_turns=turn.max_user_turns,
            max_parallel_calls=int(turn.max_parallel_calls),
            max_tool_response_length=int(turn.max_tool_response_length),
            tool_response_truncate_side=str(turn.tool_response_truncate_side),
            tools={tool.name: tool for tool in tools},
            tool_schemas={tool.name: _template_schema(tool) for tool in tools},
            tool_parser=ToolParser.get_tool_parser(str(turn.format), tokenizer),
            interaction_map=interactions,
        )


def _template_schema(tool: BaseTool | FunctionTool) -> dict[str, Any]:
    return tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)


@register("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    """Multi-turn rollout with tools and (optionally) a simulated user; see the module docstring.

    Args:
        tools: veRL's ``ToolListWrap`` (or a list) of tools replacing those of the config.
    """

    def __init__(self, *args: Any, tools: ToolListWrap | list[Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = self.cached("tool_agent_settings", lambda: _Settings.build(self.rollout_config, self.tokenizer))
        self.settings = settings
        self.prompt_length, self.response_length = settings.prompt_length, settings.response_length
        self.max_assistant_turns, self.max_user_turns = settings.max_assistant_turns, settings.max_user_turns
        self.max_parallel_calls = settings.max_parallel_calls
        self.max_tool_response_length = settings.max_tool_response_length
        self.tool_response_truncate_side = settings.tool_response_truncate_side
        self.tools, self.tool_schema_by_name = settings.tools, settings.tool_schemas
        if tools is not None:
            given = tools.tools if isinstance(tools, ToolListWrap) else list(tools)
            self.tools = {tool.name: tool for tool in given}
            self.tool_schema_by_name = {tool.name: _template_schema(tool) for tool in given}
        self.tool_schemas = list(self.tool_schema_by_name.values())
        self.tool_parser, self.interaction_map = settings.tool_parser, settings.interaction_map
        self.stop_token_ids = self.cached("tool_parser_stop_token_ids", lambda: list(self.tool_parser.stop_token_ids))

    @rollout_trace_op
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        if "raw_prompt" not in kwargs:
            raise ValueError("tool_agent: the sample has no raw_prompt (set data.return_raw_chat=True)")
        request_id = uuid4().hex
        interaction, interaction_kwargs = await self._start_interaction(request_id, kwargs)
        agent_data = AgentData(
            messages=[dict(m) for m in kwargs["raw_prompt"]],
            image_data=None,
            metrics={},
            request_id=request_id,
            tools_kwargs=dict(kwargs.get("tools_kwargs") or {}),
            interaction=interaction,
            interaction_kwargs=interaction_kwargs,
        )
        agent_data.tools = self._selected_tools(kwargs.get("extra_info"))
        agent_data.tool_schemas = [self.tool_schema_by_name[name] for name in agent_data.tools]
        handlers = {
            AgentState.PENDING: self._handle_pending_state,
            AgentState.GENERATING: self._handle_generating_state,
            AgentState.PROCESSING_TOOLS: self._handle_processing_tools_state,
            AgentState.INTERACTING: self._handle_interacting_state,
        }
        state = AgentState.PENDING
        try:
            while state != AgentState.TERMINATED:
                state = await handlers[state](agent_data, sampling_params)
        finally:
            if interaction is not None:
                await interaction.finalize_interaction(request_id)
        return self._output(agent_data)

    def _selected_tools(self, extra_info: Any) -> dict[str, BaseTool | FunctionTool]:
        """The tools of the sample: ``extra_info.tool_selection`` (a list of names; None or empty: every tool)."""
        selection = (extra_info or {}).get("tool_selection") if isinstance(extra_info, dict) else None
        if selection is None:
            return self.tools
        names = [selection] if isinstance(selection, str) else [str(name) for name in selection]
        if not names:
            return self.tools
        unknown = [name for name in names if name not in self.tools]
        if unknown:
            raise ValueError(
                f"tool_agent: extra_info.tool_selection={names} names tools that are not configured: {unknown}; "
                f"the tools of multi_turn.tool_config_path / function_tool_path are {sorted(self.tools)}"
            )
        return {name: self.tools[name] for name in dict.fromkeys(names)}

    async def _start_interaction(self, request_id: str, fields: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if not self.interaction_map:
            return None, {}
        kwargs = fields.get("interaction_kwargs") or (fields.get("extra_info") or {}).get("interaction_kwargs") or {}
        kwargs = dict(kwargs)
        name = kwargs.get("name")
        if name is None:
            raise ValueError(
                "tool_agent: multi_turn.interaction_config_path is set but the sample's "
                "extra_info.interaction_kwargs has no 'name'"
            )
        if name not in self.interaction_map:
            raise ValueError(
                f"tool_agent: interaction {name!r} (extra_info.interaction_kwargs.name) is not in "
                f"multi_turn.interaction_config_path; available: {sorted(self.interaction_map)}"
            )
        interaction = self.interaction_map[name]
        await interaction.start_interaction(request_id, **kwargs)
        return interaction, kwargs

    async def _handle_pending_state(self, agent_data: AgentData, sampling_params: dict[str, Any]) -> AgentState:
        tools = agent_data.tool_schemas or None
        agent_data.prompt_ids = await self.apply_chat_template(agent_data.messages, tools=tools)
        return AgentState.GENERATING

    async def _handle_generating_state(self, agent_data: AgentData, sampling_params: dict[str, Any]) -> AgentState:
        params = {**sampling_params, "max_tokens": self.response_length - len(agent_data.response_mask)}
        if self.stop_token_ids:  # the parser's: tokens the model does not follow with EOS (e.g. Gemma's call end)
            stops = list(params.get("stop_token_ids") or [])
            params["stop_token_ids"] = stops + [t for t in self.stop_token_ids if t not in stops]
        with simple_timer("generate_sequences", agent_data.metrics):
            output = await self.server_manager.generate(
                request_id=agent_data.request_id, prompt_ids=agent_data.prompt_ids, sampling_params=params
            )
        agent_data.assistant_turns += 1
        agent_data.metrics["num_preempted"] = agent_data.metrics.get("num_preempted", 0) + int(
            output.num_preempted or 0
        )
        ids = list(output.token_ids)
        agent_data.response_ids = ids
        agent_data.prompt_ids += ids
        agent_data.response_mask += [1] * len(ids)
        if output.log_probs is not None:
            agent_data.response_logprobs += list(output.log_probs[: len(ids)])
        if len(agent_data.response_mask) >= self.response_length:
            return AgentState.TERMINATED
        if self.max_assistant_turns and agent_data.assistant_turns >= self.max_assistant_turns:
            return AgentState.TERMINATED
        if self.max_user_turns and agent_data.user_turns >= self.max_user_turns:
            return AgentState.TERMINATED
        schemas = [tool.tool_schema for tool in agent_data.tools.values()]
        content, agent_data.tool_calls, rejected = await self.tool_parser.parse(ids, schemas)
        agent_data.tool_errors += len(rejected)
        agent_data.rejected_calls += rejected
        agent_data.messages.append(self._build_assistant_message(content, agent_data))
        if agent_data.tool_calls:
            return AgentState.PROCESSING_TOOLS
        if agent_data.interaction is not None:
            return AgentState.INTERACTING
        return AgentState.TERMINATED

    async def _handle_processing_tools_state(
        self, agent_data: AgentData, sampling_params: dict[str, Any] | None = None
    ) -> AgentState:
        calls = agent_data.tool_calls[: self.max_parallel_calls]
        agent_data.dropped_calls += len(agent_data.tool_calls) - len(calls)
        with simple_timer("tool_calls", agent_data.metrics):
            results = await asyncio.gather(*(self._call_tool(c, agent_data.tools_kwargs, agent_data) for c in calls))
        messages = []
        for call, (response, reward, _) in zip(calls, results):
            if response.image or response.video:
                raise NotImplementedError("tool_agent: tools returning images or videos need a multi-modal model")
            message = {"role": "tool", "content": response.text or ""}
            if call.tool_call_id is not None:
                message["tool_call_id"] = call.tool_call_id
            messages.append(message)
            if reward is not None:
                agent_data.tool_rewards.append(float(reward))
        agent_data.messages.extend(messages)
        text = self.tool_parser.tool_response_text(messages, calls)
        if text is None:
            ids = await self.apply_chat_template(messages, remove_system_prompt=True)
        else:
            ids = await self.loop.run_in_executor(None, lambda: self.tokenizer.encode(text, add_special_tokens=False))
        return self._append_turn(agent_data, ids)

    def _build_assistant_message(self, content: str, agent_data: AgentData) -> dict[str, Any]:
        """The model's turn as a chat message: its text and the calls that run (with their ids when the format has
        them); arguments that are not a JSON object are kept as written."""
        message: dict[str, Any] = {"role": "assistant", "content": content or ""}
        if not agent_data.tool_calls:
            return message
        tool_calls = []
        for call in agent_data.tool_calls[: self.max_parallel_calls]:
            try:
                arguments = json.loads(call.arguments)
            except ValueError:
                arguments = None
            entry: dict[str, Any] = {
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": arguments if isinstance(arguments, dict) else call.arguments,
                },
            }
            if call.tool_call_id is not None:
                entry["id"] = call.tool_call_id
            tool_calls.append(entry)
        message["tool_calls"] = tool_calls
        return message

    async def _handle_interacting_state(self, agent_data: AgentData, sampling_params: dict[str, Any]) -> AgentState:
        done, text, score, _ = await agent_data.interaction.generate_response(
            agent_data.request_id, agent_data.messages, **agent_data.interaction_kwargs
        )
        if score is not None:
            agent_data.turn_scores.append(float(score))
        if done:
            return AgentState.TERMINATED
        message = {"role": "user", "content": text}
        agent_data.messages.append(message)
        ids = await self.apply_chat_template([message], remove_system_prompt=True)
        return self._append_turn(agent_data, ids)

    def _append_turn(self, agent_data: AgentData, ids: list[int]) -> AgentState:
        """Append a tool / user turn (mask 0), unless it would fill the response: then the conversation ends."""
        if len(agent_data.response_mask) + len(ids) >= self.response_length:
            return AgentState.TERMINATED
        agent_data.prompt_ids += ids
        agent_data.response_mask += [0] * len(ids)
        if agent_data.response_logprobs:
            agent_data.response_logprobs += [0.0] * len(ids)
        agent_data.user_turns += 1
        return AgentState.GENERATING

    async def _call_tool(
        self, tool_call: FunctionCall, tools_kwargs: dict[str, Any], agent_data: AgentData
    ) -> tuple[ToolResponse, float | None, dict[str, Any]]:
        """Run one call — a function tool: the function; a :class:`BaseTool`: create → execute → release — any
        failure (unknown name, arguments that are not a JSON object, an exception) becomes an error text for the
        model with reward 0.0. ``agent_data`` needs only ``tools_kwargs``; its counters are kept when it has them."""
        _count(agent_data, "num_tool_calls")
        tool, instance_id = None, None
        kwargs = dict(tools_kwargs.get(tool_call.name) or {})
        tools = getattr(agent_data, "tools", None) or self.tools
        name = tool_call.name
        if name not in tools:
            _count(agent_data, "tool_errors")
            return ToolResponse(text=f"Unknown function '{name}'. Available tools: {list(tools)}"), 0.0, {}
        try:
            arguments = json.loads(tool_call.arguments)
            if not isinstance(arguments, dict):
                raise TypeError(f"expected a JSON object, got {type(arguments).__name__}")
        except (ValueError, TypeError) as e:
            _count(agent_data, "tool_errors")
            return ToolResponse(text=f"Invalid JSON in arguments for '{name}': {e}"), 0.0, {}
        try:
            tool = tools[name]
            if isinstance(tool, FunctionTool):  # stateless: no lifecycle, no tools_kwargs
                response, reward, metrics = normalize_function_tool_return(await tool.call(arguments))
            else:
                created = await tool.create(create_kwargs=dict(kwargs.get("create_kwargs") or {}))
                instance_id = created[0] if isinstance(created, tuple) else created
                result = await tool.execute(
                    instance_id, arguments, agent_data=agent_data, **dict(kwargs.get("execute_kwargs") or {})
                )
                response, reward, metrics = _as_tool_result(result)
        except ToolUnavailableError:
            raise
        except (TimeoutError, asyncio.TimeoutError) as e:
            _count(agent_data, "tool_timeouts")
            return ToolResponse(text=f"Error executing tool '{name}': timed out {e}".rstrip()), 0.0, {}
        except Exception as e:  # noqa: BLE001 - the model hears of any failure; the rollout goes on
            _count(agent_data, "tool_errors")
            logger.debug("tool call %s failed", name, exc_info=True)
            return ToolResponse(text=f"Error executing tool '{name}': {e}"), 0.0, {}
        finally:
            if tool is not None and instance_id is not None:
                await tool.release(instance_id, **dict(kwargs.get("release_kwargs") or {}))
        if metrics.get("timed_out"):
            _count(agent_data, "tool_timeouts")
        elif metrics.get("error"):
            _count(agent_data, "tool_errors")
        text = truncate_tool_response(
            response.text or "", self.max_tool_response_length, self.tool_response_truncate_side
        )
        return response.model_copy(update={"text": text}), reward, metrics

    def _output(self, agent_data: AgentData) -> AgentLoopOutput:
        n = len(agent_data.response_mask)
        prompt_ids = agent_data.prompt_ids[: len(agent_data.prompt_ids) - n]
        response_ids = agent_data.prompt_ids[len(prompt_ids) :]
        limit = self.response_length
        metrics = dict(agent_data.metrics)
        metrics.update(
            num_tool_calls=agent_data.num_tool_calls,
            tool_errors=agent_data.tool_errors,
            tool_timeouts=agent_data.tool_timeouts,
            tool_calls_dropped=agent_data.dropped_calls,
        )
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids[:limit],
            response_mask=agent_data.response_mask[:limit],
            response_logprobs=agent_data.response_logprobs[:limit] if agent_data.response_logprobs else None,
            num_turns=agent_data.user_turns + agent_data.assistant_turns + 1,
            metrics=metrics,
            extra_fields={
                **agent_data.extra_fields,
                "turn_scores": agent_data.turn_scores,
                "tool_rewards": agent_data.tool_rewards,
                "tool_call_counts": agent_data.num_tool_calls,
            },
        )


def _count(agent_data: Any, counter: str) -> None:
    """Add one to ``agent_data.<counter>`` when the object keeps that counter."""
    if hasattr(agent_data, counter):
        setattr(agent_data, counter, getattr(agent_data, counter) + 1)


def _as_tool_result(result: Any) -> tuple[ToolResponse, float | None, dict[str, Any]]:
    """A tool's ``execute`` result in any of veRL's forms — ``(ToolResponse | str | dict, reward, metrics)`` — as
    ``(ToolResponse, reward, metrics)``."""
    if not (isinstance(result, tuple) and len(result) == 3):
        raise TypeError(f"execute returned {type(result).__name__}, not (response, reward, metrics)")
    response, reward, metrics = result
    if isinstance(response, str):
        response = ToolResponse(text=response)
    elif isinstance(response, dict):
        response = ToolResponse(**response)
    elif not isinstance(response, ToolResponse):
        raise TypeError(f"execute returned a {type(response).__name__} response, not a ToolResponse")
    return response, reward, dict(metrics or {})
