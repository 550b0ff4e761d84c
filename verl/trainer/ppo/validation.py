"""The driver's helpers around validation and generation dumps: naming the validation metrics (``val-core`` vs
``val-aux``), decoding a batch's prompts and responses, picking the samples for ``trainer.log_val_generations``,
and writing ``trainer.rollout_data_dir`` / ``trainer.validation_data_dir`` jsonl files."""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.metric_utils import process_validation_metrics
from verl.utils.profiler import marked_timer

__all__ = [
    "GenerationDumps",
    "ValidationSamples",
    "decode_batch",
    "dump_generations",
    "ground_truths",
    "pick_generations",
    "validation_metrics",
]

logger = logging.getLogger(__name__)

CORE_METRIC_PREFIXES = ("mean@", "maj@", "best@")


def validation_metrics(
    data_sources: Sequence[str], sample_uids: Sequence[str], infos: Mapping[str, Sequence[Any]], seed: int = 42
) -> dict[str, float]:
    """``val-core/<source>/<var>/<metric>`` and ``val-aux/...`` from the per-sample ``infos`` (``reward`` plus the
    reward function's extra info).

    The core variable is ``acc`` when the reward function reports it, else ``reward``; its ``mean@N``,
    ``maj@N/mean`` and ``best@N/mean`` (N the largest sample count) are core, every other statistic is aux.
    """
    out: dict[str, float] = {}
    for source, by_var in process_validation_metrics(data_sources, sample_uids, infos, seed=seed).items():
        core_var = "acc" if "acc" in by_var else "reward"
        for var, metrics in by_var.items():
            n_max = max(int(name.split("@")[1].split("/")[0]) for name in metrics)
            for name, value in metrics.items():
                core = (
                    var == core_var
                    and name.startswith(CORE_METRIC_PREFIXES)
                    and f"@{n_max}" in name
                    and not name.endswith("/std")
                )
                out[f"{'val-core' if core else 'val-aux'}/{source}/{var}/{name}"] = value
    return out


def decode_batch(tokenizer: Any, batch: DataProto) -> tuple[list[str], list[str]]:
    """The prompts and the responses of a generated batch as text (padding and special tokens dropped)."""
    responses = batch.batch["responses"]
    response_length = responses.shape[-1]
    attention = batch.batch["attention_mask"].bool()
    prompts = batch.batch["input_ids"][:, :-response_length]
    prompt_mask = attention[:, :-response_length]
    response_mask = attention[:, -response_length:]
    inputs = [tokenizer.decode(ids[mask].tolist(), skip_special_tokens=True) for ids, mask in zip(prompts, prompt_mask)]
    outputs = [
        tokenizer.decode(ids[mask].tolist(), skip_special_tokens=True) for ids, mask in zip(responses, response_mask)
    ]
    return inputs, outputs


def ground_truths(batch: DataProto) -> list[Any]:
    """Each row's ``reward_model.ground_truth`` (None where the row has none)."""
    column = batch.non_tensor_batch.get("reward_model")
    if column is None:
        return [None] * len(batch)
    return [item.get("ground_truth") if isinstance(item, Mapping) else None for item in column]


