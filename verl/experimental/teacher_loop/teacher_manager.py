"""The teachers' client (veRL 0.10's ``AsyncTeacherLLMServerManager``): a sample's prompt + response ids in, the
teacher's log-probs of every position out.

``compute_teacher_logprobs_single(sequence_ids, routing_key=...)`` sends the sequence to the sample's teacher (the
only one, or the one whose key is the sample's ``distillation.teacher_key`` field) as one request generating a token
with ``prompt_logprobs``: 0 for the single-sample estimators (each token's own log-prob), ``topk`` for top-k losses.
It returns ``(teacher_ids, teacher_logprobs)``, each ``(len(sequence_ids), K)`` (K = 1 or ``topk``); row i is about
token i given the tokens before it, and row 0 is zeros.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import torch

from verl.workers.config.distillation import DistillationConfig

__all__ = ["AsyncTeacherLLMServerManager"]


class AsyncTeacherLLMServerManager:
    """Routes teacher requests by key.

    Args:
        config: the trainer config (its ``distillation`` section is read).
        teacher_client: one client per teacher key (``generate(request_id, prompt_ids=..., sampling_params=...)``),
            e.g. :meth:`~verl.experimental.teacher_loop.MultiTeacherModelManager.get_client`.
    """

    def __init__(self, config: Any, teacher_client: Mapping[str, Any]) -> None:
        self.distillation_config = DistillationConfig.from_config(config.get("distillation"))
        expected = sorted(self.distillation_config.teacher_models)
        if sorted(teacher_client) != expected:
            raise ValueError(f"teacher clients for {sorted(teacher_client)} but the teachers' keys are {expected}")
        self.teacher_client = dict(teacher_client)
        self.teacher_key = self.distillation_config.teacher_key
        self.sampling_params = {
            "max_tokens": 1,
            "temperature": 1.0,
            "prompt_logprobs": self.distillation_config.distillation_loss.teacher_logprobs_k,
        }

    async def compute_teacher_logprobs_single(
        self,
        sequence_ids: list[int],
        multi_modal_data: Mapping[str, Any] | None = None,
        mm_processor_kwargs: Mapping[str, Any] | None = None,
        routing_key: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The teacher's ids and log-probs at every position of ``sequence_ids`` (see the module docstring)."""
        if multi_modal_data:
            raise NotImplementedError("compute_teacher_logprobs_single: multi-modal teachers are not supported")
        teacher = self.distillation_config.route(routing_key)
        output = await self.teacher_client[teacher.key].generate(
            uuid.uuid4().hex, prompt_ids=list(sequence_ids), sampling_params=self.sampling_params
        )
        ids = torch.tensor(output.extra_fields["prompt_ids"], dtype=torch.int32)
        log_probs = torch.tensor(output.extra_fields["prompt_logprobs"], dtype=torch.float32)
        if not ids.shape[0] == log_probs.shape[0] == len(sequence_ids):
            raise RuntimeError(
                f"teacher {teacher.key!r} answered {ids.shape[0]} positions for a sequence of {len(sequence_ids)}"
            )
        return ids, log_probs
