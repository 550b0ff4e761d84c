"""``gateway_agent``: an agent loop that runs a user's existing agent against the gateway, unchanged.

The agent is any program that talks to an OpenAI-style API. Per sample, the loop opens a session on the process's
gateway (:func:`~.server.shared_gateway`), runs the agent with the gateway's base URL and the session's API key,
and turns what the session captured into the sample's trajectory. Listed in an agent-loop YAML
(``rollout.agent.agent_loop_config_path``)::

    - name: my_agent
      _target_: verl.experimental.agent_gateway.GatewayAgentLoop
      agent: /path/to/agent.py:solve          # a function: (base_url, api_key, sample) -> reward | None
      # command: [python, /path/to/agent.py]  # or a program: OPENAI_BASE_URL / OPENAI_API_KEY in its environment
      timeout_s: 120
      max_requests: 16

- **A function** (``agent: <file.py or pkg://module>:<name>``), async or not (a plain function runs in a thread), is
  called as ``agent(base_url, api_key, sample)``; ``sample`` is the sample's dataset fields (``raw_prompt``,
  ``extra_info``, ``reward_model``, …) as JSON values.
- **A program** (``command``: a list or a shell-style string) gets ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` (what
  the ``openai`` client reads by itself) and ``VERL_AGENT_SAMPLE`` (the sample as JSON) in its environment. The last
  line of its standard output, when it is a number or ``{"reward": x}``, is its reward.
- **The reward**: the agent's (a number, or ``{"reward": x}``) when it gives one; otherwise the run's reward
  function scores the trajectory, as for any other loop.
- **Bounds**: an agent that outlives ``timeout_s`` is cancelled (a program: its process group is killed; a plain
  function cannot be stopped in its thread: it is abandoned, and its session's requests are refused from then), one that
  raises or exits non-zero is a crash, one that sends more than ``max_requests`` requests is refused (429). A timed-out
  or crashed agent whose session produced tokens scores 0 (what it still had generating is aborted); one that
  produced none, or a session the gateway failed to serve (an HTTP 500), fails its sample (the run stops,
  naming the loop, or keeps the sample as failed under ``trainer.v1.sampler.schedule=replay_buffer``). Each is
  counted per sample (``agent_loop/gateway_agent_timeouts``, ``…_agent_crashes``, ``…_refused_requests``).

**Trajectories.** A session whose requests all continue one conversation gives one trajectory. One that splits —
the other choices of ``n > 1``, a history the agent rewrote, a second conversation — gives several: with
``trajectories: all`` (the default) the loop returns them all (veRL 0.10's multi-output sessions), the final output
being the conversation the agent continued last; each is trained with the sample's reward, and GRPO's group
statistics use the final outputs (:func:`~verl.trainer.ppo.v1.compute_advantage_for_multi_trajectories`). With
``trajectories: last`` only that one is returned and the others are counted (``gateway_dropped_trajectories``).
Each output's per-token weight versions are those of its own generated tokens.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import json
import logging
import os
import shlex
import signal
import uuid
from typing import Any

import numpy as np

from verl.experimental.agent_gateway.capture import ConversationCapture, Trajectory
from verl.experimental.agent_gateway.server import shared_gateway
from verl.experimental.agent_gateway.session import GatewaySession
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

__all__ = ["AgentCrashed", "GatewayAgentLoop", "load_agent"]

logger = logging.getLogger(__name__)

_OUTPUT_TAIL = 4000
_KILL_WAIT_S = 5.0
_AGENT_THREADS = 1024  # plain-function agents of one worker process at once
_threads: concurrent.futures.ThreadPoolExecutor | None = None


def _agent_threads() -> concurrent.futures.ThreadPoolExecutor:
    """The threads plain-function agents run in (not the event loop's default executor, which the gateway's own
    parsing and tokenizing use: agents blocked on the gateway there could starve it)."""
    global _threads
    if _threads is None:
        _threads = concurrent.futures.ThreadPoolExecutor(_AGENT_THREADS, thread_name_prefix="gateway-agent")
    return _threads


class AgentCrashed(RuntimeError):
    """The agent raised, or its program exited non-zero."""


def load_agent(spec: str) -> Any:
    """The function ``spec`` names: ``<file.py or pkg://module>:<name>``."""
    from verl.utils.import_utils import load_extern_object

    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise ValueError(f"gateway_agent: agent={spec!r} must be '<file.py or pkg://module>:<function>'")
    return load_extern_object(path, name)


