"""Samples whose agent loop raised, kept in the batch as failed (veRL 0.10's failed trajectories).

Under ``trainer.v1.sampler.schedule=replay_buffer`` the trainer asks the agent loops to keep going when some samples
fail (``meta_info["keep_failed_samples"]``): a sample whose loop raised an ``Exception`` becomes a *failed sample*, a
row with the prompt, one masked pad token as its response and a score of 0, flagged in the batch's ``__failed__``
column, and its prompt group is marked ``failure`` in the replay buffer (evicted and refilled in the async modes,
padded or refilled in sync: :mod:`verl.trainer.ppo.v1.replay_buffer`). Not kept, whatever the setting: a batch where
every sample failed (a loop that always fails stops the run, naming it), a dead rollout server, a cancellation.
Under the fixed-lag schedule any failure stops the run, as before.
"""

from __future__ import annotations

import logging

import ray
import torch

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.postprocess import FAILED_COLUMN, SampleResult, pad_sample
from verl.single_controller.ray.base import WorkerDiedError

__all__ = ["FAILED_COLUMN", "keep_failed_samples"]

logger = logging.getLogger(__name__)


def _fatal(error: BaseException) -> bool:
    """An error that ends the run rather than one sample: not an ``Exception`` (a cancellation), or a dead worker."""
    return not isinstance(error, Exception) or isinstance(error, WorkerDiedError | ray.exceptions.RayError)


def keep_failed_samples(
    results: list[list[SampleResult] | BaseException],
    agent_names: list[str],
    prompt_ids: list[list[int]],
    prompt_length: int,
    response_length: int,
    pad_id: int,
) -> list[list[SampleResult]]:
    """``results`` (per sample, its outputs) with each failed sample (an exception) replaced by one failed
    :class:`SampleResult` (see the module docstring); raises the first fatal error, or the first error when every
    sample failed."""
    failures = [(i, r) for i, r in enumerate(results) if isinstance(r, BaseException)]
    if not failures:
        return results  # type: ignore[return-value]
    for _, error in failures:
        if _fatal(error):
            raise error
    if len(failures) == len(results):
        index, first = failures[0]
        first.add_note(f"agent loop {agent_names[index]!r}: every one of the batch's {len(results)} samples failed")
        raise first
    index, error = failures[0]
    logger.warning(
        "%d of %d samples failed in their agent loops and are kept as failed samples (their prompt groups are marked "
        "failed); the first, agent loop %r: %r",
        len(failures),
        len(results),
        agent_names[index],
        error,
        exc_info=error,
    )
    done = [r for sample in results if isinstance(sample, list) for r in sample]
    with_log_probs = any(r.output.response_logprobs is not None for r in done)
    with_reward = all(r.reward is not None for r in done)
    kept: list[list[SampleResult]] = []
    for i, result in enumerate(results):
        if isinstance(result, list):
            kept.append(result)
            continue
        output = AgentLoopOutput(
            prompt_ids=prompt_ids[i][-prompt_length:],
            response_ids=[pad_id],
            response_mask=[0],
            response_logprobs=[0.0] if with_log_probs else None,
        )
        rows = pad_sample(output, agent_names[i], prompt_length, response_length, pad_id)
        reward = torch.zeros((1, response_length), dtype=torch.float32) if with_reward else None
        kept.append([SampleResult(agent_names[i], output, rows, reward=reward, failed=True)])
    return kept
