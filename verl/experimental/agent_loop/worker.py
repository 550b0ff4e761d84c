"""`AgentLoopWorker`: runs one asyncio task per sample — its agent loop, then its reward — and joins the batch.

Per sample: the loop named by its ``agent_name`` (default: :func:`default_agent_loop`) is built with
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
import functools
import inspect
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
    default_agent_loop,
    load_agent_loop_configs,
)
from verl.experimental.agent_loop.failures import keep_failed_samples
from verl.experimental.agent_loop.postprocess import (
    SampleResult,
    object_column,
    pad_sample,
    rows_to_tensors,
    samples_to_batch,
)
from verl.experimental.agent_loop.server_manager import AsyncLLMServerManager, SampleClient
from verl.experimental.reward_loop.reward_fn import RewardLoopFunction
from verl.protocol import DataProto
from verl.utils.rollout_trace import RolloutTraceConfig, rollout_trace_attr
from verl.workers.config.builders import build_rollout_config
from verl.workers.reward_manager.abstract import RewardFunctionError, align_extra_info
from verl.workers.rollout.request import as_id_list, sample_seed

__all__ = ["AgentLoopWorker", "AgentLoopWorkerBase"]

logger = logging.getLogger(__name__)

ROUTING_CALLS = ("add_servers", "remove_servers", "in_flight_on", "served_by")


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
        server_handles: the rollout replicas (see :class:`AsyncLLMServerManager`), or a ready client to send the
            requests through (veRL 0.10's ``llm_client``: anything with ``async generate(...)`` and ``abort(...)``).
        reward_fn / val_reward_fn: reward managers scoring each finished sample (``fn(data, return_dict=True)``)
            in training / validation; None: not scored here (the trainer scores the batch).
        teacher_client: on-policy distillation's teachers, one client per teacher key
            (:meth:`~verl.experimental.teacher_loop.MultiTeacherModelManager.get_client`): each finished training
            sample (never a validation one) gets the teacher's view of its response tokens, ``teacher_ids`` /
            ``teacher_logprobs`` (bs, response_length, K).
    """

    def __init__(
        self,
        config: Any,
        server_handles: list[Any],
        reward_fn: Any = None,
        val_reward_fn: Any = None,
        teacher_client: Any = None,
    ) -> None:
        from verl.utils.tokenizer import hf_tokenizer

        self.config = config if isinstance(config, DictConfig) else OmegaConf.create(config)
        self.rollout_config = build_rollout_config(self.config.actor_rollout_ref.rollout)  # typed, defaults filled
        if not hasattr(self, "server_manager"):  # a recipe's subclass may bring its own
            is_client = inspect.iscoroutinefunction(getattr(server_handles, "generate", None))
            self.server_manager = server_handles if is_client else AsyncLLMServerManager(self.config, server_handles)
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
        self.teacher = None
        if teacher_client is not None:
            from verl.experimental.teacher_loop import AsyncTeacherLLMServerManager

            self.teacher = AsyncTeacherLLMServerManager(self.config, teacher_client)
        self._scoring = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-loop-reward")
        self._factories: dict[str, Any] = {}
        self._trainer_wrap, self._data_wrap = DictConfigWrap(self.config), DictConfigWrap(self.data_config)
        trace, trainer = self.rollout_config.trace, self.config.get("trainer") or {}
        RolloutTraceConfig.init(  # the names default to the run's (as veRL's YAML interpolates them)
            trace.project_name or trainer.get("project_name"),
            trace.experiment_name or trainer.get("experiment_name"),
            trace.backend,
            trace.token2text,
            trace.max_samples_per_step_per_worker,
        )
        if trace.token2text and getattr(self.server_manager, "tokenizer", None) is None:
            self.server_manager.tokenizer = self.tokenizer  # the traced generate calls decode their ids with it

    async def routing(self, call: str, handles: list[Any]) -> Any:
        """Run the server manager's ``add_servers`` / ``remove_servers`` / ``in_flight_on`` / ``served_by`` on this
        worker's event loop (the replicas of the lent training workers come and go between batches)."""
        if call not in ROUTING_CALLS:
            raise ValueError(f"routing call {call!r}; use one of {ROUTING_CALLS}")
        method = getattr(self.server_manager, call, None)
        if method is None:
            raise NotImplementedError(
                f"{type(self.server_manager).__qualname__} cannot {call}: lending replicas needs the built-in "
                "AsyncLLMServerManager"
            )
        return method(handles)

    def _loop_factory(self, agent_name: str) -> Any:
        """Builds agent ``agent_name``'s loop from its registry entry — what ``hydra.utils.instantiate`` does, with
        the class resolved once (instantiate costs ~2 ms a sample); an entry with nested ``_target_`` s still goes
        through hydra."""
        factory = self._factories.get(agent_name)
        if factory is None:
            import hydra.utils

            entry = dict(agent_loop_target(agent_name))
            extra = {k: v for k, v in entry.items() if k != "_target_"}
            if any(isinstance(v, dict) and "_target_" in v for v in extra.values()):
                factory = functools.partial(hydra.utils.instantiate, entry)
            else:
                factory = functools.partial(hydra.utils.get_class(entry["_target_"]), **extra)
            self._factories[agent_name] = factory
        return factory

    # ------------------------------------------------------------------ the batch
    async def generate_sequences(self, batch: DataProto) -> DataProto:
        """Run every sample of ``batch`` (prompt rows, one sample each) and return the rollout batch."""
        rollout = self.rollout_config
        meta = batch.meta_info
        validate = bool(meta.get("validate", False))
        params, greedy = self._sampling_params(meta)
        rows = len(batch)
        names = batch.non_tensor_batch.get("agent_name")
        names = [default_agent_loop(rollout)] * rows if names is None else [str(n) for n in names]
        step = int(meta.get("global_steps", 0))
        fn = self.reward_fns[validate]
        key = getattr(fn, "reward_fn_key", "data_source")
        if fn is not None and key not in batch.non_tensor_batch:
            # a caller that kept the reward columns out of the prompts (veRL's older recipes) scores the batch itself
            logger.debug("no %r column in the prompts: samples are not scored in the agent loops", key)
            fn = None
        scorer = None if fn is None else _Scorer(fn, self._scoring)
        traces = _trace_scopes(batch, step, validate, rollout.seed)
        keep_failed = bool(meta.get("keep_failed_samples", False))
        tasks, prompt_ids = [], []
        for i in range(rows):
            fields = {k: v[i] for k, v in batch.non_tensor_batch.items() if k != "agent_name"}
            if batch.batch is not None and "input_ids" in batch.batch.keys():
                ids, mask = batch.batch["input_ids"][i], batch.batch["attention_mask"][i]
                fields["raw_prompt_ids"] = ids[mask.bool()].tolist()
            prompt_ids.append(list(fields.get("raw_prompt_ids") or []))
            sample_params = dict(params)
            if not greedy:
                prompt, sample = (int(batch.batch[k][i]) for k in ("prompt_index", "sample_index"))
                sample_params["seed"] = sample_seed(rollout.seed, step, prompt, sample)
            teacher = self.teacher is not None and not validate
            run = self._run_sample(names[i], sample_params, fields, scorer, traces[i], teacher)
            tasks.append(asyncio.create_task(run))
        # every loop runs to its first await: the first requests of all of them go out as one wave per replica
        with getattr(self.server_manager, "wave", contextlib.nullcontext)():
            await asyncio.sleep(0)
        try:
            results = await asyncio.gather(*tasks, return_exceptions=keep_failed)
            if keep_failed:  # failed samples become placeholder rows, their groups marked failed
                pad = self._pad_id()
                lengths = (rollout.prompt_length, rollout.response_length)
                results = keep_failed_samples(results, names, prompt_ids, *lengths, pad)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(self.server_manager.abort(None), return_exceptions=True)
            raise
        return self._join(results, scorer, failed_column=keep_failed)

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
        self,
        agent_name: str,
        sampling_params: dict[str, Any],
        fields: dict[str, Any],
        scorer: _Scorer | None,
        trace: dict[str, Any] | None = None,
        teacher: bool = False,
    ) -> list[SampleResult]:
        """One sample: its loop run, its outputs padded (several for a multi-output session), scored and, for
        distillation, seen by the teacher."""
        client = SampleClient(self.server_manager)  # records the weight version of each token it returns
        loop = self._loop_factory(agent_name)(
            trainer_config=self._trainer_wrap,
            server_manager=client,
            tokenizer=self.tokenizer,
            processor=self.processor,
            dataset_cls=self.dataset_cls,
            dataset_config=self._data_wrap,
        )
        with rollout_trace_attr(name="agent_loop", **(trace or {})):
            returned = await loop.run(sampling_params, **fields)
        outputs = _outputs_of(returned, agent_name, loop)
        rollout = self.rollout_config
        lengths, pad = (rollout.prompt_length, rollout.response_length), self._pad_id()
        versions = _versions_per_output(outputs, client.token_versions, agent_name)
        results = [
            SampleResult(agent_name, output, pad_sample(output, agent_name, *lengths, pad), token_versions=v, index=i)
            for i, (output, v) in enumerate(zip(outputs, versions, strict=True))
        ]
        if teacher:
            routing = fields.get(self.teacher.teacher_key)
            for result in results:
                result.teacher = await self._teacher_view(result.output, routing)
        final = results[-1]
        await self._score(final, fields, scorer)
        for result in results[:-1]:  # veRL 0.10: the session's final reward is every output's
            result.reward_extra = dict(final.reward_extra)
            if final.reward is not None:
                result.reward = _at_last_token(result, float(final.reward.sum()))
        return results

    async def _teacher_view(self, output: AgentLoopOutput, routing_key: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The teacher's ids and log-probs at each response position of ``output`` (prompt and response sent as one
        sequence), zeros past the response: each (response_length, K)."""
        prompt, response = list(output.prompt_ids), list(output.response_ids)
        ids, log_probs = await self.teacher.compute_teacher_logprobs_single(prompt + response, routing_key=routing_key)
        length = self.rollout_config.response_length
        out_ids = torch.zeros((length, ids.shape[-1]), dtype=ids.dtype)
        out_lp = torch.zeros((length, log_probs.shape[-1]), dtype=log_probs.dtype)
        n = min(len(response), length)
        out_ids[:n], out_lp[:n] = ids[len(prompt) : len(prompt) + n], log_probs[len(prompt) : len(prompt) + n]
        return out_ids, out_lp

    def _pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        return int(pad or 0)

    # ------------------------------------------------------------------ rewards
    async def _score(self, result: SampleResult, fields: dict[str, Any], scorer: _Scorer | None) -> None:
        """The sample's ``rm_scores`` row: the loop's ``reward_score`` at the last response token, else the reward
        function's (``scorer``: this batch's reward calls, run while other samples still generate)."""
        if result.output.reward_score is not None:
            result.reward = _at_last_token(result, float(result.output.reward_score))
            return
        if scorer is None:
            return
        tensors = rows_to_tensors([result.rows])
        row = DataProto.from_dict(
            {k: v for k, v in tensors.items() if k != "rollout_log_probs"},
            {
                **{k: object_column([v]) for k, v in fields.items() if k != "raw_prompt_ids"},
                "__num_turns__": np.array([result.output.num_turns], dtype=np.int32),
                **{k: object_column([v]) for k, v in result.output.extra_fields.items()},
            },
        )
        result.reward, result.reward_extra = await scorer.score(row)

    def _join(
        self, samples: list[list[SampleResult]], scorer: _Scorer | None, failed_column: bool = False
    ) -> DataProto:
        if scorer is not None:
            scorer.check()
        results = [result for sample in samples for result in sample]
        extra = align_extra_info([r.reward_extra for r in results])
        for i, r in enumerate(results):
            r.reward_extra = {k: v[i] for k, v in extra.items()}
        out = samples_to_batch(results, failed_column)
        out.meta_info["metrics"] = [sample[-1].output.metrics.model_dump() for sample in samples]
        if scorer is not None and scorer.scored:
            counts = {"reward/error_count": scorer.errors, "reward/timeout_count": scorer.timeouts}
            out.meta_info["reward_metrics"] = counts
        return out


class _Scorer:
    """One batch's reward calls, while the other samples still generate: samples that finish together are scored
    in one call of a batch reward manager, in the worker's scoring thread; with a reward-loop manager
    (`verl.experimental.reward_loop`), each sample's ``run_single`` is awaited as it finishes. Failures are counted
    per sample."""

    def __init__(self, fn: Any, executor: concurrent.futures.Executor) -> None:
        self.fn, self.executor = fn, executor
        self.pending: list[tuple[DataProto, asyncio.Future]] = []
        self.task: asyncio.Task | None = None
        self.scored = self.errors = self.timeouts = 0
        self.first_failure: str | None = None

    async def score(self, row: DataProto) -> tuple[torch.Tensor, dict[str, Any]]:
        if isinstance(self.fn, RewardLoopFunction):  # a reward-loop manager: each sample alone, awaited
            outcome = await self.fn.score_row(row)
            self.scored += 1
            self.timeouts += outcome.timed_out
            self.errors += outcome.failure is not None and not outcome.timed_out
            self.first_failure = self.first_failure or outcome.failure
            return self.fn.manager.assemble_rm_scores(row, [outcome.score]), outcome.extra
        future = asyncio.get_running_loop().create_future()
        self.pending.append((row, future))
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self.pending:
            taken, self.pending = self.pending, []
            groups: dict[tuple[str, ...], list[tuple[DataProto, asyncio.Future]]] = {}
            for row, future in taken:  # rows join one call when they have the same columns
                groups.setdefault(tuple(sorted(row.non_tensor_batch)), []).append((row, future))
            for group in groups.values():
                rows = DataProto.concat([row for row, _ in group])
                try:
                    outcome = await loop.run_in_executor(self.executor, _score_rows, self.fn, rows)
                except BaseException as error:  # a broken reward manager: every waiting sample hears of it
                    for _, future in group:
                        if not future.done():
                            future.set_exception(error)
                    continue
                per_row, errors, timeouts, failure = outcome
                self.scored += len(group)
                self.errors += errors
                self.timeouts += timeouts
                self.first_failure = self.first_failure or failure
                for (_, future), value in zip(group, per_row):
                    if not future.done():
                        future.set_result(value)

    def check(self) -> None:
        """A reward function that failed on every sample of the batch stops the run."""
        if self.scored and self.errors + self.timeouts == self.scored:
            raise RewardFunctionError(
                f"the reward function failed on every one of the {self.scored} samples of this batch "
                f"({self.timeouts} timed out); the first failure:\n{self.first_failure}",
                timeouts=self.timeouts,
            )


def _score_rows(fn: Any, rows: DataProto) -> tuple[list[tuple[torch.Tensor, dict[str, Any]]], int, int, str | None]:
    """Score rows in one call: each row's reward and extra info, and how many failed / timed out (a manager that
    fails on every row of the call raises ``RewardFunctionError``: counted here, not raised)."""
    n = len(rows)
    try:
        result = fn(rows, return_dict=True)
    except RewardFunctionError as e:
        zeros = torch.zeros(rows.batch["responses"].shape, dtype=torch.float32)
        return [(zeros[i : i + 1], {}) for i in range(n)], n - e.timeouts, e.timeouts, str(e)
    if isinstance(result, torch.Tensor):
        return [(result[i : i + 1].float(), {}) for i in range(n)], 0, 0, None
    tensor, extra = result["reward_tensor"].float(), result.get("reward_extra_info") or {}
    metrics = result.get("reward_metrics") or {}
    per_row = [(tensor[i : i + 1], {k: v[i] for k, v in extra.items() if len(v) == n}) for i in range(n)]
    return per_row, int(metrics.get("reward/error_count", 0)), int(metrics.get("reward/timeout_count", 0)), None


def _quiet(reward_fn: Any) -> Any:
    """Per-sample calls would print one example each: the agent loop's copy of a manager examines none."""
    if reward_fn is not None and hasattr(reward_fn, "num_examine"):
        reward_fn.num_examine = 0
    return reward_fn