def _json_value(value: Any) -> Any:
    """A dataset field as a JSON value (numpy arrays and scalars converted)."""
    if isinstance(value, np.ndarray):
        return [_json_value(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _reward_of(value: Any) -> float | None:
    """The agent's reward: a number, or ``{"reward": number}``; None otherwise."""
    if isinstance(value, dict):
        value = value.get("reward")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


@register("gateway_agent")
class GatewayAgentLoop(AgentLoopBase):
    """Runs a user's agent against the gateway (see the module docstring).

    Args (the loop's YAML entry):
        agent: ``<file.py or pkg://module>:<function>``, the agent as a function.
        command: the agent as a program (a list, or a string split as a shell would).
        timeout_s: seconds an agent may run.
        max_requests: requests one session may send.
        honor_request_sampling: use the requests' temperature / top_p rather than the run's.
        trajectories: ``all`` (every trajectory of the session, the final one last) or ``last`` (the final one).
    """

    def __init__(
        self,
        *args: Any,
        agent: str | None = None,
        command: list[str] | str | None = None,
        timeout_s: float = 300.0,
        max_requests: int = 64,
        honor_request_sampling: bool = False,
        trajectories: str = "all",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if (agent is None) == (command is None):
            raise ValueError("gateway_agent: set exactly one of 'agent' (a function) and 'command' (a program)")
        if trajectories not in ("all", "last"):
            raise ValueError(f"gateway_agent: trajectories={trajectories!r}; use 'all' or 'last'")
        self.all_trajectories = trajectories == "all"
        self.agent = self.cached(("gateway_agent_function", agent), lambda: load_agent(agent)) if agent else None
        self.command = shlex.split(command) if isinstance(command, str) else [str(c) for c in command or []]
        self.timeout_s, self.max_requests = float(timeout_s), int(max_requests)
        self.honor_request_sampling = bool(honor_request_sampling)
        self.tool_parser = self.cached("gateway_tool_parser", self._tool_parser)

    def _tool_parser(self) -> Any:
        from verl.experimental.agent_loop.tool_parser import ToolParser

        return ToolParser.get_tool_parser(str(self.rollout_config.multi_turn.format), self.tokenizer)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        gateway = await shared_gateway()
        rollout = self.rollout_config
        session = GatewaySession(
            session_id=f"gateway-{uuid.uuid4().hex}",
            client=self.server_manager,
            capture=ConversationCapture(self.tokenizer, self.apply_chat_template_kwargs),
            sampling_params=dict(sampling_params),
            prompt_length=int(rollout.prompt_length),
            response_length=int(rollout.response_length),
            tool_parser=self.tool_parser,
            model=str(self.config.actor_rollout_ref.model.path),
            honor_request_sampling=self.honor_request_sampling,
            max_requests=self.max_requests,
        )
        key = gateway.open(session)
        sample = {k: _json_value(v) for k, v in kwargs.items() if k != "raw_prompt_ids"}
        outcome = {"agent_timeouts": 0, "agent_crashes": 0}
        reward = None
        agent = asyncio.ensure_future(self._run_agent(gateway.base_url, key, sample))
        try:
            done, _ = await asyncio.wait({agent}, timeout=self.timeout_s)
            if not done:  # only the loop's own clock counts as a timeout; a TimeoutError of the agent is a crash
                outcome["agent_timeouts"] = 1
                logger.warning("gateway_agent: an agent ran past timeout_s=%s and was stopped", self.timeout_s)
            else:
                reward = agent.result()
        except AgentCrashed as e:
            outcome["agent_crashes"] = 1
            logger.warning("gateway_agent: an agent crashed: %s", e)
        finally:
            gateway.close(key)  # its key is refused from now on; what it has in flight is aborted
            if not agent.done():
                agent.cancel()
                await asyncio.gather(agent, return_exceptions=True)
            await self._abort_in_flight(session)
        if session.first_error is not None:
            raise RuntimeError(
                f"gateway_agent: the gateway failed {session.counters['server_errors']} request(s) of the sample; "
                f"the first: {session.first_error}"
            )
        final = session.capture.last
        if final is None:
            what = "timed out" if outcome["agent_timeouts"] else "crashed" if outcome["agent_crashes"] else "ended"
            raise RuntimeError(f"gateway_agent: the agent {what} without sending a request the policy answered")
        if outcome["agent_timeouts"] or outcome["agent_crashes"]:
            reward = 0.0
        others = [t for t in session.capture.trajectories if t is not final] if self.all_trajectories else []
        return self._outputs([*others, final], session, outcome, reward)

    async def _abort_in_flight(self, session: GatewaySession) -> None:
        """Stop what an ended session still has generating (a timed-out or crashed agent's last requests)."""
        abort = getattr(self.server_manager, "abort", None)
        if abort is None:
            return
        result = abort(sorted(session.request_ids))
        if inspect.isawaitable(result):
            await result

    async def _run_agent(self, base_url: str, key: str, sample: dict[str, Any]) -> float | None:
        if self.agent is not None:
            try:
                if inspect.iscoroutinefunction(self.agent):
                    result = await self.agent(base_url, key, sample)
                else:  # a thread of its own: agents waiting on the gateway must not hold the loop's executor
                    result = await self.loop.run_in_executor(_agent_threads(), self.agent, base_url, key, sample)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the agent's own failure: counted, the run goes on
                raise AgentCrashed(f"{type(e).__name__}: {e}") from e
            return _reward_of(result)
        return await self._run_program(base_url, key, sample)

    async def _run_program(self, base_url: str, key: str, sample: dict[str, Any]) -> float | None:
        env = {
            **os.environ,
            "OPENAI_BASE_URL": base_url,
            "OPENAI_API_KEY": key,
            "VERL_AGENT_SAMPLE": json.dumps(sample),
        }
        proc = await asyncio.create_subprocess_exec(
            *self.command,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = await proc.communicate()
        except BaseException:  # cancelled (timeout): the program and its process group go
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            # bounded: a child that left the group may hold the pipes open; it is not waited for
            with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                await asyncio.wait_for(proc.wait(), _KILL_WAIT_S)
            raise
        if proc.returncode != 0:
            tail = (out + err).decode(errors="replace")[-_OUTPUT_TAIL:]
            raise AgentCrashed(f"{self.command} exited with {proc.returncode}: {tail}")
        lines = out.decode(errors="replace").strip().splitlines()  # the reward: the last line of stdout
        try:
            return _reward_of(json.loads(lines[-1])) if lines else None
        except ValueError:
            logger.debug("gateway_agent: the program's last line is not a reward: %r", lines[-1][:200])
            return None

    def _outputs(
        self, trajectories: list[Trajectory], session: GatewaySession, outcome: dict[str, int], reward: float | None
    ) -> list[AgentLoopOutput]:
        """The session's outputs, the final one last; the sample client's version record becomes theirs, in order
        (the worker gives each output its own)."""
        limit = int(self.rollout_config.response_length)
        snapshot = session.snapshot()
        snapshot["dropped_trajectories"] = snapshot["trajectories"] - len(trajectories)
        counters = {f"gateway_{k}": v for k, v in {**snapshot, **outcome}.items()}
        counters["generate_sequences"] = session.generate_seconds
        outputs, versions = [], []
        for trajectory in trajectories:
            mask = trajectory.mask[:limit]
            versions += trajectory.versions[: sum(mask)]
            outputs.append(
                AgentLoopOutput(
                    prompt_ids=trajectory.prompt_ids,
                    response_ids=trajectory.response_ids[:limit],
                    response_mask=mask,
                    response_logprobs=trajectory.logprobs[:limit],
                    reward_score=reward,
                    num_turns=len(trajectory.context) if isinstance(trajectory.context, list) else 2 * trajectory.turns,
                    metrics=counters,
                    extra_fields={"gateway_session": session.session_id},
                )
            )
        record = getattr(self.server_manager, "token_versions", None)
        if isinstance(record, list):  # the sample client's record: the outputs' generated tokens only
            record[:] = versions
        return outputs
