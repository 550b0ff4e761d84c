"""The agent gateway on the real hf engine: an ``openai``-client agent talks to the gateway over HTTP on localhost,
the gateway serves it through the request API, and the captured trajectories are compared with what the engine
returned, token for token.

The model is the tool demo's fresh tiny Qwen2 (random weights): its outputs are arbitrary token sequences, often not
the tokenizer's own spelling of their text, so re-tokenizing the conversation would change them — which is exactly
what the capture must not do (``retokenization_drift`` counts the requests where it would have). The tool-call
parser in most of these tests is a test parser that reads every reply as a calculator call, so the agent echoes
assistant messages with ``tool_calls`` that the chat template re-renders in its own spelling.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap

import pytest
from omegaconf import OmegaConf

from verl.experimental.agent_gateway import AgentGateway, ConversationCapture, GatewayAgentLoop, GatewaySession
from verl.experimental.agent_loop.agent_loop import DictConfigWrap
from verl.experimental.agent_loop.server_manager import SampleClient
from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser
from verl.utils.demo_tools import TOOL_CHAT_TEMPLATE, ensure_tool_demo_assets
from verl.workers.config.rollout import RolloutConfig
from verl.workers.rollout.hf_rollout import HFRollout

openai = pytest.importorskip("openai", reason="the openai client is in the test extras")

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "evaluate an arithmetic expression",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}

# Qwen2.5's layout: a newline after each end-of-turn token, the tools in the system turn
CHATML_NEWLINES = (
    "{%- if tools %}{{ '<|im_start|>system\\nTools: ' + (tools | map(attribute='function.name') | join(', ')) "
    "+ '<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + (m.content or '') }}"
    "{%- for call in m.tool_calls or [] %}{{ '<tool_call>\\n' + (call.function | tojson) + '\\n</tool_call>' }}"
    "{%- endfor %}{{ '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
# a template that trims what it renders: a reply with spaces at either end re-renders as other text
TRIMMING = CHATML_NEWLINES.replace("(m.content or '')", "(m.content or '') | trim")
TEMPLATES = {"tool_demo": TOOL_CHAT_TEMPLATE, "chatml_newlines": CHATML_NEWLINES, "trimming": TRIMMING}

GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "logprobs": True}


class EveryReplyCalls(ToolParser):
    """A test parser: every reply is one calculator call whose expression is the reply's first 12 characters."""

    def parse_text(self, text, tools=None):
        return "", [FunctionCall(name="calculator", arguments=json.dumps({"expression": text[:12]}))], []


class Recording:
    """The engine as the session's client, every (prompt, output) recorded."""

    def __init__(self, engine: HFRollout) -> None:
        self.engine, self.calls = engine, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        output = await self.engine.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)
        self.calls.append((list(prompt_ids), output))
        return output


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return ensure_tool_demo_assets(tmp_path_factory.getbasetemp() / "verl_cache").model_path


@pytest.fixture(scope="module")
def engine(model_path):
    config = RolloutConfig(dtype="float32", prompt_length=256, response_length=256, max_num_seqs=8, seed=3)
    rollout = HFRollout(config, model_path)
    yield rollout
    rollout.close()