AgentLoopWorker = ray.remote(num_cpus=0)(AgentLoopWorkerBase)


def _outputs_of(returned: Any, agent_name: str, loop: Any) -> list[AgentLoopOutput]:
    """``run``'s return as a list of outputs: one ``AgentLoopOutput``, or a non-empty list of them (veRL 0.10's
    multi-output sessions, the final output last)."""
    outputs = returned if isinstance(returned, list) else [returned]
    bad = next((o for o in outputs if not isinstance(o, AgentLoopOutput)), None)
    if not outputs or bad is not None:
        what = "an empty list" if not outputs else type(bad).__name__
        raise TypeError(
            f"agent loop {agent_name!r} ({type(loop).__qualname__}.run) returned {what}, not an AgentLoopOutput or "
            "a non-empty list of them"
        )
    return outputs


def _at_last_token(result: SampleResult, score: float) -> torch.Tensor:
    """A (1, response_length) reward row holding ``score`` at the sample's last response token."""
    row = torch.zeros((1, len(result.rows["responses"])), dtype=torch.float32)
    row[0, max(sum(result.rows["response_valid"]) - 1, 0)] = score
    return row


_UNATTRIBUTED: set[str] = set()  # loops already warned about (once per process)


def _versions_per_output(outputs: list[AgentLoopOutput], versions: list[int], agent_name: str) -> list[list[int]]:
    """Each output's share of the sample's token versions (one per generated token, in order): all of them for a
    single output; for several, the outputs' generated tokens in order when their counts add up to the record's
    (trajectories of disjoint turns, or a loop that recorded its outputs' versions, as the gateway does). Otherwise
    the outputs share tokens the record cannot attribute: they get no per-token versions (a warning says so)."""
    if len(outputs) == 1:
        return [list(versions)]
    counts = [sum(1 for m in output.response_mask if m) for output in outputs]
    if sum(counts) != len(versions):
        if versions and agent_name not in _UNATTRIBUTED:
            _UNATTRIBUTED.add(agent_name)
            logger.warning(
                "agent loop %r: %d outputs with %d generated tokens for %d recorded token versions: their per-token "
                "weight versions are not recorded (record them in the sample client's token_versions, in order); "
                "said once per loop",
                agent_name,
                len(outputs),
                sum(counts),
                len(versions),
            )
        return [[] for _ in outputs]
    bounds = np.cumsum([0, *counts])
    return [list(versions[bounds[i] : bounds[i + 1]]) for i in range(len(outputs))]


