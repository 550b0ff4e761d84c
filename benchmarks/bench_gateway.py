"""The agent gateway's cost per request against the in-process agent loop's path, on the same hf engine.

    python benchmarks/bench_gateway.py [--agents 1 64] [--turns 3] [--new-tokens 8] [--repeats 3]

Both sides hold the same conversations: a user question, then ``--turns`` model turns, each followed by a tool
answer (the tool demo's model, tokenizer and chat template, with its calculator tool; greedy decoding, exactly
``--new-tokens`` tokens a turn, EOS ignored), ``--agents`` conversations at once.

* ``in-process``: what an AgentLoop does — the chat template renders the appended tool turn, its tokens are appended
  to the recorded ones, ``await engine.generate(...)``.
* ``gateway``: an ``openai.AsyncOpenAI`` agent per conversation sends the messages over HTTP to the gateway (on
  localhost, in the same process and event loop); the gateway matches them to the recorded tokens, generates through
  the same engine, parses the reply and answers.

The figure is the wall time per request (a model turn) of each side and their difference, the gateway's overhead per
request (the agents' clients are made before the clock starts: making an ``openai`` client loads the system's CA
certificates, a cost of the agent's own, printed apart); with many agents at once the requests overlap, so the
difference per request is what the gateway adds to the step, spread over the batch. Each figure is the median of
``--repeats`` runs after one untimed run of each side.
The two sides get the same tokens (checked).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import openai  # noqa: E402

from verl.experimental.agent_gateway import AgentGateway, ConversationCapture, GatewaySession  # noqa: E402
from verl.utils.demo_tools import ensure_tool_demo_assets  # noqa: E402
from verl.utils.token_ids import as_token_ids  # noqa: E402
from verl.workers.config.rollout import RolloutConfig  # noqa: E402
from verl.workers.rollout.hf_rollout import HFRollout  # noqa: E402

QUESTION = [{"role": "user", "content": "What is 3 + 4?"}]


async def in_process(engine, tokenizer, index: int, turns: int, params: dict) -> list[int]:
    """One conversation the way an agent loop holds it: tokens appended turn by turn."""
    ids = as_token_ids(tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True), "prompt")
    generated = []
    for turn in range(turns):
        out = await engine.generate(f"in-{index}-{turn}", prompt_ids=ids, sampling_params=params)
        generated += out.token_ids
        tool = [{"role": "tool", "content": "7"}]
        text = tokenizer.apply_chat_template(tool, add_generation_prompt=True, tokenize=False)
        # the turn was cut by length: its end-of-turn token comes before the tool turn (what the gateway adds too)
        ids = ids + out.token_ids + tokenizer.encode(tokenizer.eos_token + text, add_special_tokens=False)
    return generated


async def through_gateway(client: openai.AsyncOpenAI, turns: int, new_tokens: int) -> None:
    """One conversation by an openai-client agent."""
    messages = list(QUESTION)
    for _ in range(turns):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=new_tokens)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "content": "7"}]
    await client.close()


async def measure(engine, tokenizer, agents: int, turns: int, new_tokens: int) -> tuple[float, float, float, bool]:
    """(in-process s, gateway s, s to make one openai client, same tokens) for ``agents`` conversations at once."""
    params = {"temperature": 0.0, "ignore_eos": True, "max_tokens": new_tokens, "logprobs": True}
    start = time.perf_counter()
    direct = await asyncio.gather(*(in_process(engine, tokenizer, i, turns, params) for i in range(agents)))
    direct_s = time.perf_counter() - start

    gateway = AgentGateway()
    await gateway.start()
    sessions = [
        GatewaySession(
            session_id=f"gw-{i}-{time.monotonic_ns()}",
            client=engine,
            capture=ConversationCapture(tokenizer),
            sampling_params={k: v for k, v in params.items() if k != "max_tokens"},
            prompt_length=256,
            response_length=256,
        )
        for i in range(agents)
    ]
    start = time.perf_counter()
    clients = [openai.AsyncOpenAI(base_url=gateway.base_url, api_key=gateway.open(s), max_retries=0) for s in sessions]
    client_s = (time.perf_counter() - start) / agents
    start = time.perf_counter()
    await asyncio.gather(*(through_gateway(client, turns, new_tokens) for client in clients))
    gateway_s = time.perf_counter() - start
    await gateway.stop()
    captured = [[t for t, m in zip(s.capture.last.response_ids, s.capture.last.mask) if m] for s in sessions]
    return direct_s, gateway_s, client_s, captured == direct


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    model = ensure_tool_demo_assets(args.cache_dir).model_path
    tokenizer = AutoTokenizer.from_pretrained(model)
    config = RolloutConfig(dtype="float32", prompt_length=256, response_length=256, max_num_seqs=max(args.agents))
    engine = HFRollout(config, model)
    print(
        "| agents at once | requests | in-process s/request | gateway s/request | overhead ms/request | "
        "openai client made, ms/agent | same tokens |"
    )
    print("|---:|---:|---:|---:|---:|---:|---|")
    for agents in args.agents:
        asyncio.run(measure(engine, tokenizer, agents, args.turns, args.new_tokens))  # warm-up
        runs = [
            asyncio.run(measure(engine, tokenizer, agents, args.turns, args.new_tokens)) for _ in range(args.repeats)
        ]
        requests = agents * args.turns
        direct = statistics.median(r[0] for r in runs) / requests
        gateway = statistics.median(r[1] for r in runs) / requests
        client = statistics.median(r[2] for r in runs)
        same = all(r[3] for r in runs)
        print(
            f"| {agents} | {requests} | {direct * 1e3:.1f} ms | {gateway * 1e3:.1f} ms | "
            f"{(gateway - direct) * 1e3:.1f} | {client * 1e3:.1f} | {'yes' if same else 'NO'} |"
        )
    engine.close()


if __name__ == "__main__":
    main()