@pytest.fixture
def tokenizer(model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def session_for(client, tokenizer, parser=None, response_length=200, sampling=None) -> GatewaySession:
    return GatewaySession(
        session_id="s-test",
        client=client,
        capture=ConversationCapture(tokenizer),
        sampling_params=dict(sampling or GREEDY),
        prompt_length=128,
        response_length=response_length,
        tool_parser=parser,
    )


async def agent_conversation(base_url: str, key: str, turns: int = 3, max_tokens: int = 12, on_turn=None):
    """A user's agent written against the openai client: a question, then tool answers and a user follow-up."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0)
    messages = [{"role": "user", "content": "What is 3 + 4?"}]
    replies = []
    for turn in range(turns):
        if on_turn is not None:
            await on_turn(turn)
        response = await client.chat.completions.create(
            model="policy", messages=messages, tools=[CALCULATOR], max_tokens=max_tokens, logprobs=True
        )
        message = response.choices[0].message
        replies.append(response)
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": f" 7 ({turn})"})
        if not message.tool_calls:
            messages.append({"role": "user", "content": "And then?"})
    await client.close()
    return messages, replies


def run_with_gateway(session: GatewaySession, agent, *args, **kwargs):
    async def go():
        gateway = AgentGateway()
        await gateway.start()
        key = gateway.open(session)
        try:
            return await agent(gateway.base_url, key, *args, **kwargs)
        finally:
            gateway.close(key)
            await gateway.stop()

    return asyncio.run(go())


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_recorded_tokens_are_the_engines_bit_for_bit(engine, tokenizer, template):
    """Three turns with tool answers in between: the trajectory's generated tokens, log-probs and weight versions are
    the engine's outputs, the tokens between them are the template's text for the appended messages, and each
    prompt sent is the recorded tokens so far plus those."""
    tokenizer.chat_template = TEMPLATES[template]
    client = Recording(engine)
    session = session_for(client, tokenizer, EveryReplyCalls(tokenizer))
    messages, replies = run_with_gateway(session, agent_conversation)
    capture = session.capture
    (trajectory,) = capture.trajectories
    assert trajectory is capture.last and len(client.calls) == 3 and trajectory.turns == 3
    generated = [t for t, m in zip(trajectory.response_ids, trajectory.mask) if m == 1]
    assert generated == [t for _, out in client.calls for t in out.token_ids]
    assert [lp for lp, m in zip(trajectory.logprobs, trajectory.mask) if m] == [
        lp for _, out in client.calls for lp in out.log_probs
    ]
    assert trajectory.versions == [v for _, out in client.calls for v in out.weight_versions]
    assert all(lp == 0.0 for lp, m in zip(trajectory.logprobs, trajectory.mask) if m == 0)
    # each request's prompt is the previous prompt + its output + the appended text's tokens
    for (prompt, out), (next_prompt, _) in zip(client.calls, client.calls[1:]):
        assert next_prompt[: len(prompt) + len(out.token_ids)] == prompt + out.token_ids
    assert client.calls[0][0] == trajectory.prompt_ids
    assert (
        trajectory.prompt_ids + trajectory.response_ids[: len(client.calls[-1][0]) - len(trajectory.prompt_ids)]
        == (client.calls[-1][0])
    )
    # the reply the agent saw: the returned log-probs are the engine's, the tool calls are the parser's
    for reply, (_, out) in zip(replies, client.calls):
        assert [c.logprob for c in reply.choices[0].logprobs.content] == pytest.approx(out.log_probs, abs=0)
        assert reply.choices[0].message.tool_calls[0].function.name == "calculator"
        assert reply.usage.completion_tokens == len(out.token_ids)
    counters = session.snapshot()
    assert counters["requests"] == 3 and counters["prefix_mismatches"] == 0 and counters["trajectories"] == 1
    # the random model's tokens are not the tokenizer's spelling of their text: re-tokenizing would change them
    text_retokenized = tokenizer.encode(capture.render(messages[:-1], [CALCULATOR], True), add_special_tokens=False)
    assert counters["retokenization_drift"] >= 1 and text_retokenized != client.calls[-1][0]


@pytest.mark.parametrize("calls", [False, True], ids=["text", "tool_calls"])
def test_streaming_and_non_streaming_agree(engine, tokenizer, calls):
    tokenizer.chat_template = CHATML_NEWLINES

    async def both(base_url, key, stream_key):
        answers = []
        for k, streamed in ((key, False), (stream_key, True)):
            client = openai.AsyncOpenAI(base_url=base_url, api_key=k, max_retries=0)
            args = {"model": "policy", "messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 10}
            if not streamed:
                response = await client.chat.completions.create(**args, logprobs=True)
                choice = response.choices[0]
                made = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
                logprobs = [c.logprob for c in choice.logprobs.content]
                answers.append((choice.message.content, logprobs, made, choice.finish_reason))
            else:
                text, logprobs, made, finish = "", [], [], None
                async for chunk in await client.chat.completions.create(**args, logprobs=True, stream=True):
                    choice = chunk.choices[0]
                    text += choice.delta.content or ""
                    logprobs += [c.logprob for c in (choice.logprobs.content if choice.logprobs else None) or []]
                    made += [(c.function.name, c.function.arguments) for c in choice.delta.tool_calls or []]
                    finish = choice.finish_reason or finish
                answers.append((text, logprobs, made, finish))
            await client.close()
        return answers

    parser = EveryReplyCalls(tokenizer) if calls else None
    sessions = [session_for(Recording(engine), tokenizer, parser) for _ in range(2)]

    async def go():
        gateway = AgentGateway()
        await gateway.start()
        keys = [gateway.open(s) for s in sessions]
        try:
            return await both(gateway.base_url, *keys)
        finally:
            await gateway.stop()

    plain, streamed = asyncio.run(go())
    assert plain == streamed and len(plain[1]) == 10 and plain[3] == "length"
    assert len(plain[2]) == (1 if calls else 0) and (plain[0] == "") == calls
    assert sessions[0].capture.last.response_ids == sessions[1].capture.last.response_ids


def test_a_rewritten_history_n_choices_and_completions(engine, tokenizer):
    """A history the agent edits matches no trajectory: counted, and a new one starts; ``n=2`` makes two
    trajectories; the Completions route extends text by its tokens."""
    tokenizer.chat_template = CHATML_NEWLINES
    session = session_for(Recording(engine), tokenizer, sampling={**GREEDY, "temperature": 1.0, "seed": 5})

    async def agent(base_url, key):
        client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0)
        messages = [{"role": "user", "content": "What is 1 + 1?"}]
        first = await client.chat.completions.create(model="policy", messages=messages, max_tokens=8, n=2)
        kept = first.choices[1].message
        follow = [*messages, kept.model_dump(exclude_none=True), {"role": "user", "content": "Sure?"}]
        await client.chat.completions.create(model="policy", messages=follow, max_tokens=8)
        edited = [*messages, {"role": "assistant", "content": "2"}, {"role": "user", "content": "Sure?"}]
        await client.chat.completions.create(model="policy", messages=edited, max_tokens=8, temperature=0.3)
        text = await client.completions.create(model="policy", prompt="3 + 4 =", max_tokens=6)
        more = await client.completions.create(
            model="policy", prompt="3 + 4 =" + text.choices[0].text + " so", max_tokens=4
        )
        await client.close()
        return first, text, more

    first, text, more = run_with_gateway(session, agent)
    counters = session.snapshot()
    assert len(first.choices) == 2
    assert counters["requests"] == 5 and counters["prefix_mismatches"] == 2  # the edited history, the first text
    assert counters["ignored_sampling_params"] == 1  # temperature=0.3 asked, the run's 1.0 used
    # chat: choice 0 of n=2 (never continued), choice 1 continued, the edited history; text: one trajectory extended
    assert counters["trajectories"] == 4
    last = session.capture.last
    assert last.context.startswith("3 + 4 =") and last.turns == 2 and last.mask.count(0) >= 1
    assert len(text.choices[0].text) > 0 and more.choices[0].finish_reason == "length"


def test_a_weight_push_mid_conversation_keeps_per_token_versions(engine, tokenizer, model_path):
    """The trainer pushes weights between two turns and during the third: each generated token keeps the version
    that produced it."""
    from transformers import AutoModelForCausalLM

    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    weights = AutoModelForCausalLM.from_pretrained(model_path).state_dict()
    start = engine.weight_version
    client = Recording(engine)
    session = session_for(client, tokenizer, EveryReplyCalls(tokenizer))

    async def push(turn):
        if turn == 1:
            await asyncio.get_running_loop().run_in_executor(None, engine.update_weights, weights.items())

    run_with_gateway(session, agent_conversation, turns=3, on_turn=push)
    versions = session.capture.last.versions
    first = len(client.calls[0][1].token_ids)
    assert set(versions[:first]) == {start} and set(versions[first:]) == {start + 1}
    assert versions == [v for _, out in client.calls for v in out.weight_versions]


# ---------------------------------------------------------------------------------------------- the agent loop


def loop_config(model_path: str, response_length: int = 96):
    rollout = {"prompt_length": 64, "response_length": response_length, "multi_turn": {"format": "hermes"}}
    return OmegaConf.create({"actor_rollout_ref": {"rollout": rollout, "model": {"path": model_path}}, "data": {}})


def run_loop(engine, tokenizer, model_path, fields=None, **entry):
    client = SampleClient(engine if isinstance(engine, Recording) else Recording(engine))

    async def go():
        loop = GatewayAgentLoop(
            trainer_config=DictConfigWrap(loop_config(model_path)), server_manager=client, tokenizer=tokenizer, **entry
        )
        return await loop.run(
            dict(GREEDY), raw_prompt=[{"role": "user", "content": "What is 5 - 2?"}], **(fields or {})
        )

    return asyncio.run(go()), client


AGENT_FILE = textwrap.dedent(
    """
    import openai

    async def solve(base_url, api_key, sample):
        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        messages = list(sample["raw_prompt"])
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Again"}]
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
        await client.close()
        return {"reward": 0.25 if sample["extra_info"]["index"] == 7 else None}

    async def solve_drafts(base_url, api_key, sample):  # two drafts, the second one continued: two trajectories
        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        messages = list(sample["raw_prompt"])
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=4, n=2)
        messages += [reply.choices[1].message.model_dump(exclude_none=True), {"role": "user", "content": "Again"}]
        await client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
        await client.close()
        return 0.5

    def solve_sync(base_url, api_key, sample):  # a plain function with the blocking client: run in a thread
        client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        reply = client.chat.completions.create(model="policy", messages=list(sample["raw_prompt"]), max_tokens=3)
        return 0.75 if reply.choices[0].finish_reason == "length" else 0.0
    """
)

PROGRAM = textwrap.dedent(
    """
    import os, signal, sys, time
    from openai import OpenAI

    client = OpenAI(max_retries=0)  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    what = sys.argv[1]
    if what == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    elif what == "sleeps":
        open(sys.argv[2], "w").write(str(os.getpid()))
        time.sleep(600)
    print('{"reward": 0.5}')
    """
)


def test_the_agent_loop_runs_a_function_agent_and_takes_its_reward(engine, tokenizer, model_path, tmp_path):
    tokenizer.chat_template = CHATML_NEWLINES
    (tmp_path / "agent.py").write_text(AGENT_FILE)
    spec = f"{tmp_path / 'agent.py'}:solve"
    [output], client = run_loop(engine, tokenizer, model_path, {"extra_info": {"index": 7}}, agent=spec)
    assert output.reward_score == 0.25 and output.num_turns == 4 and sum(output.response_mask) <= 12
    engine_outputs = [out for _, out in client.client.calls]
    generated = [t for t, m in zip(output.response_ids, output.response_mask) if m]
    assert generated == [t for out in engine_outputs for t in out.token_ids]
    assert client.token_versions == [v for out in engine_outputs for v in out.weight_versions]
    assert output.metrics.gateway_requests == 2 and output.metrics.gateway_agent_crashes == 0
    # no reward from the agent: the run's reward function scores the trajectory
    [output], _ = run_loop(engine, tokenizer, model_path, {"extra_info": {"index": 8}}, agent=spec)
    assert output.reward_score is None
    [output], _ = run_loop(engine, tokenizer, model_path, agent=f"{tmp_path / 'agent.py'}:solve_sync")
    assert output.reward_score == 0.75 and output.response_mask == [1, 1, 1]


def test_a_session_that_splits_returns_every_trajectory_the_final_one_last(engine, tokenizer, model_path, tmp_path):
    """veRL 0.10's multi-output sessions: two drafts, one continued; both trajectories come back (the continued one
    last, as the session's final output), each with its own tokens and versions; ``trajectories: last`` keeps the
    final one and counts the other as dropped."""
    tokenizer.chat_template = CHATML_NEWLINES
    (tmp_path / "agent.py").write_text(AGENT_FILE)
    spec = f"{tmp_path / 'agent.py'}:solve_drafts"
    outputs, client = run_loop(engine, tokenizer, model_path, agent=spec)
    draft, final = outputs
    calls = [out for _, out in client.client.calls]
    assert len(calls) == 3 and draft.reward_score == final.reward_score == 0.5

    def generated(output):
        return [t for t, m in zip(output.response_ids, output.response_mask) if m]

    first = [list(calls[0].token_ids), list(calls[1].token_ids)]
    assert generated(draft) in first and final.num_turns == 4 and draft.num_turns == 2
    assert generated(final)[: -len(calls[2].token_ids)] in first and generated(final)[-len(calls[2].token_ids) :] == (
        list(calls[2].token_ids)
    )
    assert len(client.token_versions) == len(generated(draft)) + len(generated(final))  # the worker splits them
    assert final.metrics.gateway_trajectories == 2 and final.metrics.gateway_dropped_trajectories == 0
    [only], _ = run_loop(engine, tokenizer, model_path, agent=spec, trajectories="last")
    assert only.num_turns == 4 and only.metrics.gateway_dropped_trajectories == 1
    with pytest.raises(ValueError, match="trajectories='some'"):
        run_loop(engine, tokenizer, model_path, agent=spec, trajectories="some")


class Failing(Recording):
    """The rollout servers failing a sample's second request."""

    async def generate(self, request_id, **kwargs):
        if self.calls:
            raise RuntimeError("the rollout server exploded")
        return await super().generate(request_id, **kwargs)