def _trace_scopes(batch: DataProto, step: int, validate: bool, seed: int) -> list[dict[str, Any]]:
    """Per row, its ``rollout_trace_attr`` arguments: the sample (the dataset's ``index`` where the prompts carry
    one, else the prompt's place in the batch), its copy number, the step; with
    ``rollout.trace.max_samples_per_step_per_worker`` set, only that many samples (every copy of each) are traced,
    picked by a generator of their own (the run's other draws do not move)."""
    rows = len(batch)
    tensors = batch.batch.keys() if batch.batch is not None else ()
    index = batch.non_tensor_batch.get("index")
    if index is None:
        index = batch.batch["prompt_index"].tolist() if "prompt_index" in tensors else list(range(rows))
    copies = batch.batch["sample_index"].tolist() if "sample_index" in tensors else [0] * rows
    limit = RolloutTraceConfig.get_instance().max_samples_per_step_per_worker
    keys = [str(i) for i in index]
    chosen = set(keys)
    if limit is not None and limit < len(chosen):
        rng = np.random.default_rng([int(seed), int(step), int(validate)])
        chosen = set(rng.choice(sorted(chosen), size=limit, replace=False).tolist())
    return [
        {
            "sample_index": _plain_int(index[i]),
            "rollout_n": int(copies[i]),
            "step": step,
            "validate": validate,
            "trace": keys[i] in chosen,
        }
        for i in range(rows)
    ]


def _plain_int(value: Any) -> Any:
    """A numpy/torch integer as ``int`` (trace attributes are JSON); anything else unchanged."""
    return int(value) if isinstance(value, np.integer | int) else value
