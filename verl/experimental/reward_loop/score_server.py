"""A served discriminative reward model: a replica that scores whole sequences.

:class:`RewardScoreServer` (a worker of the reward model's pool) loads ``reward.reward_model.model_path`` as a value
model — a token-classification head with one label, as the critic and veRL's reward models are (a
sequence-classification checkpoint's ``score`` head loads into it unchanged) — and answers
``classify(inputs)``: for each token sequence, the head's outputs at its last token, one per label, without an
activation. The router serves it as vLLM's ``/classify`` (`verl.experimental.reward_loop.router`), and veRL's rule
reads the reward from it: the last output of the last sequence.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import torch

from verl.single_controller.base.decorator import Dispatch, register, server_method
from verl.utils.device import get_device_name
from verl.utils.distributed import initialize_global_process_group
from verl.utils.fs import copy_to_local
from verl.workers.profiled_worker import ProfiledWorker
from verl.workers.rollout_worker import register_meshes

__all__ = ["RewardScoreServer", "is_discriminative"]

logger = logging.getLogger(__name__)

CLASSIFIER_SUFFIXES = ("ForTokenClassification", "ForSequenceClassification")


def is_discriminative(model_path: str) -> bool:
    """Whether the checkpoint at ``model_path`` is a classifier (its ``architectures`` end in
    ``ForTokenClassification`` / ``ForSequenceClassification``) rather than a causal LM."""
    import json

    with open(os.path.join(copy_to_local(model_path), "config.json"), encoding="utf-8") as f:
        architectures = json.load(f).get("architectures") or []
    return any(str(name).endswith(CLASSIFIER_SUFFIXES) for name in architectures)


class RewardScoreServer(ProfiledWorker):
    """One discriminative reward-model replica (see the module docstring).

    Args:
        config: ``{"model": {"path", "trust_remote_code"}, "rollout": {"dtype", "seed"}}`` (the served reward
            model's worker config, `verl.experimental.reward_loop.reward_model.reward_model_worker_config`).
        role: ``reward_model`` (the argument the trainer gives every worker class).
    """

    profile_role = "reward_model"

    def __init__(self, config: Any, role: str = "reward_model", **kwargs: Any) -> None:
        super().__init__(None, None)
        self.config = config
        self.role = role
        initialize_global_process_group()
        self.model: torch.nn.Module | None = None
        register_meshes(self)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load the model (forward only, eval mode)."""
        from verl.utils.torch_dtypes import PrecisionType
        from verl.workers.engine.hf_model import load_hf_model

        model = self.config["model"]
        rollout = self.config.get("rollout") or {}
        self.model = load_hf_model(
            copy_to_local(model["path"]),
            value_model=True,
            dtype=PrecisionType.to_dtype(rollout.get("dtype", "float32")),
            seed=int(rollout.get("seed", 0)),
            trust_remote_code=bool(model.get("trust_remote_code", False)),
        )
        self.model.to(get_device_name()).eval()

    @torch.no_grad()
    def _classify(self, inputs: list[list[int]]) -> list[list[float]]:
        if self.model is None:
            raise RuntimeError(f"classify on reward model server {self.rank}: init_model has not run")
        device = next(self.model.parameters()).device
        out = []
        for ids in inputs:
            if not ids:
                raise ValueError("classify: an empty token sequence")
            logits = self.model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits
            out.append(logits[0, -1].float().cpu().tolist())  # (labels,) at the last token
        return out

    @server_method
    async def classify(self, inputs: list[list[int]]) -> list[list[float]]:
        """The head's outputs at the last token of each of ``inputs`` (token id lists), one per label."""
        return await asyncio.to_thread(self._classify, inputs)
