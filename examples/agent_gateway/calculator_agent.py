"""A calculator agent written against the OpenAI API, with nothing of verl in it: the kind of agent the gateway trains.

It asks the model the question with one tool, ``calculator(expression)``; while the model calls the tool, it
evaluates the expression itself and sends the value back; it stops when the model answers without a call, or after
three model turns. Run by verl it gets the gateway's URL and a session key; run alone it talks to whatever
OpenAI-compatible server ``OPENAI_BASE_URL`` names.

    solve(base_url, api_key, sample)   # as a function (the gateway loop's ``agent:`` entry)
    python calculator_agent.py         # as a program: OPENAI_BASE_URL, OPENAI_API_KEY, VERL_AGENT_SAMPLE

``solve_with_drafts`` (or the program's ``--drafts``) asks for two drafts of the first reply: the conversation splits,
and the gateway returns both trajectories (veRL 0.10's multi-output sessions).
"""

from __future__ import annotations

import ast
import asyncio
import json
import operator
import os
import sys

import openai

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression and return its value.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 3 + 4 * (2 - 1)"}},
            "required": ["expression"],
        },
    },
}
MAX_TURNS = 3
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.USub: operator.neg}


def calculate(expression: str) -> str:
    """The value of ``+ - *`` arithmetic on integers, or an error text for the model."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError(f"unsupported expression {expression!r}")

    try:
        return str(value(ast.parse(expression.strip(), mode="eval").body))
    except (SyntaxError, ValueError) as e:
        return f"Error: {e}"


_clients: dict[str | None, openai.AsyncOpenAI] = {}


def client_for(base_url: str | None, api_key: str | None) -> openai.AsyncOpenAI:
    """A client for this key. One client per server is made once and copied per key (``with_options`` shares its
    connections): making a client loads the system's CA certificates, ~25 ms each."""
    if base_url not in _clients:
        _clients[base_url] = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    return _clients[base_url].with_options(api_key=api_key)


async def solve(base_url: str | None, api_key: str | None, sample: dict, drafts: int = 1) -> None:
    """Answer the sample's question; the run's reward function scores the conversation (so: return None). With
    ``drafts`` > 1 the first turn asks for that many candidate replies and goes on with the first that calls the
    calculator (else the first one)."""
    client = client_for(base_url, api_key)
    messages = list(sample["raw_prompt"])
    try:
        for turn in range(MAX_TURNS):
            n = drafts if turn == 0 else 1
            response = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR], n=n)
            choice = next((c for c in response.choices if c.message.tool_calls), response.choices[0])
            message = choice.message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls or choice.finish_reason == "length":
                break
            for call in message.tool_calls:
                try:
                    expression = json.loads(call.function.arguments).get("expression", "")
                except (ValueError, AttributeError):
                    expression = ""
                messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(str(expression))})
    except openai.BadRequestError:  # the conversation ran out of its token budget: it ends here
        pass
    return None


async def solve_with_drafts(base_url: str | None, api_key: str | None, sample: dict) -> None:
    """:func:`solve` with two drafts of the first turn: the draft not taken is a trajectory of its own (the gateway
    trains it too: a multi-output session)."""
    return await solve(base_url, api_key, sample, drafts=2)


if __name__ == "__main__":
    drafts = 2 if "--drafts" in sys.argv else 1
    asyncio.run(solve(None, None, json.loads(os.environ["VERL_AGENT_SAMPLE"]), drafts=drafts))