def test_a_request_the_gateway_fails_fails_the_sample_not_the_agent(engine, tokenizer, model_path, tmp_path):
    """An error of ours or of the servers reaches the agent as a 500 and fails the sample, naming it: it is never
    scored as the agent's own failure."""
    tokenizer.chat_template = CHATML_NEWLINES
    (tmp_path / "agent.py").write_text(AGENT_FILE)
    with pytest.raises(RuntimeError, match="gateway failed 1 request.*the rollout server exploded"):
        run_loop(
            Failing(engine), tokenizer, model_path, {"extra_info": {"index": 7}}, agent=f"{tmp_path / 'agent.py'}:solve"
        )


def test_a_killed_a_runaway_and_a_silent_agent_are_bounded_and_counted(engine, tokenizer, model_path, tmp_path):
    tokenizer.chat_template = CHATML_NEWLINES
    (tmp_path / "agent_program.py").write_text(PROGRAM)
    command = [sys.executable, str(tmp_path / "agent_program.py")]
    [output], _ = run_loop(engine, tokenizer, model_path, command=[*command, "ok"])
    assert output.reward_score == 0.5 and output.metrics.gateway_agent_crashes == 0
    [output], _ = run_loop(engine, tokenizer, model_path, command=[*command, "killed"])
    assert output.metrics.gateway_agent_crashes == 1 and output.reward_score == 0.0
    assert output.response_mask.count(1) >= 1  # the one request it made is its trajectory
    pid_file = tmp_path / "pid"
    [output], _ = run_loop(engine, tokenizer, model_path, command=[*command, "sleeps", str(pid_file)], timeout_s=20)
    assert output.metrics.gateway_agent_timeouts == 1 and output.reward_score == 0.0
    with pytest.raises(ProcessLookupError):  # the runaway's process is gone
        os.kill(int(pid_file.read_text()), 0)
    with pytest.raises(RuntimeError, match="crashed without sending a request"):
        run_loop(engine, tokenizer, model_path, command=[sys.executable, "-c", "raise SystemExit(3)"])


