"""``SFTDataset``: single-turn supervised fine-tuning rows (a prompt column and a response column) from parquet.

A row's prompt is ``row[prompt_key]``, followed into nested structs by ``prompt_dict_keys`` (``[question]`` reads
``row[prompt_key]["question"]``); it is a string (sent as one user message) or a list of chat messages. The
response (``row[response_key]``, nested by ``response_dict_keys``) is a string. The text trained on is::

    apply_chat_template(prompt messages, add_generation_prompt=True)  +  response + eos_token

the prompt and the response tokenized separately (so the boundary is exact), concatenated, and cut to
``max_length`` per ``truncation`` (``error``: fail at start-up; ``left``: keep the last tokens; ``right``: keep the
first). An item holds 1-D tensors of length ``max_length``, right-padded with the pad token: ``input_ids``,
``attention_mask``, ``position_ids`` and ``loss_mask``, which is 1 exactly on the response tokens (the EOS
included): the tokens whose prediction is trained (the trainer scores position ``t`` against ``loss_mask[t]``).

Every row is read and tokenized when the dataset is built, so a missing column, a malformed row or (with
``truncation=error``) a row too long fails at start-up, naming the file, the row and the column.

Config keys (``data.*``; defaults in brackets): ``prompt_key`` [prompt], ``response_key`` [response],
``prompt_dict_keys`` / ``response_dict_keys`` [null], ``max_length`` [1024], ``truncation`` [error],
``apply_chat_template_kwargs`` [{}]. ``max_samples`` keeps the first rows only (-1: all).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

__all__ = ["TRUNCATION_MODES", "SFTDataset", "config_get", "plain"]

logger = logging.getLogger(__name__)

TRUNCATION_MODES = ("error", "left", "right")
_MAX_REPORTED = 10  # problems listed in one error message

Row = tuple[str, int, dict[str, Any]]  # (file, row number in that file, the row)


class RowProblem(ValueError):
    """What is wrong with one row (the caller adds the file and the row number)."""


def config_get(config: Any, key: str, default: Any) -> Any:
    """``config[key]`` from a DictConfig, a mapping or None; ``default`` when it is missing or null."""
    value = config.get(key, None) if config is not None else None
    return default if value is None else value


def plain(value: Any, drop_none: bool = False) -> Any:
    """Parquet values as plain Python: numpy arrays become lists, recursively; with ``drop_none``, dict entries
    whose value is None are left out (parquet fills the fields one struct lacks but another row has with null)."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {k: plain(v, drop_none) for k, v in value.items() if not (drop_none and v is None)}
    if isinstance(value, list | tuple):
        return [plain(v, drop_none) for v in value]
    return value


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_rows(files: Sequence[str], columns: Mapping[str, str], max_samples: int = -1) -> list[Row]:
    """Every row of the parquet ``files`` as ``(file, row number, row)``; ``columns`` maps each required column to
    the config key that names it (a file without one of them is an error naming both). ``max_samples > 0`` keeps
    the first rows only."""
    import pyarrow.parquet as pq

    rows: list[Row] = []
    for path in files:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"data file {path!r} does not exist (data.train_files / data.val_files)")
        try:
            table = pq.read_table(path)
        except Exception as e:  # pyarrow raises several types for a file that is not parquet
            raise ValueError(f"data file {path!r} cannot be read as parquet: {type(e).__name__}: {e}") from e
        for column, key in columns.items():
            if column not in table.column_names:
                raise ValueError(f"data file {path!r} has no column {column!r} ({key}); columns: {table.column_names}")
        rows.extend((path, i, row) for i, row in enumerate(table.to_pylist()))
        if 0 < max_samples <= len(rows):
            return rows[:max_samples]
    return rows


def raise_problems(problems: list[str], total: int, what: str, fix: str) -> None:
    """Raise one ValueError listing the first problems (``total`` of them) when there are any."""
    if not total:
        return
    more = f"\n... and {total - len(problems)} more" if total > len(problems) else ""
    raise ValueError(f"{total} {what}:\n" + "\n".join(problems) + more + f"\n{fix}")


