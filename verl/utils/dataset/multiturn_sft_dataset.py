"""``MultiTurnSFTDataset``: conversations (a column of chat messages) from parquet; the loss is on the assistant
turns only.

A row::

    {"messages": [{"role": "system", "content": "..."},
                  {"role": "user", "content": "What is 3 + 4?"},
                  {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                       "function": {"name": "add", "arguments": {"a": 3, "b": 4}}}]},
                  {"role": "tool", "content": "7"},
                  {"role": "assistant", "content": "The answer is 7."}],
     "tools": [{"type": "function", "function": {"name": "add", ...}}],    # optional (data.multiturn.tools_key)
     "enable_thinking": false}                                             # optional (enable_thinking_key)

The conversation is rendered with ``apply_chat_template(messages, tools=tools, **apply_chat_template_kwargs)``
(``enable_thinking=`` too when the row has that column and it is not null), so tool schemas and assistant tool
calls appear in the text as the template writes them. Tool-call ``arguments`` given as a JSON string are parsed
into a mapping first (Hugging Face templates expect one); ``tools`` may be a list of schemas or a JSON string.

Which tokens are trained is found by rendering message prefixes with the same template: message ``i`` spans the
characters from the end of the render of ``messages[:i]`` to the end of the render of ``messages[:i+1]``; for an
assistant message the span starts after the render of ``messages[:i]`` with ``add_generation_prompt=True`` (the
role header is not trained, the content and the template's end-of-turn marker are). Each span is tokenized on its
own and the pieces concatenated, so the boundaries are exact; ``loss_mask`` is 1 on the assistant spans only. A
template whose render of a prefix is not a prefix of the whole render (one that rewrites earlier turns) cannot be
split this way: such a row fails, naming it. Items, length rules and errors are those of
:class:`~verl.utils.dataset.sft_dataset.SFTDataset`.

Config keys: ``multiturn.messages_key`` [messages], ``multiturn.tools_key`` [tools], ``multiturn.enable_thinking_key``
[enable_thinking], and ``max_length``, ``truncation``, ``apply_chat_template_kwargs`` as for ``SFTDataset``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from verl.utils.dataset.sft_dataset import (
    RowProblem,
    TokenizedSFTDataset,
    check_messages,
    config_get,
    plain,
    read_rows,
)

__all__ = ["MultiTurnSFTDataset"]

logger = logging.getLogger(__name__)


def _parse_arguments(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool-call arguments stored as a JSON string become a mapping (what chat templates render)."""
    for message in messages:
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                try:
                    parsed = json.loads(function["arguments"])
                except json.JSONDecodeError:
                    continue
                if isinstance(parsed, dict):
                    function["arguments"] = parsed
    return messages


class MultiTurnSFTDataset(TokenizedSFTDataset):
    """Multi-turn SFT conversations from parquet files (see the module docstring).

    Args:
        parquet_files: a parquet file or a list of them.
        tokenizer: a Hugging Face tokenizer with a chat template (or its path).
        config: the ``data`` config (its ``multiturn`` section names the columns).
        max_samples: keep the first rows only (-1: all).
    """

    def __init__(self, parquet_files: Any, tokenizer: Any, config: Any = None, max_samples: int = -1) -> None:
        self._setup(parquet_files, tokenizer, config)
        multiturn = config_get(config, "multiturn", {})
        self.messages_key = config_get(multiturn, "messages_key", "messages")
        self.tools_key = config_get(multiturn, "tools_key", "tools")
        self.enable_thinking_key = config_get(multiturn, "enable_thinking_key", "enable_thinking")
        columns = {self.messages_key: "data.multiturn.messages_key"}
        self._build(read_rows(self.parquet_files, columns, max_samples), self._encode, "multi-turn SFT")

    def _tools(self, row: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        tools = plain(row.get(self.tools_key), drop_none=True)
        if tools is None:
            return None
        if isinstance(tools, str):
            try:
                tools = json.loads(tools)
            except json.JSONDecodeError as e:
                raise RowProblem(f"column {self.tools_key!r}: not valid JSON ({e})") from e
        if not isinstance(tools, list) or not all(isinstance(t, Mapping) for t in tools):
            raise RowProblem(f"column {self.tools_key!r}: expected a list of tool schemas, got {type(tools).__name__}")
        return tools or None

    def _template_kwargs(self, row: Mapping[str, Any]) -> dict[str, Any]:
        kwargs = dict(self.apply_chat_template_kwargs)
        tools = self._tools(row)
        if tools is not None:
            kwargs["tools"] = tools
        thinking = row.get(self.enable_thinking_key)
        if thinking is not None:
            if not isinstance(thinking, bool):
                raise RowProblem(f"column {self.enable_thinking_key!r}: expected true/false, got {thinking!r}")
            kwargs["enable_thinking"] = thinking
        return kwargs

    def _render(self, messages: list[dict[str, Any]], kwargs: dict[str, Any], generation_prompt: bool) -> str:
        try:
            options = {**kwargs, "add_generation_prompt": generation_prompt, "tokenize": False}
            return self.tokenizer.apply_chat_template(messages, **options)
        except Exception as e:  # a template error is the row's problem
            raise RowProblem(
                f"column {self.messages_key!r}: the chat template failed on {len(messages)} message(s): "
                f"{type(e).__name__}: {e}"
            ) from e

    def spans(self, row: Mapping[str, Any]) -> tuple[str, list[tuple[int, int, bool]]]:
        """The rendered conversation and its pieces ``(start, end, trained)`` in characters, in order."""
        messages = _parse_arguments(check_messages(plain(row[self.messages_key], drop_none=True), self.messages_key))
        if not any(m["role"] == "assistant" for m in messages):
            raise RowProblem(f"column {self.messages_key!r}: no assistant message (nothing to train on)")
        kwargs = self._template_kwargs(row)
        full = self._render(messages, kwargs, generation_prompt=False)
        pieces: list[tuple[int, int, bool]] = []
        done = 0
        for i, message in enumerate(messages):
            end = len(self._prefix(messages[: i + 1], kwargs, False, full, i))
            if message["role"] == "assistant":
                start = len(self._prefix(messages[:i], kwargs, True, full, i))
                if not done <= start <= end:
                    raise RowProblem(f"column {self.messages_key!r}[{i}]: the assistant header does not fit its turn")
                pieces += [(done, start, False), (start, end, True)]
            else:
                pieces.append((done, end, False))
            done = end
        pieces.append((done, len(full), False))
        return full, [p for p in pieces if p[1] > p[0]]

    def _prefix(self, messages: list, kwargs: dict, generation_prompt: bool, full: str, index: int) -> str:
        text = self._render(messages, kwargs, generation_prompt) if messages or generation_prompt else ""
        if not full.startswith(text):
            raise RowProblem(
                f"column {self.messages_key!r}[{index}]: the chat template renders the first {len(messages)} "
                "message(s) differently from the start of the whole conversation (it rewrites earlier turns), so "
                "the assistant turns cannot be located; use a template that renders turns independently "
                "(data.chat_template)"
            )
        return text

    def _encode(self, row: Mapping[str, Any]) -> tuple[list[int], list[int]]:
        full, pieces = self.spans(row)
        ids: list[int] = []
        mask: list[int] = []
        for start, end, trained in pieces:
            piece = self._tokenize(full[start:end])
            ids += piece
            mask += [int(trained)] * len(piece)
        return ids, mask