def test_a_session_keeps_its_budget_ends_with_its_sample_and_limits_its_requests(engine, tokenizer):
    tokenizer.chat_template = CHATML_NEWLINES
    session = session_for(Recording(engine), tokenizer, response_length=2)
    session.max_requests = 2

    async def agent(base_url, key):
        client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0)
        messages = [{"role": "user", "content": "hi"}]
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=5)
        assert reply.usage.completion_tokens == 2  # capped by what is left of rollout.response_length
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
        with pytest.raises(openai.BadRequestError, match="context_length_exceeded|response tokens"):
            await client.chat.completions.create(model="policy", messages=messages, max_tokens=2)
        with pytest.raises(openai.BadRequestError, match="response_format"):  # not served: refused by name
            await client.chat.completions.create(
                model="policy", messages=messages, max_tokens=1, response_format={"type": "json_object"}
            )
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model="policy", messages=messages, max_tokens=2)
        with pytest.raises(openai.AuthenticationError):
            await openai.AsyncOpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
        await client.close()
        return key

    key = run_with_gateway(session, agent)
    counters = session.snapshot()
    assert counters["refused_requests"] == 1 and counters["over_budget_requests"] == 1
    assert session.closed and key  # the key is dead once the sample is done

    async def after():
        gateway = AgentGateway()
        await gateway.start()
        try:
            client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
            with pytest.raises(openai.AuthenticationError):
                await client.models.list()
        finally:
            await gateway.stop()

    asyncio.run(after())