def fit_length(ids: list[int], mask: list[int], max_length: int, truncation: str) -> tuple[list[int], list[int]]:
    """``ids`` and ``mask`` cut to ``max_length`` (``left``: keep the end; ``right``: keep the start)."""
    if len(ids) <= max_length:
        return ids, mask
    if truncation == "left":
        return ids[-max_length:], mask[-max_length:]
    return ids[:max_length], mask[:max_length]


def resolve_tokenizer(tokenizer: Any) -> Any:
    """A tokenizer object (a path or hub name is loaded with ``verl.utils.tokenizer.hf_tokenizer``)."""
    if isinstance(tokenizer, str | os.PathLike):
        from verl.utils.tokenizer import hf_tokenizer

        return hf_tokenizer(os.fspath(tokenizer))
    return tokenizer


class TokenizedSFTDataset(Dataset):
    """Rows already tokenized into ``(ids, loss mask)``; items are right-padded to ``max_length`` (shared by the
    single- and multi-turn datasets)."""

    def _setup(self, parquet_files: Any, tokenizer: Any, config: Any) -> None:
        files = [parquet_files] if isinstance(parquet_files, str | os.PathLike) else list(parquet_files or [])
        if not files:
            raise ValueError(f"{type(self).__name__}: no data files given (data.train_files / data.val_files)")
        self.parquet_files = [os.path.expanduser(os.fspath(f)) for f in files]
        self.tokenizer = resolve_tokenizer(tokenizer)
        self.max_length = config_get(config, "max_length", 1024)
        self.truncation = config_get(config, "truncation", "error")
        self.apply_chat_template_kwargs = dict(config_get(config, "apply_chat_template_kwargs", {}))
        if isinstance(self.max_length, bool) or not isinstance(self.max_length, int) or self.max_length < 1:
            raise ValueError(f"data.max_length={self.max_length!r} must be a positive integer")
        if self.truncation not in TRUNCATION_MODES:
            raise ValueError(f"data.truncation={self.truncation!r} must be one of {list(TRUNCATION_MODES)}")
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat_template: set data.chat_template or use a tokenizer with one")
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else self.tokenizer.eos_token_id
        if self.pad_token_id is None:
            raise ValueError(f"{type(self).__name__}: the tokenizer has neither a pad token nor an EOS token")
        self.ids: list[list[int]] = []
        self.loss_masks: list[list[int]] = []
        self.origins: list[tuple[str, int]] = []

    def _tokenize(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def _build(self, rows: list[Row], encode: Any, what: str) -> None:
        """Tokenize every row with ``encode(row) -> (ids, mask)`` (raising `RowProblem`), then apply the length
        rule; every bad row and every overlong one (``truncation=error``) is reported at once."""
        problems: list[str] = []
        bad = 0
        encoded = []
        for path, row_no, row in rows:
            try:
                encoded.append((path, row_no, *encode(row)))
            except RowProblem as e:
                bad += 1
                if len(problems) < _MAX_REPORTED:
                    problems.append(f"{path}: row {row_no}: {e}")
        raise_problems(problems, bad, f"malformed {what} row(s)", "fix the data or the data.* column keys")
        overlong = [(p, r, len(ids)) for p, r, ids, _ in encoded if len(ids) > self.max_length]
        if overlong and self.truncation == "error":
            listed = [f"{p}: row {r}: {n} tokens" for p, r, n in overlong[:_MAX_REPORTED]]
            raise_problems(
                listed,
                len(overlong),
                f"row(s) longer than data.max_length={self.max_length} (data.truncation=error)",
                "set data.truncation=left|right, or a larger data.max_length",
            )
        if overlong:
            logger.info("%d of %d rows cut to %d tokens (%s)", len(overlong), len(encoded), self.max_length, what)
        for path, row_no, ids, mask in encoded:
            ids, mask = fit_length(ids, mask, self.max_length, self.truncation)
            self.ids.append(ids)
            self.loss_masks.append(mask)
            self.origins.append((path, row_no))
        if not self.ids:
            raise ValueError(f"{type(self).__name__}: {self.parquet_files} hold no rows")

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        ids, mask = self.ids[item], self.loss_masks[item]
        pad = self.max_length - len(ids)
        attention = [1] * len(ids) + [0] * pad
        attention_mask = torch.tensor(attention, dtype=torch.long)
        return {
            "input_ids": torch.tensor(ids + [self.pad_token_id] * pad, dtype=torch.long),
            "attention_mask": attention_mask,
            "position_ids": torch.clip(torch.cumsum(attention_mask, dim=0) - 1, min=0),
            "loss_mask": torch.tensor(mask + [0] * pad, dtype=torch.long),
        }


def _follow(value: Any, column: str, keys: Sequence[str], config_key: str) -> Any:
    """``value[k1][k2]...`` for the ``keys``; `RowProblem` naming the column and the missing key."""
    path = column
    for key in keys:
        if not isinstance(value, Mapping) or key not in value:
            raise RowProblem(f"column {path!r} has no key {key!r} ({config_key}), got {_short(value)}")
        value, path = value[key], f"{path}.{key}"
    return value


def check_messages(messages: Any, column: str) -> list[dict[str, Any]]:
    """A non-empty list of ``{"role": str, "content": str, ...}`` messages (an assistant message with
    ``tool_calls`` may have a null content); `RowProblem` naming the column and the message otherwise."""
    if not isinstance(messages, list | tuple) or not messages:
        raise RowProblem(f"column {column!r}: expected a non-empty list of chat messages, got {_short(messages)}")
    out = []
    for j, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise RowProblem(f"column {column!r}[{j}]: expected a message with a string 'role', got {_short(message)}")
        message = dict(message)
        if message.get("content") is None and message.get("tool_calls"):
            message["content"] = ""
        if not isinstance(message.get("content"), str):
            raise RowProblem(f"column {column!r}[{j}].content: expected a string, got {_short(message.get('content'))}")
        out.append(message)
    return out


class SFTDataset(TokenizedSFTDataset):
    """Single-turn SFT rows from parquet files (see the module docstring for the layout, items and config keys).

    Args:
        parquet_files: a parquet file or a list of them.
        tokenizer: a Hugging Face tokenizer with a chat template (or its path).
        config: the ``data`` config (a DictConfig or a mapping).
        max_samples: keep the first rows only (-1: all).
    """

    def __init__(self, parquet_files: Any, tokenizer: Any, config: Any = None, max_samples: int = -1) -> None:
        self._setup(parquet_files, tokenizer, config)
        self.prompt_key = config_get(config, "prompt_key", "prompt")
        self.response_key = config_get(config, "response_key", "response")
        self.prompt_dict_keys = list(config_get(config, "prompt_dict_keys", []))
        self.response_dict_keys = list(config_get(config, "response_dict_keys", []))
        self.eos_token = self.tokenizer.eos_token or ""
        columns = {self.prompt_key: "data.prompt_key", self.response_key: "data.response_key"}
        self._build(read_rows(self.parquet_files, columns, max_samples), self._encode, "SFT")

    def prompt_messages(self, row: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The chat messages of a row's prompt."""
        prompt = _follow(plain(row[self.prompt_key]), self.prompt_key, self.prompt_dict_keys, "data.prompt_dict_keys")
        column = ".".join([self.prompt_key, *self.prompt_dict_keys])
        if isinstance(prompt, str):
            return [{"role": "user", "content": prompt}]
        return check_messages(plain(prompt, drop_none=True), column)

    def response_text(self, row: Mapping[str, Any]) -> str:
        """A row's response, before the EOS token is appended."""
        keys = self.response_dict_keys
        response = _follow(plain(row[self.response_key]), self.response_key, keys, "data.response_dict_keys")
        if not isinstance(response, str):
            column = ".".join([self.response_key, *keys])
            raise RowProblem(f"column {column!r}: expected a string, got {_short(response)}")
        return response

    def _encode(self, row: Mapping[str, Any]) -> tuple[list[int], list[int]]:
        messages = self.prompt_messages(row)
        response = self.response_text(row)
        try:
            kwargs = {**self.apply_chat_template_kwargs, "add_generation_prompt": True, "tokenize": False}
            prompt_text = self.tokenizer.apply_chat_template(messages, **kwargs)
        except Exception as e:  # a template error is the row's problem
            raise RowProblem(f"column {self.prompt_key!r}: the chat template failed: {type(e).__name__}: {e}") from e
        prompt_ids = self._tokenize(prompt_text)
        response_ids = self._tokenize(response + self.eos_token)
        return prompt_ids + response_ids, [0] * len(prompt_ids) + [1] * len(response_ids)
