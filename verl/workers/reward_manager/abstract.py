"""What every reward manager shares: decode a rollout batch, score it safely, place the scores.

A manager is called as ``manager(data, return_dict=False)`` on a rollout ``DataProto`` (``prompts``, ``responses``,
``attention_mask`` (its response part marks the valid response tokens); ``non_tensor_batch`` with ``data_source``
(``reward_fn_key``), ``reward_model`` (``{"ground_truth": ...}``) and ``extra_info``) and returns:

- ``reward_tensor`` (bs, response_length), float32: each sample's score at its last valid response token, 0 elsewhere;
- with ``return_dict=True``: ``{"reward_tensor", "reward_extra_info", "reward_metrics"}``, where
  ``reward_extra_info`` maps each key of dict scores (``score``, ``acc``, ...) to one value per sample, and
  ``reward_metrics`` holds ``reward/error_count`` and ``reward/timeout_count`` for this batch.

Scoring goes through a :class:`~verl.utils.reward_score.pool.RewardScorePool`: a call that raises, returns something
that is not a finite number or a dict with a finite ``"score"``, kills its process or runs past ``timeout_s``
scores 0, is counted in ``reward_metrics``, and is logged once per kind of failure, with its traceback. When
**every** sample of a batch fails, the manager raises :class:`RewardFunctionError` naming the function, its file and
the first failure: a function that cannot score anything must stop the run, not train it on zeros.

``compute_score`` gets only the keyword arguments its signature declares (``data_source``, ``solution_str``,
``ground_truth``, ``extra_info`` and the manager's ``reward_kwargs``; all of them when it takes ``**kwargs``). A
``reward_kwargs`` key it does not declare is an error when the manager is built.

Each sample's ``extra_info`` is copied and given (unless present) ``response_length`` (valid response tokens) and
``response_ended`` (whether the last valid token is the tokenizer's EOS or pad token, i.e. the response stopped by
itself instead of being cut at the length limit; without either token: whether it is shorter than the limit).
"""

from __future__ import annotations

import inspect
import logging
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from verl.protocol import DataProto
from verl.utils.py_functional import accepted_kwargs, rejected_kwargs
from verl.utils.reward_score import default_compute_score
from verl.utils.reward_score.pool import FailureLog, RewardScorePool, ScoreResult

__all__ = ["AbstractRewardManager", "RewardFunctionError", "RewardSample", "align_extra_info", "describe_function"]

logger = logging.getLogger(__name__)


@dataclass
class RewardSample:
    """One decoded sample, as the scoring function sees it."""

    index: int
    data_source: Any
    prompt_str: str
    response_str: str
    ground_truth: Any
    extra_info: dict[str, Any]
    valid_response_length: int


@dataclass
class ScoredBatch:
    """Scores (one per sample), the per-sample extra values, and how many samples failed."""

    scores: list[float]
    extra: list[dict[str, Any]]
    errors: int = 0
    timeouts: int = 0
    first_failure: str | None = None


class RewardFunctionError(RuntimeError):
    """The reward function failed on every sample of a batch (``timeouts`` of them by running out of time)."""

    def __init__(self, message: str, timeouts: int = 0) -> None:
        super().__init__(message)
        self.timeouts = timeouts


def describe_function(fn: Callable[..., Any]) -> str:
    """``name (file)`` of a scoring function, for error messages."""
    describe = getattr(fn, "describe", None)
    if callable(describe):
        return describe()
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    try:
        where = inspect.getsourcefile(inspect.unwrap(fn)) or "?"
    except TypeError:
        where = "?"
    return f"{getattr(fn, '__module__', '?')}.{name} ({where})"


