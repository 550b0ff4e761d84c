"""Write docs/config_reference.md: every leaf key of the trainer config, its default, what it does, and where it
differs from veRL.

    python scripts/generate_config_reference.py           # rewrite docs/config_reference.md
    python scripts/generate_config_reference.py --check   # exit 1 if it is out of date (a test runs this)

Where each column comes from:

- key and default: ``verl/trainer/config/ppo_trainer.yaml`` itself (a leaf is a scalar, a list or an empty mapping);
- description: for the sections backed by config dataclasses (``actor_rollout_ref.{model,actor,ref,rollout}``,
  ``critic``, ``algorithm``), the ``Args:`` section of each dataclass's docstring (a name with a dot, such as
  ``tiled_mlp.enabled``, describes a key inside a mapping-valued field); for the other sections, ``DESCRIPTIONS``
  below;
- vs veRL: ``validate.UNIMPLEMENTED`` and ``validate.TRAINER_MODES`` (read programmatically), plus ``OURS`` (keys
  veRL does not have), ``DIFFERENCES`` and ``NOT_READ`` (keys accepted for compatibility that this version never
  reads) below.

A leaf without a description, or a table entry naming a key the YAML does not have, makes the generator fail, so a
new key cannot go undocumented and a removed one cannot linger.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: import verl from this checkout
    sys.path.insert(0, str(ROOT))

from verl.trainer.config import validate  # noqa: E402
from verl.trainer.config.algorithm import AlgoConfig  # noqa: E402
from verl.workers.config import ActorConfig, CriticConfig, HFModelConfig, RefConfig, RolloutConfig  # noqa: E402

YAML_PATH = ROOT / "verl" / "trainer" / "config" / "ppo_trainer.yaml"
DOC_PATH = ROOT / "docs" / "config_reference.md"

# YAML sections whose keys are the fields of a config dataclass (nested dataclasses are followed).
DATACLASS_ROOTS: dict[str, type] = {
    "actor_rollout_ref.model": HFModelConfig,
    "actor_rollout_ref.actor": ActorConfig,
    "actor_rollout_ref.ref": RefConfig,
    "actor_rollout_ref.rollout": RolloutConfig,
    "critic": CriticConfig,
    "algorithm": AlgoConfig,
}

# Tables: one per top-level section, except actor_rollout_ref, which gets one per sub-section.
SPLIT_SECTIONS = ("actor_rollout_ref",)

# Descriptions of the keys that no dataclass backs (the sections written by scripts/generate_trainer_config.py).
DESCRIPTIONS: dict[str, str] = {
    # data
    "data.tokenizer": "Tokenizer folder for the data; the trainer tokenizes with the policy's tokenizer "
    "(`actor_rollout_ref.model.tokenizer_path` or `.path`).",
    "data.use_shm": "Copy the data files to shared memory first.",
    "data.train_files": "Training parquet file(s) in veRL's schema (`prompt` chat, `data_source`, "
    "`reward_model.ground_truth`, `extra_info`); a path or a list of paths.",
    "data.val_files": "Validation parquet file(s); null or empty: no validation.",
    "data.train_max_samples": "Use at most this many training prompts (-1: all); which rows are kept depends on "
    "`data.shuffle` / `data.seed`.",
    "data.val_max_samples": "Use at most this many validation prompts (-1: all).",
    "data.prompt_key": "Column holding the prompt (a list of chat messages).",
    "data.reward_fn_key": "Column that selects the scoring rule (passed to `compute_score` as `data_source`).",
    "data.max_prompt_length": "Prompts are left-padded to this many tokens; longer ones are handled by "
    "`data.truncation` or filtered (`data.filter_overlong_prompts`). Also the rollout's `prompt_length`.",
    "data.max_response_length": "Responses are generated up to this many tokens (the rollout's `response_length`).",
    "data.train_batch_size": "Prompts per training step (each generates `actor_rollout_ref.rollout.n` responses).",
    "data.gen_batch_size": "Prompts per generation batch (the dataloader's batch size). With "
    "`algorithm.filter_groups.enable` batches are generated until `train_batch_size` prompts with a non-constant "
    "metric are kept; otherwise it must equal `train_batch_size`.",
    "data.val_batch_size": "Prompts per validation batch; null: the whole validation set in one batch.",
    "data.tool_config_path": "Tool config of multi-turn rollouts (follows "
    "`actor_rollout_ref.rollout.multi_turn.tool_config_path`).",
    "data.return_raw_input_ids": "Also return the prompt's ids before chat templating.",
    "data.return_raw_chat": "Keep the prompt's messages in each item (`raw_prompt`).",
    "data.return_full_prompt": "Keep the chat-templated prompt text in each item (`full_prompts`).",
    "data.shuffle": "Shuffle the training prompts every epoch (a seeded, resumable sampler).",
    "data.seed": "Seed of the shuffling and of the `*_max_samples` selection; null means 1.",
    "data.dataloader_num_workers": "Worker processes of the training and validation dataloaders.",
    "data.image_patch_size": "Vision models: patch size used when counting image tokens.",
    "data.validation_shuffle": "Shuffle the validation set.",
    "data.filter_overlong_prompts": "Drop prompts longer than `data.max_prompt_length` when the dataset is built.",
    "data.filter_overlong_prompts_workers": "Processes used to filter overlong prompts.",
    "data.truncation": "What to do with a prompt longer than `max_prompt_length`: `error` (fail at start-up, "
    "naming the row), `left`, `right` or `middle`.",
    "data.image_key": "Column with the images of multimodal prompts.",
    "data.video_key": "Column with the videos of multimodal prompts.",
    "data.trust_remote_code": "Allow custom code when loading a processor for the data.",
    "data.custom_cls.path": "File defining a custom dataset class (a `torch.utils.data.Dataset`); null: `RLHFDataset`.",
    "data.custom_cls.name": "Name of that class in the file.",
    "data.return_multi_modal_inputs": "Vision models: return the processor's multimodal inputs with each item.",
    "data.sampler.class_path": "File defining a custom training sampler; null: random (with `data.shuffle`) or "
    "sequential. Needs `data.dataloader_num_workers=0`.",
    "data.sampler.class_name": "Name of the sampler class in that file.",
    "data.datagen.path": "File of a dynamic data generator (curriculum datasets).",
    "data.datagen.name": "Name of the generator class.",
    "data.apply_chat_template_kwargs": "Extra keyword arguments for `tokenizer.apply_chat_template` (e.g. "
    "`{enable_thinking: false}`).",
    # actor_rollout_ref (the group itself)
    "actor_rollout_ref.hybrid_engine": "Actor, rollout and reference share each worker process and time-share its "
    "memory (the hybrid engine, see hybrid_engine.md).",
    "actor_rollout_ref.nccl_timeout": "Timeout in seconds of the workers' collective operations.",
    # reward_model
    "reward_model.enable": "Score responses with a reward model (`RewardModelWorker`): its score at the last "
    "response token (`rm_scores`) is then the reward, and `compute_score` is not called.",
    "reward_model.enable_resource_pool": "Give the reward model its own resource pool.",
    "reward_model.n_gpus_per_node": "Devices per node of that pool.",
    "reward_model.nnodes": "Nodes of that pool.",
    "reward_model.strategy": "Training-engine strategy of the reward model (`fsdp`).",
    "reward_model.model.input_tokenizer": "Tokenizer of the policy, used to re-tokenize responses when the reward "
    "model's tokenizer differs.",
    "reward_model.model.path": "Reward-model folder (a sequence-classification head with one label).",
    "reward_model.model.external_lib": "Module to import before loading the reward model (registers custom models).",
    "reward_model.model.trust_remote_code": "Allow the reward model's custom code.",
    "reward_model.model.override_config": "Attributes set on the reward model's HF config before it is built.",
    "reward_model.model.use_shm": "Copy the reward model to shared memory before loading it.",
    "reward_model.model.use_remove_padding": "Forward packed sequences without pad tokens.",
    "reward_model.model.use_fused_kernels": "Use fused kernels in the reward model.",
    "reward_model.model.fsdp_config.param_offload": "Keep the reward model's parameter shards in host memory.",
    "reward_model.model.fsdp_config.reshard_after_forward": "Free each block's gathered parameters after its forward.",
    "reward_model.model.fsdp_config.fsdp_size": "Ranks one parameter is sharded over (-1: all).",
    "reward_model.model.fsdp_config.forward_prefetch": "Prefetch the next block's parameters during forward.",
    "reward_model.micro_batch_size": "Deprecated global micro-batch size of the reward model.",
    "reward_model.micro_batch_size_per_gpu": "Sequences per reward-model forward on each worker; null: the whole "
    "share at once.",
    "reward_model.max_length": "Longest sequence the reward model accepts.",
    "reward_model.use_dynamic_bsz": "Pack reward-model micro-batches by token count.",
    "reward_model.forward_max_token_len_per_gpu": "Token budget per reward-model micro-batch with dynamic batch sizes.",
    "reward_model.reward_manager": "veRL's older name of `reward_manager.name`, read when that one is unset.",
    "reward_model.use_reward_loop": "Compute rewards in veRL's asynchronous reward loop.",
    "reward_model.num_workers": "Processes that run `compute_score` (0: threads of the driver process).",
    "reward_model.reward_loop_source": "Where the reward loop class comes from (`register` or `importlib`).",
    "reward_model.reward_loop_module_path": "File of a custom reward loop.",
    "reward_model.reward_loop_class_name": "Class of that reward loop.",
    "reward_model.launch_reward_fn_async": "Compute the reward of step t while step t+1 generates.",
    "reward_model.timeout_s": "Per-sample limit in seconds on one `compute_score` call; a sample that raises or "
    "runs past it scores 0 and is counted in `reward/error_count` / `reward/timeout_count` (null or <= 0: no limit).",
    "reward_model.sandbox_fusion.url": "URL of a SandboxFusion code-execution service for code rewards.",
    "reward_model.sandbox_fusion.max_concurrent": "Concurrent requests to that service.",
    "reward_model.sandbox_fusion.memory_limit_mb": "Memory limit per sandboxed execution, in MB.",
    "reward_model.overlong_buffer.enable": "`dapo` manager: penalise responses that run into the last "
    "`overlong_buffer.len` tokens of `data.max_response_length` (DAPO's soft overlong punishment).",
    "reward_model.overlong_buffer.len": "Length of that buffer, in tokens.",
    "reward_model.overlong_buffer.penalty_factor": "Penalty at the very end of the buffer (linear inside it).",
    "reward_model.overlong_buffer.log": "Add `overlong_reward` and `overlong` to the reward's extra info.",
    "reward_model.profiler": "Profiler options of the reward-model worker.",
    # reward_manager
    "reward_manager.source": "`register`: `reward_manager.name` names a registered manager; `importlib`: load a "
    "class from `reward_manager.module.path`.",
    "reward_manager.name": "Registered reward manager: `naive` (one `compute_score` call per sample), `batch` (one "
    "call per batch) or `dapo` (naive plus the overlong penalty).",
    "reward_manager.module.path": "File of a custom reward-manager class (`source: importlib`).",
    "reward_manager.module.name": "Class name in that file.",
    # custom_reward_function
    "custom_reward_function.path": "File defining your reward function; null: the built-in rule chosen by "
    "`data_source` (`verl.utils.reward_score.default_compute_score`).",
    "custom_reward_function.name": "Name of the function: `compute_score(data_source, solution_str, ground_truth, "
    "extra_info=None, **kwargs)` returning a number or a dict with a `score`.",
    "custom_reward_function.reward_kwargs": "Extra keyword arguments passed to every call of the function.",
    # trainer
    "trainer.mode": "How generation and training are scheduled: `sync` (generate, then train, in the same "
    "processes), `colocate_async` or `separate_async` (see trainer_modes.md).",
    "trainer.device": "`auto`, `cpu` or `cuda`; `cuda` without a visible CUDA device is a validation error.",
    "trainer.balance_batch": "Reorder each batch so every data-parallel rank gets about the same number of tokens "
    "(`global_seqlen/*` metrics).",
    "trainer.total_epochs": "Passes over the training data.",
    "trainer.total_training_steps": "Stop after this many steps; null: `total_epochs` × batches per epoch. Also "
    "sets the length of the learning-rate schedules.",
    "trainer.profile_steps": "Steps to profile.",
    "trainer.project_name": "Project name for the trackers (and the `file` logger's folder).",
    "trainer.experiment_name": "Run name for the trackers (and the `file` logger's file name).",
    "trainer.logger": "Trackers the metrics go to: a name or a list of `console`, `file`, `tensorboard`, `wandb`, "
    "`mlflow` (see metrics.md).",
    "trainer.log_val_generations": "Validation samples (input, output, score) sent to the trackers at each "
    "validation; 0: none.",
    "trainer.rollout_data_dir": "Folder to which every training step's generations are dumped as `<step>.jsonl`; "
    "null: no dump.",
    "trainer.validation_data_dir": "Folder to which every validation's generations are dumped as `<step>.jsonl`; "
    "null: no dump.",
    "trainer.nnodes": "Nodes of the worker pool.",
    "trainer.n_gpus_per_node": "Worker processes per node: one per GPU, or, on a machine without GPUs, the number "
    "of CPU workers.",
    "trainer.save_freq": "Save a checkpoint every this many steps (and at the last one); -1 or 0: never.",
    "trainer.esi_redundant_time": "Seconds before an elastic instance expires at which to save a checkpoint.",
    "trainer.resume_mode": "`auto` (the step in `latest_checkpointed_iteration.txt`; none: from scratch), `disable` "
    "or `resume_path`: where a run starts (see checkpoints.md).",
    "trainer.resume_from_path": "The `global_step_<n>` folder to resume from (`resume_mode: resume_path`).",
    "trainer.val_before_train": "Validate once before the first step (logged at step 0).",
    "trainer.val_only": "Validate once and stop without training.",
    "trainer.test_freq": "Validate every this many steps (and at the last one); -1 or 0: never.",
    "trainer.critic_warmup": "Steps during which only the critic is updated (the actor update and the weight sync "
    "start at this step).",
    "trainer.default_hdfs_dir": "HDFS folder checkpoints are copied to.",
    "trainer.del_local_ckpt_after_load": "Delete the local checkpoint after loading it.",
    "trainer.default_local_dir": "Folder of the checkpoints: `<dir>/global_step_<n>/{actor,critic,data.pt,"
    "trainer_state.pt}` and the tracker file `latest_checkpointed_iteration.txt`.",
    "trainer.max_actor_ckpt_to_keep": "Keep at most this many actor checkpoints (null: all).",
    "trainer.max_critic_ckpt_to_keep": "Keep at most this many critic checkpoints (null: all).",
    "trainer.ray_wait_register_center_timeout": "Seconds to wait for the workers' register center to come up.",
    "trainer.use_legacy_worker_impl": "Choose between veRL's legacy and new worker implementations.",
    # global_profiler, transfer_queue, ray_kwargs
    "global_profiler.tool": "Profiler to use (e.g. `nsys`, `torch`); null: none.",
    "global_profiler.steps": "Steps to profile.",
    "global_profiler.profile_continuous_steps": "Merge consecutive profiled steps into one trace.",
    "global_profiler.save_path": "Where profiles are written.",
    "transfer_queue.enable": "Move batches between roles through veRL's TransferQueue instead of the driver.",
    "ray_kwargs.ray_init.num_cpus": "Logical CPUs `ray.init` starts with; null: enough for the workers the job "
    "places (when verl starts Ray itself).",
    "ray_kwargs.timeline_json_file": "Write a Ray timeline to this file.",
}

# Keys of ours that veRL does not have.
OURS: dict[str, str] = {
    "trainer.mode": "",
    "trainer.device": "",
    "reward_model.timeout_s": "",
    "actor_rollout_ref.rollout.seed": "every sample draws from its own generator seeded by (seed, step, prompt "
    "index, sample index), so the samples do not depend on how the batch is split over workers.",
}

# Where a key is in veRL but behaves differently here.
_SAVE_CONTENTS = (
    "only `hf_model` changes what is saved (the full weights in `huggingface/`): the sharded model, optimizer and "
    "extra state are always saved, as veRL's FSDP checkpoints do."
)
DIFFERENCES: dict[str, str] = {
    "actor_rollout_ref.actor.checkpoint.save_contents": _SAVE_CONTENTS,
    "critic.checkpoint.save_contents": _SAVE_CONTENTS,
    "trainer.default_hdfs_dir": "copying checkpoints to HDFS is not supported: a non-null value is an error.",
    "trainer.max_actor_ckpt_to_keep": "the step folder the tracker names is never removed.",
    "trainer.resume_mode": "also resumes the driver's random states, the KL coefficient and the epoch.",
    "trainer.device": "the workers use CUDA whenever the cluster has GPUs: `cpu` does not force CPU execution on a "
    "GPU machine in this version.",
    "trainer.n_gpus_per_node": "on a machine without GPUs it counts CPU worker processes.",
    "trainer.logger": "the default names `wandb`: on a machine without the `trackers` extra, pass "
    "`trainer.logger='[console]'`.",
    "actor_rollout_ref.rollout.name": "veRL requires it (usually `vllm`); here it defaults to `hf`, our torch engine, "
    "which runs everywhere. `sglang` is accepted but not part of this build.",
    "actor_rollout_ref.rollout.mode": "`sync` is accepted too; the in-process engines serve both.",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "the `hf` engine ignores it; the in-process `vllm` "
    "engine needs 1.",
    "actor_rollout_ref.actor.strategy": "`fsdp` and `fsdp2` both select the FSDP2 engine; `megatron` is not available.",
    "actor_rollout_ref.ref.strategy": "`fsdp` and `fsdp2` both select the FSDP2 engine.",
    "critic.strategy": "`fsdp` and `fsdp2` both select the FSDP2 engine; `megatron` is not available.",
    "actor_rollout_ref.actor.ppo_micro_batch_size": "setting it is an error here; use `ppo_micro_batch_size_per_gpu`.",
    "critic.ppo_micro_batch_size": "setting it is an error here; use `ppo_micro_batch_size_per_gpu`.",
    "actor_rollout_ref.ref.log_prob_micro_batch_size": "setting it is an error here; use "
    "`log_prob_micro_batch_size_per_gpu`.",
    "actor_rollout_ref.model.lora_rank": "a value > 0 is an error: LoRA training is not supported yet.",
    "actor_rollout_ref.actor.rollout_n": "set by the worker from `actor_rollout_ref.rollout.n`.",
    "critic.rollout_n": "set by the worker from `actor_rollout_ref.rollout.n`.",
    "actor_rollout_ref.actor.fsdp_config.param_offload": "a no-op on CPU (the shards already live in host memory).",
    "actor_rollout_ref.actor.fsdp_config.offload_policy": "an error on CPU: FSDP2's `CPUOffloadPolicy` needs an "
    "accelerator.",
    "actor_rollout_ref.actor.policy_loss.rollout_correction": "leave it null: with "
    "`algorithm.rollout_correction.bypass_mode=true` the trainer fills it (and sets `loss_mode=bypass_mode`).",
    "data.datagen.path": "a non-null value fails at start-up: dynamically generated datasets are not supported yet.",
}

# Accepted for compatibility with veRL command lines, but never read by this version (beyond validation). An entry
# is a key or a mapping (all keys under it). A test checks that each entry's last name appears nowhere in verl/
# outside the config modules (see `referenced`), so this list cannot silently go stale when a key gets used.
# Keys in validate.UNIMPLEMENTED keep that note instead.
NOT_READ: tuple[str, ...] = (
    "data.use_shm",
    "data.tool_config_path",
    "data.return_raw_input_ids",
    "data.image_patch_size",
    "data.validation_shuffle",
    "data.filter_overlong_prompts_workers",
    "data.image_key",
    "data.video_key",
    "data.return_multi_modal_inputs",
    "actor_rollout_ref.nccl_timeout",
    "actor_rollout_ref.model.hf_config_path",
    "actor_rollout_ref.model.use_shm",
    "actor_rollout_ref.model.external_lib",
    "actor_rollout_ref.model.lora_alpha",
    "actor_rollout_ref.model.target_modules",
    "actor_rollout_ref.model.exclude_modules",
    "actor_rollout_ref.model.lora_adapter_path",
    "actor_rollout_ref.model.fused_kernel_options",
    "actor_rollout_ref.model.tiled_mlp",
    "actor_rollout_ref.model.mtp",
    "actor_rollout_ref.actor.use_fused_kernels",
    "actor_rollout_ref.actor.use_prefix_grouper",
    "actor_rollout_ref.actor.freeze_vision_tower",
    "actor_rollout_ref.actor.checkpoint.load_contents",
    "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params",
    "actor_rollout_ref.actor.fsdp_config.use_orig_params",
    "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size",
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile",
    "actor_rollout_ref.actor.fsdp_config.entropy_checkpointing",
    "actor_rollout_ref.actor.router_replay",
    "actor_rollout_ref.actor.profiler",
    "actor_rollout_ref.ref.use_torch_compile",
    "actor_rollout_ref.ref.fsdp_config.wrap_policy.min_num_params",
    "actor_rollout_ref.ref.fsdp_config.use_orig_params",
    "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size",
    "actor_rollout_ref.ref.fsdp_config.use_torch_compile",
    "actor_rollout_ref.ref.fsdp_config.entropy_checkpointing",
    "actor_rollout_ref.ref.profiler",
    "actor_rollout_ref.rollout.cudagraph_capture_sizes",
    "actor_rollout_ref.rollout.expert_parallel_size",
    "actor_rollout_ref.rollout.pipeline_model_parallel_size",
    "actor_rollout_ref.rollout.enable_chunked_prefill",
    "actor_rollout_ref.rollout.scheduling_policy",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size",
    "actor_rollout_ref.rollout.disable_log_stats",
    "actor_rollout_ref.rollout.multi_stage_wake_up",
    "actor_rollout_ref.rollout.over_sample_rate",
    "actor_rollout_ref.rollout.skip_rollout",
    "actor_rollout_ref.rollout.skip_dump_dir",
    "actor_rollout_ref.rollout.enable_rollout_routing_replay",
    "actor_rollout_ref.rollout.quantization",
    "actor_rollout_ref.rollout.quantization_config_file",
    "actor_rollout_ref.rollout.layered_summon",
    "actor_rollout_ref.rollout.multi_turn",
    "actor_rollout_ref.rollout.agent",
    "actor_rollout_ref.rollout.trace",
    "actor_rollout_ref.rollout.prometheus",
    "actor_rollout_ref.rollout.profiler",
    "actor_rollout_ref.rollout.mtp",
    "critic.model.external_lib",
    "critic.model.enable_activation_offload",
    "critic.model.use_shm",
    "critic.model.fsdp_config.wrap_policy.min_num_params",
    "critic.model.fsdp_config.use_orig_params",
    "critic.model.fsdp_config.ulysses_sequence_parallel_size",
    "critic.model.fsdp_config.use_torch_compile",
    "critic.model.fsdp_config.entropy_checkpointing",
    "critic.model.lora_alpha",
    "critic.model.target_modules",
    "critic.forward_micro_batch_size",
    "critic.checkpoint.load_contents",
    "critic.checkpoint.async_save",
    "critic.profiler",
    "reward_model.enable_resource_pool",
    "reward_model.model.input_tokenizer",
    "reward_model.model.external_lib",
    "reward_model.model.use_shm",
    "reward_model.model.use_fused_kernels",
    "reward_model.max_length",
    "reward_model.use_reward_loop",
    "reward_model.reward_loop_source",
    "reward_model.reward_loop_module_path",
    "reward_model.reward_loop_class_name",
    "reward_model.sandbox_fusion",
    "reward_model.profiler",
    "trainer.profile_steps",
    "trainer.ray_wait_register_center_timeout",
    "trainer.use_legacy_worker_impl",
    "global_profiler",
    "ray_kwargs.timeline_json_file",
)

# Also never read, but their names are used elsewhere in verl for other things, so no test can check them by name:
# key or mapping → why (shown after the "not read" note; may be empty).
NOT_READ_SHARED_NAME: dict[str, str] = {
    "data.tokenizer": "the policy's tokenizer is used.",
    "data.trust_remote_code": "",
    "actor_rollout_ref.model.custom_chat_template": "the tokenizer's own chat template is used.",
    "actor_rollout_ref.actor.fsdp_config.entropy_from_logits_with_chunking": "",
    "actor_rollout_ref.ref.fsdp_config.entropy_from_logits_with_chunking": "",
    "critic.model.fsdp_config.entropy_from_logits_with_chunking": "",
    "critic.model.tokenizer_path": "",
    "actor_rollout_ref.rollout.calculate_log_probs": "both engines always return `rollout_log_probs`.",
    "reward_model.n_gpus_per_node": "the reward model runs in the global pool, one process per worker.",
    "reward_model.nnodes": "",
    "reward_model.strategy": "",
    "reward_model.micro_batch_size": "",
    "reward_model.use_dynamic_bsz": "",
    "reward_model.forward_max_token_len_per_gpu": "",
    "reward_model.model.override_config": "",
    "reward_model.model.use_remove_padding": "",
}

LEGEND = """\
# Config reference

