"""``python -m verl.trainer.main_generation [key=value ...]``: offline generation with the training rollout engines.

Reads the parquet ``data.path`` (the column ``data.prompt_key`` holds chat messages, as in RL data), applies the
tokenizer's chat template, generates ``data.n_samples`` responses per prompt and writes the input rows back to
``data.output_path`` with a ``responses`` column: a list of ``n_samples`` strings per row (special tokens skipped).

The responses come from the trainer's own generation path: a `RayWorkerGroup` of ``trainer.n_gpus_per_node ×
trainer.nnodes`` `RolloutServerWorker` processes (role ``rollout``; the engine ``rollout.name`` loads
``model.path``), driven by the trainer's generation path: the `AgentLoopManager` with the single-turn agent loop.
Prompts are left-padded the way `RLHFDataset` makes them (this module's ``GenerationPrompts`` is that dataset, checking
only the prompt column and keeping every row), ``data.batch_size`` prompts at a time, each prompt repeated ``n_samples``
times; sample ``j`` of prompt ``i`` (its row in the file) draws from the engine's random stream for
(``rollout.seed``, step 0, prompt ``i``, sample ``j``), so the output does not depend on the batch size or the
number of workers.

The config (``verl/trainer/config/generation.yaml``, veRL's keys; ``model`` and ``rollout`` are the trainer's
groups) is checked before Ray starts by `validate_generation_config`, which raises `ConfigError` listing every
problem. See docs/generation_eval.md.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import hydra
import ray
from omegaconf import DictConfig, ListConfig, OmegaConf

from verl.trainer.config.compose import compose_config
from verl.trainer.config.unread import set_away
from verl.trainer.config.validate import ConfigError, _looks_local, _walk
from verl.utils.ray_utils import required_logical_cpus

__all__ = [
    "RESPONSES_COLUMN",
    "generate",
    "generation_prompts_class",
    "generation_schema",
    "main",
    "run_generation",
    "validate_generation_config",
]

logger = logging.getLogger(__name__)

RESPONSES_COLUMN = "responses"
DEVICES = ("auto", "cpu", "cuda")
# The RL dataset's truncation modes (rl_dataset.TRUNCATION_MODES; not imported here, so that validation runs before
# torch is imported: a test checks the two agree).
TRUNCATION_MODES = ("error", "left", "right", "middle")
_TRAINER_SHAPE = "actor_rollout_ref"  # where the unread-key table keeps the model and rollout keys


# ---------------------------------------------------------------------------------------------------------- config
def generation_schema() -> DictConfig:
    """The keys allowed and their defaults: ``generation.yaml`` composed (a fresh copy), plus veRL's
    ``data.trust_remote_code``, which veRL's main_generation reads but its yaml lacks (``+data.trust_remote_code``)."""
    schema = compose_config("generation")
    schema.data.trust_remote_code = None
    return schema


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig | ListConfig) else node