def test_a_stop_string_cuts_the_tokens_after_it(engine, tokenizer):
    """The same greedy completion with a stop string taken from its middle: the text ends before the stop string,
    and the trajectory keeps the tokens up to the one that completed it, a prefix of the uncut ones."""
    sessions = [session_for(Recording(engine), tokenizer) for _ in range(2)]

    async def agent(base_url, key, stop=None):
        client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0)
        reply = await client.completions.create(model="policy", prompt="3 + 4 =", max_tokens=16, stop=stop)
        if stop:  # a ReAct agent writes the stop string itself and goes on: the trajectory continues
            text = "3 + 4 =" + reply.choices[0].text
            await client.completions.create(model="policy", prompt=text + stop[0] + " 7", max_tokens=2)
            # without the stop string the prompt is not what the policy saw: a new trajectory
            await client.completions.create(model="policy", prompt=text + " 7", max_tokens=2)
        await client.close()
        return reply.choices[0]

    full = run_with_gateway(sessions[0], agent)
    text, uncut = full.text, sessions[0].capture.last.response_ids

    def starts_at(k):  # where token k's text starts in the decoded reply
        return len(tokenizer.decode(uncut[:k], skip_special_tokens=True))

    # a stop string that is one whole token's text, first seen exactly there: the cut ends on a token boundary
    stop = next(
        piece
        for k in range(len(uncut) // 2, len(uncut))
        if (piece := tokenizer.decode(uncut[k : k + 1], skip_special_tokens=True)).strip()
        and text.find(piece) == starts_at(k)
    )
    cut = run_with_gateway(sessions[1], agent, [stop])
    assert cut.text == text[: text.index(stop)] and cut.finish_reason == "stop"
    continued_trajectory = sessions[1].capture.trajectories[0]
    kept = continued_trajectory.response_ids[: continued_trajectory.mask.index(0)]  # the cut reply's tokens
    assert len(kept) < len(uncut) == 16 and uncut[: len(kept)] == kept
    assert stop in tokenizer.decode(kept, skip_special_tokens=True)
    assert stop not in tokenizer.decode(kept[:-1], skip_special_tokens=True)
    counters = sessions[1].snapshot()
    assert counters["stop_cuts"] == 1 and counters["prefix_mismatches"] == 1 and counters["trajectories"] == 2
    (first_prompt, _), (continued, _), (fresh, _) = sessions[1].client.calls
    assert continued == first_prompt + kept + tokenizer.encode(" 7", add_special_tokens=False)
    assert fresh == tokenizer.encode("3 + 4 =" + cut.text + " 7", add_special_tokens=False)
