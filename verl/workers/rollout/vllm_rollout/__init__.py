"""The vLLM rollout engine (``rollout.name: vllm``); importing this module imports vllm."""

from verl.workers.rollout.vllm_rollout.vllm_rollout import vLLMRollout

__all__ = ["vLLMRollout"]
