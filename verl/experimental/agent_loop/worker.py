"""`AgentLoopWorker`: runs one asyncio task per sample — its agent loop, then its reward — and joins the batch.

Per sample: the loop named by its ``agent_name`` (default ``rollout.agent.default_agent_loop``) is built with
veRL's constructor and ``run(sampling_params, **fields)`` is awaited; as soon as it finishes, the sample is scored
(the loop's own ``reward_score`` when it set one, else the reward function, in this worker's scoring thread) while
the other samples still generate. Sampling parameters are veRL's (``temperature``, ``top_p``, ``top_k``,
``repetition_penalty``, ``logprobs``; ``val_kwargs`` under ``meta_info["validate"]``, greedy under
``meta_info["do_sample"]=False``) plus ``seed``: each sample's stream is seeded from (``rollout.seed``, step, prompt
index, sample index), so a run reproduces token for token, and ``stop_token_ids`` (the tokenizer's EOS).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from typing import Any

import numpy as np
import ray
import torch
from omegaconf import DictConfig, OmegaConf

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopOutput,
    DictConfigWrap,
    agent_loop_target,
    load_agent_loop_configs,
)
from verl.experimental.agent_loop.postprocess import SampleResult, object_column, pad_sample, samples_to_batch
from verl.experimental.agent_loop.server_manager import AsyncLLMServerManager
from verl.protocol import DataProto
from verl.workers.config.builders import build_rollout_config
from verl.workers.reward_manager.abstract import RewardFunctionError, align_extra_info
from verl.workers.rollout.request import as_id_list, sample_seed

__all__ = ["AgentLoopWorker", "AgentLoopWorkerBase"]

logger = logging.getLogger(__name__)


def _dataset_class(data_config: Any) -> type:
    from verl.utils.dataset.rl_dataset import RLHFDataset, _load_class

    custom = (data_config or {}).get("custom_cls") or {}
    if custom.get("path"):
        return _load_class(custom["path"], custom.get("name", ""), "data.custom_cls.path", "data.custom_cls.name")
    return RLHFDataset


class AgentLoopWorkerBase:
    """Runs the agent loops of a chunk of samples against the rollout servers.

    Args:
        config: the trainer config.
        server_handles: the rollout replicas (see :class:`AsyncLLMServerManager`).
        reward_fn / val_reward_fn: reward managers scoring each finished sample (``fn(data, return_dict=True)``)
            in training / validation; None: not scored here (the trainer scores the batch).
    """

    def __init__(
        self, config: Any, server_handles: list[Any], reward_fn: Any = None, val_reward_fn: Any = None
    ) -> None:
        from verl.utils.tokenizer import hf_tokenizer

        self.config = config if isinstance(config, DictConfig) else OmegaConf.create(config)
        self.rollout_config = build_rollout_config(self.config.actor_rollout_ref.rollout)  # typed, defaults filled
        if not hasattr(self, "server_manager"):  # a recipe's subclass may bring its own
            self.server_manager = AsyncLLMServerManager(self.config, server_handles)
        model = self.config.actor_rollout_ref.model
        self.tokenizer = hf_tokenizer(
            model.get("tokenizer_path") or model.path, trust_remote_code=bool(model.get("trust_remote_code"))
        )
        if model.get("custom_chat_template"):
            self.tokenizer.chat_template = model.custom_chat_template
        self.processor = None  # text models: the engines take no multi-modal inputs
        self.data_config = self.config.get("data") or OmegaConf.create({})
        self.dataset_cls = _dataset_class(self.data_config)
        if self.rollout_config.agent.agent_loop_config_path:
            load_agent_loop_configs(self.rollout_config.agent.agent_loop_config_path)
        self.reward_fns = {False: _quiet(reward_fn), True: _quiet(val_reward_fn)}
        self._scoring = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-loop-reward")

    # ------------------------------------------------------------------ the batch
    async def generate_sequences(self, batch: DataProto) -> DataProto:
        """Run every sample of ``batch`` (prompt rows, one sample each) and return the rollout batch."""
        rollout = self.rollout_config
        meta = batch.meta_info
        validate = bool(meta.get("validate", False))
        params, greedy = self._sampling_params(meta)
        rows = len(batch)
        names = batch.non_tensor_batch.get("agent_name")
        names = [rollout.agent.default_agent_loop] * rows if names is None else [str(n) for n in names]
        step = int(meta.get("global_steps", 0))
        tasks = []
        for i in range(rows):
            fields = {k: v[i] for k, v in batch.non_tensor_batch.items() if k != "agent_name"}
            if batch.batch is not None and "input_ids" in batch.batch.keys():
                ids, mask = batch.batch["input_ids"][i], batch.batch["attention_mask"][i]
                fields["raw_prompt_ids"] = ids[mask.bool()].tolist()
            sample_params = dict(params)
            if not greedy:
                prompt, sample = (int(batch.batch[k][i]) for k in ("prompt_index", "sample_index"))
                sample_params["seed"] = sample_seed(rollout.seed, step, prompt, sample)
            tasks.append(asyncio.create_task(self._run_sample(names[i], sample_params, fields, validate)))
        # every loop runs to its first await: the first requests of all of them go out as one wave per replica
        with getattr(self.server_manager, "wave", contextlib.nullcontext)():
            await asyncio.sleep(0)
        try:
            results = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(self.server_manager.abort(None), return_exceptions=True)
            raise
        return self._join(results, validate)

    def _sampling_params(self, meta: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        rollout = self.rollout_config
        source = rollout.val_kwargs if meta.get("validate", False) else rollout
        do_sample = meta.get("do_sample", source.do_sample)
        greedy = not do_sample or source.temperature == 0
        params: dict[str, Any] = {
            "temperature": 0.0 if greedy else float(source.temperature),
            "top_p": 1.0 if greedy else float(source.top_p),
            "top_k": -1 if greedy else int(source.top_k),
            "repetition_penalty": 1.0,
            "logprobs": True,
        }
        if meta.get("eos_token_id") is not None:
            params["stop_token_ids"] = as_id_list(meta["eos_token_id"])
        return params, greedy

    async def _run_sample(
        self, agent_name: str, sampling_params: dict[str, Any], fields: dict[str, Any], validate: bool
    ) -> SampleResult:
        import hydra.utils

        loop = hydra.utils.instantiate(
            agent_loop_target(agent_name),
            trainer_config=DictConfigWrap(self.config),
            server_manager=self.server_manager,
            tokenizer=self.tokenizer,
            processor=self.processor,
            dataset_cls=self.dataset_cls,
            dataset_config=DictConfigWrap(self.data_config),
        )
        output = await loop.run(sampling_params, **fields)
        if not isinstance(output, AgentLoopOutput):
            raise TypeError(
                f"agent loop {agent_name!r} ({type(loop).__qualname__}.run) returned {type(output).__name__}, "
                "not an AgentLoopOutput"
            )
        rollout = self.rollout_config
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        tensors = pad_sample(output, agent_name, rollout.prompt_length, rollout.response_length, int(pad or 0))
        result = SampleResult(agent_name, output, tensors)
        await self._score(result, fields, validate)
        return result

    # ------------------------------------------------------------------ rewards
    async def _score(self, result: SampleResult, fields: dict[str, Any], validate: bool) -> None:
        """The sample's ``rm_scores`` row: the loop's ``reward_score`` at the last response token, else the reward
        function's (run in this worker's scoring thread while other samples generate)."""
        valid = int(result.tensors["attention_mask"][0, -result.tensors["responses"].shape[1] :].sum())
        if result.output.reward_score is not None:
            result.reward = torch.zeros(result.tensors["responses"].shape, dtype=torch.float32)
            result.reward[0, max(valid - 1, 0)] = float(result.output.reward_score)
            return
        fn = self.reward_fns[validate]
        if fn is None:
            return
        row = DataProto.from_dict(
            {k: v for k, v in result.tensors.items() if k != "rollout_log_probs"},
            {
                **{k: object_column([v]) for k, v in fields.items() if k != "raw_prompt_ids"},
                "__num_turns__": np.array([result.output.num_turns], dtype=np.int32),
                **{k: object_column([v]) for k, v in result.output.extra_fields.items()},
            },
        )
        loop = asyncio.get_running_loop()
        result.reward, result.reward_extra = await loop.run_in_executor(self._scoring, _score_row, fn, row)

    def _join(self, results: list[SampleResult], validate: bool) -> DataProto:
        failures = [r.reward_extra.pop("__failure__") for r in results if "__failure__" in r.reward_extra]
        timeouts = sum(int(r.reward_extra.pop("__timeouts__", 0)) for r in results)
        scored = [r for r in results if r.reward is not None and r.output.reward_score is None]
        if scored and len(failures) == len(scored):
            raise RewardFunctionError(
                f"the reward function failed on every one of the {len(scored)} samples of this batch "
                f"({timeouts} timed out); the first failure:\n{failures[0]}",
                timeouts=timeouts,
            )
        extra = align_extra_info([r.reward_extra for r in results])
        for r, i in zip(results, range(len(results))):
            r.reward_extra = {k: v[i] for k, v in extra.items()}
        out = samples_to_batch(results)
        out.meta_info["metrics"] = [r.output.metrics.model_dump() for r in results]
        if scored:
            out.meta_info["reward_metrics"] = {
                "reward/error_count": len(failures) - timeouts,
                "reward/timeout_count": timeouts,
            }
        return out


def _score_row(fn: Any, row: DataProto) -> tuple[torch.Tensor, dict[str, Any]]:
    """Score one sample: its reward row and extra info (``__failure__`` / ``__timeouts__`` when the reward function
    failed on it: a failure of one sample is counted, not raised)."""
    try:
        result = fn(row, return_dict=True)
    except RewardFunctionError as e:
        zeros = torch.zeros(row.batch["responses"].shape, dtype=torch.float32)
        return zeros, {"__failure__": str(e), "__timeouts__": e.timeouts}
    if isinstance(result, torch.Tensor):
        return result.float(), {}
    extra = {k: v[0] for k, v in (result.get("reward_extra_info") or {}).items() if len(v) == 1}
    return result["reward_tensor"].float(), extra


def _quiet(reward_fn: Any) -> Any:
    """Per-sample calls would print one example each: the agent loop's copy of a manager examines none."""
    if reward_fn is not None and hasattr(reward_fn, "num_examine"):
        reward_fn.num_examine = 0
    return reward_fn


AgentLoopWorker = ray.remote(num_cpus=0)(AgentLoopWorkerBase)