class AbstractRewardManager:
    """Base class: decoding, safe scoring and the reward tensor; subclasses implement :meth:`score`."""

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int = 0,
        compute_score: Callable[..., Any] | None = None,
        reward_fn_key: str = "data_source",
        *,
        timeout_s: float | None = 30.0,
        num_workers: int = 1,
        **reward_kwargs: Any,
    ):
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key
        self.timeout_s = timeout_s
        self.num_workers = num_workers
        self.reward_kwargs = reward_kwargs
        rejected = rejected_kwargs(self.compute_score, reward_kwargs)
        if rejected:
            raise TypeError(
                f"reward kwargs {rejected} (reward.reward_kwargs) are not parameters of the reward function "
                f"{describe_function(self.compute_score)}; add them to its signature (or **kwargs) or drop them"
            )
        self._start_pool()

    def _start_pool(self) -> None:
        self.pool = RewardScorePool(self.compute_score, num_workers=self.num_workers, timeout_s=self.timeout_s)
        self.failures = FailureLog(logger)

    def close(self) -> None:
        """Stop the scoring processes (they restart if the manager is called again)."""
        self.pool.close()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("pool", None)
        state.pop("failures", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start_pool()

    # -- the call ---------------------------------------------------------------------------------------------------
    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        if data.batch is not None and "rm_scores" in data.batch.keys():  # a reward model already scored the batch
            extra = {k: list(data.non_tensor_batch[k]) for k in data.meta_info.get("reward_extra_keys", [])}
            tensor = data.batch["rm_scores"]
            return (
                {"reward_tensor": tensor, "reward_extra_info": extra, "reward_metrics": {}} if return_dict else tensor
            )
        samples = self.decode(data)
        scored = self.score(samples) if samples else ScoredBatch([], [])
        if samples and scored.errors + scored.timeouts == len(samples):
            raise RewardFunctionError(
                f"the reward function {describe_function(self.compute_score)} failed on every one of the "
                f"{len(samples)} samples of this batch ({scored.timeouts} timed out); the first failure:\n"
                f"{scored.first_failure}",
                timeouts=scored.timeouts,
            )
        responses = data.batch["responses"]
        reward_tensor = torch.zeros(responses.shape, dtype=torch.float32)
        for sample, value in zip(samples, scored.scores):
            reward_tensor[sample.index, max(sample.valid_response_length - 1, 0)] = value
        self._examine(samples, scored.scores)
        if not return_dict:
            return reward_tensor
        metrics = {"reward/error_count": scored.errors, "reward/timeout_count": scored.timeouts}
        return {
            "reward_tensor": reward_tensor,
            "reward_extra_info": align_extra_info(scored.extra),
            "reward_metrics": metrics,
        }

    def score(self, samples: list[RewardSample]) -> ScoredBatch:
        """Score the decoded samples (one value per sample, in order)."""
        raise NotImplementedError

    # -- helpers for subclasses -------------------------------------------------------------------------------------
    def decode(self, data: DataProto) -> list[RewardSample]:
        """Decode every sample's valid prompt and response tokens (special tokens skipped)."""
        if data.batch is None or "responses" not in data.batch.keys() or "attention_mask" not in data.batch.keys():
            raise KeyError("a reward manager needs data.batch['responses'] and data.batch['attention_mask']")
        ntb = data.non_tensor_batch
        if self.reward_fn_key not in ntb:
            raise KeyError(
                f"data.non_tensor_batch has no {self.reward_fn_key!r} (data.reward_fn_key): every row needs its data "
                f"source; present keys: {sorted(ntb)}"
            )
        responses = data.batch["responses"]
        width = responses.shape[-1]
        attention = data.batch["attention_mask"]
        # every response token counts, the model's and (multi-turn) the tools' alike (response_mask marks only the
        # model's): the score goes to the last one, as in veRL
        valid_lengths = attention[:, -width:].sum(-1).tolist()
        prompt_tokens = data.batch["prompts"] if "prompts" in data.batch.keys() else data.batch["input_ids"][:, :-width]
        prompt_mask = attention[:, : prompt_tokens.shape[-1]].bool()
        prompt_ids = [prompt_tokens[i][prompt_mask[i]].tolist() for i in range(len(data))]
        response_ids = [responses[i, : int(n)].tolist() for i, n in enumerate(valid_lengths)]
        prompt_strs = _decode_all(self.tokenizer, prompt_ids)
        response_strs = _decode_all(self.tokenizer, response_ids)
        eos_ids = _end_token_ids(self.tokenizer)
        reward_models = ntb.get("reward_model")
        extra_infos = ntb.get("extra_info")
        num_turns = ntb.get("__num_turns__")
        samples = []
        for i in range(len(data)):
            extra = dict(extra_infos[i] or {}) if extra_infos is not None else {}
            ids = response_ids[i]
            ended = (bool(ids) and ids[-1] in eos_ids) if eos_ids else len(ids) < width
            extra.setdefault("response_length", len(ids))
            extra.setdefault("response_ended", ended)
            if num_turns is not None:
                extra.setdefault("num_turns", num_turns[i])
            reward_model = reward_models[i] if reward_models is not None else None
            ground_truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
            samples.append(
                RewardSample(
                    i, ntb[self.reward_fn_key][i], prompt_strs[i], response_strs[i], ground_truth, extra, len(ids)
                )
            )
        return samples

    def score_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` and the manager's ``reward_kwargs``, narrowed to what ``compute_score`` declares."""
        return accepted_kwargs(self.compute_score, {**kwargs, **self.reward_kwargs})

    def run_per_sample(self, samples: list[RewardSample]) -> ScoredBatch:
        """Call ``compute_score`` once per sample (through the pool) and check each result. A plain number (not a
        dict with a ``score``) is also stored as ``acc`` in the sample's extra info, as veRL's reward loop does (so
        it is the ``val-core`` variable)."""
        calls = [
            (
                (),
                self.score_kwargs(
                    {
                        "data_source": s.data_source,
                        "solution_str": s.response_str,
                        "ground_truth": s.ground_truth,
                        "extra_info": s.extra_info,
                    }
                ),
            )
            for s in samples
        ]
        scored = self.check_results(samples, self.pool.run(calls))
        for extra, value in zip(scored.extra, scored.scores):
            if "score" not in extra:
                extra["acc"] = value
        return scored

    def check_results(self, samples: list[RewardSample], results: list[ScoreResult]) -> ScoredBatch:
        """Turn results into scores and extra values; failures score 0, are counted and logged once per kind."""
        out = ScoredBatch(scores=[], extra=[])
        for sample, result in zip(samples, results):
            if result.ok:
                result = _validate(result)
            if not result.ok:
                out.timeouts += result.timed_out
                out.errors += not result.timed_out
                if out.first_failure is None:
                    out.first_failure = f"sample {sample.index}: {(result.error or '').strip()}"
                self.failures.report(result, f"sample {sample.index} (data_source={sample.data_source!r})")
                out.scores.append(0.0)
                out.extra.append({})
                continue
            value = result.value
            if isinstance(value, dict):
                out.scores.append(float(value["score"]))
                out.extra.append(dict(value))
            else:
                out.scores.append(float(value))
                out.extra.append({})
        return out

    def _examine(self, samples: list[RewardSample], scores: list[float]) -> None:
        """Log the first ``num_examine`` samples of each data source."""
        shown: dict[Any, int] = {}
        for sample, value in zip(samples, scores):
            if shown.get(sample.data_source, 0) >= self.num_examine:
                continue
            shown[sample.data_source] = shown.get(sample.data_source, 0) + 1
            logger.info(
                "[prompt] %s\n[response] %s\n[ground_truth] %s\n[score] %s",
                sample.prompt_str,
                sample.response_str,
                sample.ground_truth,
                value,
            )


def _decode_all(tokenizer: Any, ids: list[list[int]]) -> list[str]:
    """The texts of ``ids`` (special tokens skipped): ``batch_decode`` where the tokenizer has it, else ``decode``
    per sequence (veRL's managers call only ``decode``, so a tokenizer-like object may have nothing else)."""
    if hasattr(tokenizer, "batch_decode"):
        return tokenizer.batch_decode(ids, skip_special_tokens=True)
    return [tokenizer.decode(one, skip_special_tokens=True) for one in ids]


def _end_token_ids(tokenizer: Any) -> set[int]:
    """Tokens that end a response: the EOS token(s), and the pad token (Qwen models also stop on it)."""
    ids: set[int] = set()
    for name in ("eos_token_id", "pad_token_id"):
        value = getattr(tokenizer, name, None)
        ids.update(value if isinstance(value, (list, tuple)) else [] if value is None else [value])
    return ids


def _is_finite_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and math.isfinite(float(value))


def _validate(result: ScoreResult) -> ScoreResult:
    """An ok result whose value is not a finite number nor a dict with a finite ``"score"`` becomes an error."""
    value = result.value
    if isinstance(value, dict):
        if _is_finite_number(value.get("score")):
            return result
        problem = f"returned a dict whose 'score' is {value.get('score')!r} (keys: {sorted(value)})"
    elif _is_finite_number(value):
        return result
    else:
        problem = f"returned {value!r} ({type(value).__name__})"
    return ScoreResult(error=f"compute_score {problem}; expected a finite number or a dict with a finite 'score'")


def align_extra_info(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Per-sample dicts → one list per key, aligned with the samples.

    A sample without a key (its call failed, or its dict lacked it) gets 0.0 when every present value of that key is
    a number, else None.
    """
    keys: list[str] = []
    for row in rows:
        keys.extend(k for k in row if k not in keys)
    aligned: dict[str, list[Any]] = {}
    for key in keys:
        present = [row[key] for row in rows if key in row]
        fill = 0.0 if all(isinstance(v, numbers.Number) for v in present) else None
        aligned[key] = [row.get(key, fill) for row in rows]
    return aligned