Every key of the PPO/GRPO trainer config (`verl/trainer/config/ppo_trainer.yaml`), its default, what it does, and
where it differs from veRL. This page is generated by `scripts/generate_config_reference.py` from the YAML (keys
and defaults) and from the config dataclasses' docstrings (descriptions of the `actor_rollout_ref.*`, `critic` and
`algorithm` sections) plus a table in the script for the other sections; a test fails when it is out of date or
a key has no description. Do not edit it by hand.

Override any key on the command line, veRL style: `python -m verl.trainer.main_ppo algorithm.adv_estimator=grpo
actor_rollout_ref.rollout.n=8`. The whole config is validated before Ray starts (unknown keys, types, batch-size
arithmetic, the dataclasses' own checks) and every problem is reported at once.

A default written `${other.key}` follows that key unless you set it; `${oc.select:key,default}` follows `key` when
it exists. In the **vs veRL** column:

- **ours**: the key does not exist in veRL;
- **not implemented**: accepted so veRL command lines keep working, but the feature is missing; a non-default value
  is an error (`error`) or logs a warning that it has no effect (`warning`) — this list comes from
  `verl/trainer/config/validate.py`;
- **not read**: accepted (and type-checked) for compatibility, but nothing in this version acts on it, so any value
  has no effect;
- other notes say how the key behaves differently here. An empty cell means: as in veRL.
"""


# ---------------------------------------------------------------------------------------------------------- YAML
def leaves(node: DictConfig, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, raw value)`` for every leaf of ``node``, in file order; interpolations are not resolved.

    A leaf is a scalar, a list, or an empty mapping (an open one such as ``engine_kwargs: {}``)."""
    for key in node:
        path = f"{prefix}.{key}" if prefix else str(key)
        child = node._get_node(key)
        if isinstance(child, DictConfig) and len(child) > 0:
            yield from leaves(child, path)
        elif isinstance(child, DictConfig | ListConfig):
            yield path, child
        else:
            yield path, child._value()


def yaml_leaves() -> list[tuple[str, Any]]:
    """The leaves of the trainer YAML."""
    return list(leaves(OmegaConf.load(YAML_PATH)))


def render_default(value: Any) -> str:
    """A YAML-like rendering of a default (interpolations shown as written)."""
    if isinstance(value, DictConfig | ListConfig):
        value = OmegaConf.to_container(value, resolve=False)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(render_default(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {render_default(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        return value if value else '""'
    return repr(value)


# ---------------------------------------------------------------------------------------------------------- docs
_ENTRY = re.compile(r"^(?P<indent>\s*)(?P<names>[A-Za-z_][\w.]*(?:\s*/\s*[A-Za-z_][\w.]*)*):\s+(?P<text>.*)$")


def parse_args_section(doc: str | None) -> dict[str, str]:
    """``{field: description}`` from the ``Args:`` section of a Google-style docstring.

    An entry is ``name: text`` (or ``a / b: text`` for several names) one indentation level below ``Args:``; deeper
    indented lines continue it. The section ends at the first non-empty line indented no deeper than ``Args:``.
    """
    if not doc:
        return {}
    lines = inspect.cleandoc(doc).splitlines()
    out: dict[str, str] = {}
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Args:")
    except StopIteration:
        return out
    base = len(lines[start]) - len(lines[start].lstrip())
    entry_indent: int | None = None
    current: list[str] = []
    names: list[str] = []

    def flush() -> None:
        for name in names:
            out[name] = " ".join(current)

    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent <= base:
            break
        match = _ENTRY.match(line)
        if match and (entry_indent is None or indent == entry_indent):
            flush()
            entry_indent = indent
            names = [n.strip() for n in match["names"].split("/")]
            current = [match["text"].strip()]
        elif names:
            current.append(line.strip())
    flush()
    return out


def class_docs(cls: type) -> dict[str, str]:
    """The ``Args:`` entries of ``cls`` and of its dataclass bases (the subclass wins)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            out.update(parse_args_section(klass.__dict__.get("__doc__")))
    return out


def dataclass_descriptions() -> dict[str, str]:
    """Descriptions of the dataclass-backed keys, by dotted key, from the docstrings (nested dataclasses followed)."""
    out: dict[str, str] = {}

    def walk(cls: type, instance: Any, prefix: str) -> None:
        docs = class_docs(cls)
        for name, text in docs.items():
            out[f"{prefix}.{name}"] = text
        for f in dataclasses.fields(cls):
            value = getattr(instance, f.name, None)
            if dataclasses.is_dataclass(value):
                walk(type(value), value, f"{prefix}.{f.name}")

    for prefix, cls in DATACLASS_ROOTS.items():
        walk(cls, cls(), prefix)
    return out


def capitalize(text: str) -> str:
    """Upper-case the first letter when the first word is plain lower case (not "veRL", "vLLM" or "`x`")."""
    first_word = text.split(" ", 1)[0] if text else ""
    if first_word.isascii() and first_word.islower() and first_word[0].isalpha():
        return text[0].upper() + text[1:]
    return text


def clean(text: str) -> str:
    """A docstring fragment as one sentence-cased line of markdown table text."""
    text = re.sub(r":\w+:`([^`]+)`", r"`\1`", text)  # :func:`x` → `x`
    text = text.replace("``", "`")
    text = re.sub(r"\s+", " ", text).strip()
    text = capitalize(text)
    if text and text[-1] not in ".)":
        text += "."
    return text.replace("|", "\\|")


def under_dataclass(key: str) -> bool:
    return any(key == root or key.startswith(root + ".") for root in DATACLASS_ROOTS)


# ---------------------------------------------------------------------------------------------------------- notes
def unimplemented_notes() -> dict[str, str]:
    """Notes for the keys of ``validate.UNIMPLEMENTED``."""
    notes = {}
    leaves = {key for key, _ in yaml_leaves()}
    for key, default, consequence, why in validate.UNIMPLEMENTED:
        kind = "error" if consequence == "error" else "warning"
        # a key inside a mapping that defaults to null (e.g. algorithm.filter_groups.enable) goes on that mapping
        target, sub = key, ""
        parent = key.rsplit(".", 1)[0]
        if key not in leaves and parent in leaves:
            target, sub = parent, f"`{key.rsplit('.', 1)[1]}` "
        notes[target] = (
            f"**not implemented** ({kind}): {why}; {sub}a value other than `{render_default(default)}` is "
            + ("an error." if kind == "error" else "accepted with a warning that it has no effect.")
        )
    modes = [m for m in validate.TRAINER_MODES if m not in validate.IMPLEMENTED_MODES]
    if modes:
        names = ", ".join(f"`{m}`" for m in modes)
        implemented = ", ".join(f"`{m}`" for m in validate.IMPLEMENTED_MODES)
        notes["trainer.mode"] = f"{names}: **not implemented** (error); only {implemented} runs."
    return notes


def vs_verl(key: str, unimplemented: dict[str, str]) -> str:
    parts = []
    if key in OURS:
        parts.append(f"**ours**: {OURS[key]}" if OURS[key] else "**ours**.")
    if key in unimplemented:
        parts.append(unimplemented[key])
    if key not in unimplemented:
        shared = covering(key, NOT_READ_SHARED_NAME)
        if covering(key, dict.fromkeys(NOT_READ)) is not None or shared is not None:
            why = NOT_READ_SHARED_NAME[shared] if shared is not None else ""
            why = capitalize(why)
            parts.append(("**not read**: accepted for compatibility, no effect in this version. " + why).strip())
    if key in DIFFERENCES:
        parts.append(capitalize(DIFFERENCES[key]))
    return clean(" ".join(parts))


def covering(key: str, table: dict[str, Any]) -> str | None:
    """The entry of ``table`` that is ``key`` or a mapping above it, if any."""
    parts = key.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in table:
            return prefix
    return None


CONFIG_MODULES = ("verl/workers/config/", "verl/trainer/config/")


def code_outside_config() -> str:
    """The text of every Python file under verl/ except the config modules (which declare and validate keys)."""
    files = sorted((ROOT / "verl").rglob("*.py"))
    return "\n".join(
        p.read_text(encoding="utf-8") for p in files if not p.relative_to(ROOT).as_posix().startswith(CONFIG_MODULES)
    )


def referenced(name: str, code: str) -> bool:
    """Whether ``name`` appears in ``code`` as a string or an attribute (``"name"``, ``'name'``, ``.name``)."""
    return re.search(r"[\"'.]" + re.escape(name) + r"\b", code) is not None


# ---------------------------------------------------------------------------------------------------------- page
def section_of(key: str) -> str:
    parts = key.split(".")
    if parts[0] in SPLIT_SECTIONS and len(parts) > 2:
        return ".".join(parts[:2])
    return parts[0]


def render() -> str:
    """The whole page; raises ``SystemExit`` listing every key without a description and every stale table entry."""
    items = yaml_leaves()
    keys = [key for key, _ in items]
    from_classes = dataclass_descriptions()
    unimplemented = unimplemented_notes()
    problems = []
    for key in keys:
        if under_dataclass(key):
            if key not in from_classes:
                problems.append(f"{key}: no description (add it to the `Args:` section of its config dataclass)")
        elif key not in DESCRIPTIONS:
            problems.append(f"{key}: no description (add it to DESCRIPTIONS in {Path(__file__).name})")
    key_set = set(keys)
    for name, table in (
        ("DESCRIPTIONS", DESCRIPTIONS),
        ("OURS", OURS),
        ("DIFFERENCES", DIFFERENCES),
        ("NOT_READ", dict.fromkeys(NOT_READ)),
        ("NOT_READ_SHARED_NAME", NOT_READ_SHARED_NAME),
        ("validate.UNIMPLEMENTED", unimplemented),
    ):
        problems += [
            f"{name} names {entry!r}, which is neither a key of the YAML nor a mapping of keys"
            for entry in table
            if entry not in key_set
            and not any(k.startswith(entry + ".") for k in key_set)
            and entry.rsplit(".", 1)[0] not in key_set  # a key inside a mapping that defaults to null
        ]
    problems += [f"DESCRIPTIONS has {k!r}, described by a config dataclass" for k in DESCRIPTIONS if under_dataclass(k)]
    if problems:
        raise SystemExit("config reference: " + str(len(problems)) + " problem(s):\n  " + "\n  ".join(problems))

    sections: dict[str, list[str]] = {}
    for key, value in items:
        text = from_classes[key] if under_dataclass(key) else DESCRIPTIONS[key]
        default = render_default(value).replace("|", "\\|")
        row = f"| `{key}` | `{default}` | {clean(text)} | {vs_verl(key, unimplemented)} |"
        sections.setdefault(section_of(key), []).append(row)

    out = [LEGEND, "## Sections\n"]
    for name, rows in sections.items():
        out.append(f"- [`{name}`](#{slug(name)}) ({len(rows)} key{'s' if len(rows) > 1 else ''})")
    for name, rows in sections.items():
        out.append(f"\n## {name}\n")
        out.append("| key | default | what it does | vs veRL |")
        out.append("|---|---|---|---|")
        out.extend(rows)
    return "\n".join(out) + "\n"


def slug(heading: str) -> str:
    """GitHub's anchor of a heading (lower case, punctuation other than ``-`` and ``_`` dropped, spaces → ``-``)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def is_current() -> bool:
    """True when ``docs/config_reference.md`` equals the generated text."""
    return DOC_PATH.exists() and DOC_PATH.read_text(encoding="utf-8") == render()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/config_reference.md is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not DOC_PATH.exists() or DOC_PATH.read_text(encoding="utf-8") != text:
            print(f"{DOC_PATH.relative_to(ROOT)} is out of date: run python scripts/{Path(__file__).name}")
            return 1
        return 0
    DOC_PATH.write_text(text, encoding="utf-8")
    print(f"wrote {DOC_PATH.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
