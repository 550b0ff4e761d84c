"""The reward-loop manager contract (veRL 0.10): one sample at a time, awaited.

A manager is built as ``cls(config, tokenizer, compute_score, reward_router_address=None,
reward_model_tokenizer=None)`` — ``config`` the trainer config, ``compute_score`` the user's function (None: the
built-in scorers) — and scores a sample with ``await manager.run_single(data)``, ``data`` the rows of one session
(the built-ins score the last), returning ``{"reward_score": float, "reward_extra_info": dict}``. The agent loops
await it as each sample finishes, so a slow judge overlaps generation. ``init_class(config, tokenizer)`` runs once
per class and process (class-wide state, e.g. rate limits).

:class:`RewardManagerBase` also gives subclasses the steps every built-in takes: :meth:`RewardManagerBase.sample`
decodes the sample, :meth:`RewardManagerBase.call_compute_score` calls the function (awaited when it is async, in
a thread when not; ``reward_router_address`` / ``reward_model_tokenizer`` passed when a reward model serves and
the function declares them), :func:`score_result` reads what it returned.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch

from verl.protocol import DataProto
from verl.utils.py_functional import accepted_kwargs

__all__ = ["RewardManagerBase", "ScoreInputs", "is_async_function", "score_result"]


@dataclass
class ScoreInputs:
    """One decoded sample, as ``compute_score`` gets it."""

    data_source: Any
    solution_str: str
    ground_truth: Any
    extra_info: dict[str, Any] = field(default_factory=dict)
    valid_response_length: int = 0


def is_async_function(fn: Any) -> bool:
    """Whether calling ``fn`` returns a coroutine (a wrapper counts by what it wraps, an object by its
    ``__call__``)."""
    try:
        target = inspect.unwrap(fn)
    except ValueError:
        target = fn
    if inspect.iscoroutinefunction(target):
        return True
    return not inspect.isroutine(target) and inspect.iscoroutinefunction(type(target).__call__)


def score_result(value: Any, source: str) -> dict[str, Any]:
    """``{"reward_score", "reward_extra_info"}`` from what a scoring function returned: a dict's ``score`` and all
    its keys; a number as the score and as ``acc`` (veRL's rule: ``acc`` is then the ``val-core`` variable).
    Anything else — a dict without a finite ``score``, a non-finite or non-numeric value — is an error naming
    ``source``."""
    if isinstance(value, dict):
        score = value.get("score")
        if isinstance(score, numbers.Real) and math.isfinite(float(score)):
            return {"reward_score": float(score), "reward_extra_info": dict(value)}
        raise ValueError(f"{source} returned a dict whose 'score' is {score!r} (keys: {sorted(value)})")
    if isinstance(value, numbers.Real) and math.isfinite(float(value)):
        return {"reward_score": float(value), "reward_extra_info": {"acc": float(value)}}
    raise ValueError(f"{source} returned {value!r} ({type(value).__name__}); expected a finite number or a dict")


class RewardManagerBase(ABC):
    """Base of the reward-loop managers (see the module docstring)."""

    _class_initialized = False

    def __init__(
        self,
        config: Any,
        tokenizer: Any,
        compute_score: Any = None,
        reward_router_address: str | None = None,
        reward_model_tokenizer: Any = None,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.compute_score = compute_score
        self.reward_router_address = reward_router_address
        self.reward_model_tokenizer = reward_model_tokenizer
        type(self).init_class(config, tokenizer)
        self.setup()

    def setup(self) -> None:  # noqa: B027 - an optional hook, not an abstract method
        """What a subclass builds once its arguments are set (a constructor of its own may be written instead)."""

    @classmethod
    def init_class(cls, config: Any, tokenizer: Any) -> None:
        """Set up state shared by every instance of ``cls`` in this process (once)."""
        if cls.__dict__.get("_class_initialized", False):
            return
        cls._class_initialized = True

    def reward_section(self) -> Any:
        """``config.reward`` (empty when absent)."""
        return (self.config.get("reward") if self.config is not None else None) or {}

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop ``run_single`` runs on."""
        return asyncio.get_running_loop()

    @abstractmethod
    async def run_single(self, data: DataProto) -> dict[str, Any]:
        """Score one sample: ``{"reward_score": float, "reward_extra_info": dict}``."""

    @classmethod
    def assemble_rm_scores(cls, data: DataProto, scores: list[float]) -> torch.Tensor:
        """``rm_scores`` of ``data``: each row's score at its last valid response token, 0 elsewhere."""
        responses = data.batch["responses"]
        width = responses.shape[-1]
        valid = data.batch["attention_mask"][:, -width:].sum(-1).clamp(min=1)
        out = torch.zeros(responses.shape, dtype=torch.float32)
        out[torch.arange(len(out)), valid - 1] = torch.tensor(scores, dtype=torch.float32)
        return out

    # ------------------------------------------------------------------ steps for subclasses
    def sample(self, data: DataProto) -> ScoreInputs:
        """The last row of ``data`` decoded: its data source, response text (special tokens skipped), ground truth
        and ``extra_info`` (a copy, given ``num_turns``, ``rollout_reward_scores`` and the tool loop's fields)."""
        row = data[len(data) - 1]
        responses = row.batch["responses"]
        width = responses.shape[-1]
        valid = int(row.batch["attention_mask"][-width:].sum())
        fields = row.non_tensor_batch
        reward_model = fields.get("reward_model")
        extra = dict(fields.get("extra_info") or {})
        extra.update(dict(fields.get("tool_extra_fields") or {}))
        extra.setdefault("num_turns", fields.get("__num_turns__"))
        extra.setdefault("rollout_reward_scores", fields.get("reward_scores", {}))
        return ScoreInputs(
            data_source=fields.get("data_source"),
            solution_str=self.tokenizer.decode(responses[:valid].tolist(), skip_special_tokens=True),
            ground_truth=reward_model.get("ground_truth") if isinstance(reward_model, dict) else None,
            extra_info=extra,
            valid_response_length=valid,
        )

    def router_kwargs(self) -> dict[str, Any]:
        """``reward_router_address`` and ``reward_model_tokenizer`` when a reward model serves (else nothing)."""
        if self.reward_router_address is None:
            return {}
        return {
            "reward_router_address": self.reward_router_address,
            "reward_model_tokenizer": self.reward_model_tokenizer,
        }

    async def call_compute_score(self, inputs: ScoreInputs) -> Any:
        """``compute_score(data_source=, solution_str=, ground_truth=, extra_info=, ...)`` with the keywords it
        declares: awaited when it is async, in a thread of the loop's executor when not."""
        from verl.utils.reward_score import default_compute_score

        fn = self.compute_score or default_compute_score
        kwargs = accepted_kwargs(
            fn,
            {
                "data_source": inputs.data_source,
                "solution_str": inputs.solution_str,
                "ground_truth": inputs.ground_truth,
                "extra_info": inputs.extra_info,
                **self.router_kwargs(),
            },
        )
        if is_async_function(fn):
            return await fn(**kwargs)
        value = await self.loop.run_in_executor(None, lambda: fn(**kwargs))
        return await value if inspect.isawaitable(value) else value