def _flat(node: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` of every leaf of a plain nested mapping."""
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _flat(value, f"{prefix}.{key}")
    else:
        yield prefix, node


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _dataclass_problems(cfg: DictConfig, problems: list[str]) -> None:
    """``model`` and ``rollout`` through the worker's config dataclasses (their messages use the trainer's
    ``actor_rollout_ref.`` prefix, dropped here)."""
    from verl.base_config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig, RolloutConfig

    for section, cls in (("model", HFModelConfig), ("rollout", RolloutConfig)):
        try:
            omega_conf_to_dataclass(cfg[section], cls)
        except (ValueError, TypeError) as e:
            problems.append(f"{section}: " + str(e).replace(f"{_TRAINER_SHAPE}.", ""))


def _data_problems(data: DictConfig, problems: list[str], check_environment: bool) -> None:
    for key in ("path", "output_path", "prompt_key"):
        if not isinstance(data[key], str) or not data[key]:
            problems.append(f"data.{key}={data[key]!r} must be a non-empty string")
    if check_environment and isinstance(data.path, str) and data.path:
        if not os.path.isfile(os.path.expanduser(data.path)):
            problems.append(f"data.path={data.path!r}: no such file; give the parquet file of the prompts")
    for key in ("n_samples", "batch_size"):
        if not _is_positive_int(data[key]):
            problems.append(f"data.{key}={data[key]!r} must be an integer >= 1")
    if data.truncation not in TRUNCATION_MODES:
        problems.append(f"data.truncation={data.truncation!r}; use one of {list(TRUNCATION_MODES)}")


def _trainer_problems(trainer: DictConfig, problems: list[str], check_environment: bool) -> None:
    for key in ("nnodes", "n_gpus_per_node"):
        if not _is_positive_int(trainer[key]):
            problems.append(f"trainer.{key}={trainer[key]!r} must be an integer >= 1 (the workers are their product)")
    if trainer.device not in DEVICES:
        problems.append(f"trainer.device={trainer.device!r}; use auto, cpu or cuda")
    elif trainer.device == "cuda" and check_environment:
        import torch

        if not torch.cuda.is_available():
            problems.append("trainer.device=cuda but no CUDA device is visible; use trainer.device=auto or cpu")


def _rollout_problems(cfg: DictConfig, problems: list[str]) -> None:
    """What offline generation needs of the rollout section (beyond the dataclass's own checks)."""
    rollout, n_samples = cfg.rollout, cfg.data.n_samples
    if rollout.n != 1:
        problems.append(
            f"rollout.n={rollout.n!r}: offline generation draws data.n_samples responses per prompt; set "
            f"data.n_samples={rollout.n} and leave rollout.n at 1"
        )
    tp = rollout.tensor_model_parallel_size
    if rollout.name == "vllm":
        if tp != 1:
            problems.append(
                f"rollout.name=vllm with rollout.tensor_model_parallel_size={tp}: the in-process vLLM engine runs one "
                "engine per worker (tensor parallel size 1); set rollout.tensor_model_parallel_size=1 and raise "
                "trainer.n_gpus_per_node instead"
            )
        if str(rollout.load_format).startswith("dummy"):
            problems.append(
                f"rollout.load_format={rollout.load_format!r}: a rollout-only worker has no trainer to sync weights "
                "from, so the engine must load model.path itself; set rollout.load_format=auto"
            )
    elif rollout.name == "hf" and tp != 1:
        logger.warning("rollout.tensor_model_parallel_size=%r has no effect: the hf engine does not shard", tp)
    if rollout.name == "hf" and rollout.free_cache_engine:
        problems.append(
            "rollout.free_cache_engine=true with rollout.name=hf: the hf engine drops its weights when it sleeps and a "
            "rollout-only worker has no trainer to reload them from; set rollout.free_cache_engine=false"
        )
    greedy = not rollout.do_sample or rollout.temperature == 0
    if greedy and _is_positive_int(n_samples) and n_samples > 1:
        logger.warning(
            "greedy decoding (rollout.do_sample=false or rollout.temperature=0) with data.n_samples=%d: every sample "
            "of a prompt will be the same",
            n_samples,
        )


def _unread_problems(config: DictConfig, schema: DictConfig, problems: list[str]) -> None:
    """Keys accepted but not acted on: the trainer's unread-key table judges ``model``, ``rollout`` and
    ``ray_kwargs`` (against this config's defaults); every ``actor`` key is without effect here."""

    def shaped(cfg: DictConfig) -> DictConfig:
        return OmegaConf.create(
            {_TRAINER_SHAPE: {"model": cfg.model, "rollout": cfg.rollout}, "ray_kwargs": cfg.ray_kwargs}
        )

    for entry, key, value, default in set_away(shaped(config), shaped(schema)):
        key = key.removeprefix(f"{_TRAINER_SHAPE}.")
        if entry.consequence == "error":
            problems.append(f"{key}={value!r}: {entry.why}; leave it at {json.dumps(default)}")
        else:
            logger.warning("%s=%r has no effect here: %s", key, value, entry.why)
    defaults = dict(_flat(_plain(schema.actor), "actor"))
    for key, value in _flat(_plain(config.get("actor") or {}), "actor"):
        if key in defaults and value != defaults[key]:
            logger.warning("%s=%r has no effect: a rollout-only worker has no actor", key, value)


def _environment_problems(cfg: DictConfig, problems: list[str]) -> None:
    import importlib.util

    from verl.workers.rollout.registry import rollout_unavailable_reason

    name = cfg.rollout.name
    reason = rollout_unavailable_reason(name) if isinstance(name, str) else None
    if reason:
        problems.append(f"rollout.name={name!r}: {reason}; or use rollout.name=hf")
    for key in ("path", "tokenizer_path"):
        value = cfg.model.get(key)
        if isinstance(value, str) and value and _looks_local(value) and not os.path.isdir(os.path.expanduser(value)):
            problems.append(f"model.{key}={value!r}: no such directory; give the path of a local model folder")
    lib = cfg.model.external_lib
    for module in [lib] if isinstance(lib, str) else list(lib or []):
        try:
            found = isinstance(module, str) and importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a missing parent package
            found = False
        if not found:
            problems.append(f"model.external_lib={module!r}: no module of that name; install it or fix the name")


def validate_generation_config(config: DictConfig, check_environment: bool = True) -> None:
    """Raise `ConfigError` listing every problem of ``config`` (a composed ``generation`` config): keys the schema
    does not have (`generation_schema`), wrong types, the model and rollout dataclasses' checks, the data and
    worker sizes, what offline generation needs of the engine, and the trainer's unread keys (a harmless one logs a
    warning). ``check_environment``: also check the data file, the model folders, ``model.external_lib`` and the
    engine's package."""
    schema = generation_schema()
    problems: list[str] = []
    _walk(config, schema, "", problems)
    if problems:  # unknown keys / wrong types: the rest would only repeat them
        raise ConfigError(problems)
    cfg = OmegaConf.create(OmegaConf.to_container(config, resolve=True))
    _dataclass_problems(cfg, problems)
    _data_problems(cfg.data, problems, check_environment)
    _trainer_problems(cfg.trainer, problems, check_environment)
    _rollout_problems(cfg, problems)
    _unread_problems(config, schema, problems)
    if check_environment:
        _environment_problems(cfg, problems)
    if problems:
        raise ConfigError(problems)


# ---------------------------------------------------------------------------------------------------------- prompts
@functools.cache
def generation_prompts_class() -> type:
    """``GenerationPrompts``, built on first use (the RL dataset imports torch, which validation does without)."""
    from verl.utils.dataset.rl_dataset import RLHFDataset, _read_parquet, _row_problems

    class GenerationPrompts(RLHFDataset):
        """`RLHFDataset` over one parquet file that keeps every row, in order, and checks only the prompt column
        (generation needs no reference answer); items and left padding are the RL dataset's."""

        def _load_rows(self) -> tuple[list[dict[str, Any]], list[tuple[str, int, int]]]:
            (path,) = self.data_files
            rows = _read_parquet(path, self.prompt_key)
            listed = []
            for row_no, row in enumerate(rows):
                # only the prompt is judged: a reward-model-scored style needs no ground truth
                only_prompt = {self.prompt_key: row[self.prompt_key], "reward_model": {"style": "model"}}
                problems = _row_problems(only_prompt, self.prompt_key)
                if problems:
                    listed.append(f"{path}: row {row_no}: " + "; ".join(problems))
            if listed:
                more = f"\n... and {len(listed) - 10} more" if len(listed) > 10 else ""
                head = f"{len(listed)} malformed prompt(s) (data.prompt_key):\n"
                raise ValueError(head + "\n".join(listed[:10]) + more)
            return rows, [(path, i, i) for i in range(len(rows))]

        def _check_lengths(self, rows: list, texts: list, ids: list, origins: list) -> tuple[list, list, list, list]:
            try:
                return super()._check_lengths(rows, texts, ids, origins)
            except ValueError as e:
                raise ValueError(
                    f"{e}\n(offline generation: the limit is rollout.prompt_length, and no row is dropped: raise "
                    "rollout.prompt_length or set data.truncation=left|right|middle)"
                ) from e

        def batch(self, start: int, stop: int) -> Any:
            """Prompts ``start``..``stop`` as a `DataProto` (``input_ids``, ``attention_mask``, ``position_ids``,
            ``prompt_index``: the row in the file), without the padding columns every row of the batch has."""
            import torch

            from verl.protocol import DataProto

            items = [self[i] for i in range(start, stop)]
            keys = ("input_ids", "attention_mask", "position_ids")
            tensors = {k: torch.stack([item[k] for item in items]) for k in keys}
            first = int(tensors["attention_mask"].any(0).long().argmax())  # the first column some prompt uses
            tensors = {k: v[:, first:] for k, v in tensors.items()}
            tensors["prompt_index"] = torch.arange(start, stop)
            return DataProto.from_dict(tensors)

    GenerationPrompts.__module__, GenerationPrompts.__qualname__ = __name__, "GenerationPrompts"
    return GenerationPrompts


# ---------------------------------------------------------------------------------------------------------- run
def _worker_env() -> dict[str, str]:
    env = {"TOKENIZERS_PARALLELISM": "false", "RAY_AUTH_MODE": "disabled"}
    env.update({k: v for k, v in os.environ.items() if k.startswith("VERL_")})
    return env


def _decode(output: Any, tokenizer: Any) -> list[str]:
    """Each output row's valid response tokens as text (special tokens skipped)."""
    lengths = output.batch["response_mask"].sum(-1).tolist()
    ids = [output.batch["responses"][i, : int(n)].tolist() for i, n in enumerate(lengths)]
    return tokenizer.batch_decode(ids, skip_special_tokens=True)


def _load_prompts(config: DictConfig, tokenizer: Any) -> tuple[Any, Any]:
    """The input rows (a pandas DataFrame) and their prompts (`GenerationPrompts`)."""
    import pandas as pd

    data, path = config.data, os.path.expanduser(config.data.path)
    frame = pd.read_parquet(path)
    dataset_config = {
        "prompt_key": data.prompt_key,
        "max_prompt_length": config.rollout.prompt_length,
        "truncation": data.truncation,
        "apply_chat_template_kwargs": _plain(data.apply_chat_template_kwargs),
        "return_raw_chat": False,
    }
    prompts = generation_prompts_class()(path, tokenizer, dataset_config)
    if len(prompts) != len(frame):
        raise RuntimeError(f"{path}: read {len(frame)} rows but {len(prompts)} prompts")
    if RESPONSES_COLUMN in frame.columns:
        logger.warning("%s already has a %r column: it is replaced in the output", path, RESPONSES_COLUMN)
    return frame, prompts


def generate(config: DictConfig) -> str:
    """Generate for every row of ``data.path`` and write ``data.output_path``; returns that path. ``config`` is a
    validated, resolved ``generation`` config; Ray must be running. The workers start first, and the prompts are
    tokenized while they load."""
    import pandas as pd

    from verl.experimental.agent_loop import AgentLoopManager
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.trainer.main_ppo import load_tokenizer
    from verl.utils.import_utils import import_external_libs
    from verl.workers.rollout_worker import RolloutServerWorker

    data, model, n = config.data, config.model, config.data.n_samples
    model.path = os.path.expanduser(model.path)
    if model.tokenizer_path:
        model.tokenizer_path = os.path.expanduser(model.tokenizer_path)
    model.trust_remote_code = bool(model.trust_remote_code or data.get("trust_remote_code"))
    world = [config.trainer.n_gpus_per_node] * config.trainer.nnodes
    pool = RayResourcePool(world, use_gpu=config.trainer.device != "cpu", max_colocate_count=1)
    worker_config = OmegaConf.create({"model": model, "rollout": config.rollout})
    cls = RayClassWithInitArgs(RolloutServerWorker, config=worker_config, role="rollout")
    group = None
    responses: list[list[str]] = []
    try:
        group = RayWorkerGroup(pool, cls)  # the actors start loading now
        import_external_libs(model.external_lib)
        tokenizer = load_tokenizer(model)
        frame, prompts = _load_prompts(config, tokenizer)
        group.init_model()
        manager = AgentLoopManager(
            OmegaConf.create({"actor_rollout_ref": worker_config, "data": {}}), group, tokenizer=tokenizer
        )
        batches = range(0, len(prompts), data.batch_size)
        for number, start in enumerate(batches, 1):
            stop = min(start + data.batch_size, len(prompts))
            output = manager.generate_sequences(prompts.batch(start, stop).repeat(n, interleave=True))
            texts = _decode(output, tokenizer)
            responses.extend(texts[i : i + n] for i in range(0, len(texts), n))
            logger.info("[%d/%d] generated %d × %d responses", number, len(batches), stop - start, n)
    finally:
        if group is not None:
            group.shutdown()
        pool.release()
    output_path = os.path.expanduser(data.output_path)
    frame[RESPONSES_COLUMN] = pd.Series(responses, index=frame.index, dtype=object)
    os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
    frame.to_parquet(output_path)
    logger.info("wrote %d rows with %d responses each to %s", len(frame), n, output_path)
    return output_path


def run_generation(config: DictConfig) -> str:
    """Validate ``config`` (every problem at once, before Ray starts), start Ray unless it runs (and stop it after),
    generate and write ``data.output_path``; returns that path."""
    validate_generation_config(config)
    config = OmegaConf.create(OmegaConf.to_container(config, resolve=True))
    started = not ray.is_initialized()
    if started:
        ray_init = {k: v for k, v in _plain(config.ray_kwargs.ray_init).items() if v is not None}
        if not ray_init.get("address") and not os.environ.get("RAY_ADDRESS"):  # a cluster of its own: size it
            workers = config.trainer.n_gpus_per_node * config.trainer.nnodes
            ray_init.setdefault("num_cpus", required_logical_cpus(workers))
        ray.init(runtime_env={"env_vars": _worker_env()}, include_dashboard=False, **ray_init)
    try:
        return generate(config)
    finally:
        if started:
            ray.shutdown()


@hydra.main(config_path="config", config_name="generation", version_base=None)
def main(config: DictConfig) -> None:
    """The command-line entry point."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    run_generation(config)


if __name__ == "__main__":
    main()
