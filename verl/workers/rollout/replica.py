"""What a rollout server returns for one request: :class:`TokenOutput` (veRL's ``verl.workers.rollout.replica``).

Torch-free, so agent loops and managers can import it without the engines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["TokenOutput"]


@dataclass
class TokenOutput:
    """The response of one ``generate`` request, token ids in and out.

    Args:
        token_ids: the response tokens (without the prompt).
        log_probs: their log-probabilities under the weights that sampled them (temperature applied), one per token.
        routed_experts: MoE routing of the response tokens (None: not recorded).
        stop_reason: "completed" (a stop token or ``max_tokens``), "aborted", or None when unknown (veRL's values).
        num_preempted: how often the request was preempted and recomputed (a weight update while it ran).
        extra_fields: ``finish_reason`` ("stop" / "length" / "abort") and ``global_steps`` (the weight version of
            the last token, veRL's key).
        weight_versions: the weight version that produced each token (same length as ``token_ids``).
    """

    token_ids: list[int]
    log_probs: list[float] | None = None
    routed_experts: Any = None
    stop_reason: str | None = None
    num_preempted: int | None = None
    extra_fields: dict[str, Any] = field(default_factory=dict)
    weight_versions: list[int] = field(default_factory=list)

    def weight_version_ranges(self) -> list[tuple[int, int, int]]:
        """``(start, end, version)`` for each run of tokens produced by one weight version (end exclusive)."""
        ranges: list[tuple[int, int, int]] = []
        for i, version in enumerate(self.weight_versions):
            if ranges and ranges[-1][2] == version:
                ranges[-1] = (ranges[-1][0], i + 1, version)
            else:
                ranges.append((i, i + 1, version))
        return ranges
