"""The SGLang rollout engine (``rollout.name: sglang``); importing this module imports sglang."""

from verl.workers.rollout.sglang_rollout.sglang_rollout import SGLangRollout

__all__ = ["SGLangRollout"]