def pick_generations(
    inputs: Sequence[str], outputs: Sequence[str], scores: Sequence[float], count: int, seed: int = 42
) -> list[tuple[str, str, float]]:
    """``count`` (input, output, score) samples for ``trainer.log_val_generations``: sorted by input, then shuffled
    with a fixed seed, so the same prompts are followed from one validation to the next."""
    samples = sorted(zip(inputs, outputs, (float(s) for s in scores)), key=lambda sample: sample[0])
    order = np.random.default_rng(seed).permutation(len(samples))
    return [samples[i] for i in order[:count]]


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def dump_generations(
    folder: str,
    step: int,
    inputs: Sequence[str],
    outputs: Sequence[str],
    gts: Sequence[Any],
    scores: Sequence[float],
    extra: Mapping[str, Sequence[Any]] | None = None,
) -> str:
    """Write ``<folder>/<step>.jsonl``: one ``{"input", "output", "gts", "score", "step", <extra>...}`` line per
    sample. ``score`` is the sample's reward; an extra key with one of those names (a reward function's own
    ``score``) or a list of another length than the batch is left out. Returns the file's path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{step}.jsonl")
    columns = {key: values for key, values in (extra or {}).items() if len(values) == len(inputs)}
    with open(path, "w", encoding="utf-8") as f:
        for i, (text_in, text_out, gt, score) in enumerate(zip(inputs, outputs, gts, scores)):
            row = {"input": text_in, "output": text_out, "gts": _plain(gt), "score": float(score), "step": step}
            row.update({key: _plain(values[i]) for key, values in columns.items() if key not in row})
            f.write(json.dumps(row, default=str) + "\n")
    logger.info("dumped %d generations to %s", len(inputs), path)
    return path


@dataclass
class ValidationSamples:
    """Everything one validation pass collects, sample by sample (prompts repeated ``val_kwargs.n`` times)."""

    sources: list[str] = field(default_factory=list)
    uids: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    gts: list[Any] = field(default_factory=list)
    infos: dict[str, list[Any]] = field(default_factory=lambda: defaultdict(list))

    def add(self, tokenizer: Any, batch: DataProto, reward_tensor: torch.Tensor, extra: Mapping[str, Any]) -> None:
        """Record a scored batch (with a ``uid`` per prompt): texts, ground truths, ``reward`` and extra info."""
        self.infos["reward"].extend(reward_tensor.sum(-1).tolist())
        for key, values in extra.items():
            if len(values) == len(batch) and key != "reward":
                self.infos[key].extend(values)
        sources = batch.non_tensor_batch.get("data_source")
        self.sources.extend(["unknown"] * len(batch) if sources is None else [str(s) for s in sources])
        self.uids.extend(str(uid) for uid in batch.non_tensor_batch["uid"])
        inputs, outputs = decode_batch(tokenizer, batch)
        self.inputs.extend(inputs)
        self.outputs.extend(outputs)
        self.gts.extend(ground_truths(batch))

    def complete_infos(self) -> dict[str, list[Any]]:
        """The info lists that cover every sample (extra info that some batch lacked cannot be attributed)."""
        return {key: values for key, values in self.infos.items() if len(values) == len(self.uids)}

    def metrics(self) -> dict[str, float]:
        """``val-core/...`` and ``val-aux/...`` for the samples collected."""
        return validation_metrics(self.sources, self.uids, self.complete_infos()) if self.uids else {}

    def pick(self, count: int) -> list[tuple[str, str, float]]:
        """``count`` (input, output, score) samples to log (see :func:`pick_generations`)."""
        return pick_generations(self.inputs, self.outputs, self.infos["reward"], count)

    def dump(self, folder: str, step: int) -> str:
        """Write the samples to ``<folder>/<step>.jsonl`` (see :func:`dump_generations`)."""
        infos = self.complete_infos()
        reward = infos.pop("reward")
        return dump_generations(folder, step, self.inputs, self.outputs, self.gts, reward, infos)


class GenerationDumps:
    """veRL's ``_log_rollout_data`` / ``_dump_generations`` of ``RayPPOTrainer``: a step's generations to
    ``trainer.rollout_data_dir`` (``tokenizer`` and ``global_steps`` are the trainer's)."""

    tokenizer: Any
    global_steps: int

    def _log_rollout_data(
        self,
        batch: DataProto,
        reward_extra_infos_dict: dict[str, Any],
        timing_raw: dict[str, float],
        rollout_data_dir: str,
    ) -> None:
        """Write the step's generations, scores and ``reward_extra_infos_dict`` to ``rollout_data_dir``, timed as
        ``dump_rollout_generations`` (veRL's helper)."""
        with marked_timer("dump_rollout_generations", timing_raw):
            inputs, outputs = decode_batch(self.tokenizer, batch)
            scores = batch.batch["token_level_scores"].sum(-1).tolist()
            self._dump_generations(
                inputs, outputs, ground_truths(batch), scores, reward_extra_infos_dict, rollout_data_dir
            )

    def _dump_generations(
        self,
        inputs: list[str],
        outputs: list[str],
        gts: list[Any],
        scores: list[float],
        reward_extra_infos_dict: dict[str, Any],
        dump_path: str,
    ) -> str:
        """``<dump_path>/<global_steps>.jsonl``, one line per sample (veRL's helper); returns the file."""
        return dump_generations(dump_path, self.global_steps, inputs, outputs, gts, scores, reward_extra_infos_dict)

    def _reward_extra_infos(self, batch: DataProto) -> dict[str, Any]:
        keys = batch.meta_info.get("reward_extra_keys", [])
        return {key: batch.non_tensor_batch[key] for key in keys if key in batch.non_tensor_batch}
