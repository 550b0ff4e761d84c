"""The hand-written sections of the trainer config (no config dataclass backs them), for
``scripts/generate_trainer_config.py``: keys and defaults as veRL's, plus ours (see the header it writes)."""

from __future__ import annotations

from typing import Any

# veRL's Nsight Systems options (global_profiler.global_tool_config.nsys.*_nsight_options).
NSIGHT_OPTIONS = {"trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true", "cuda-graph-trace": "graph"}


def data() -> dict[str, Any]:
    """``data`` (veRL's ``data/legacy_data.yaml``)."""
    return {
        "tokenizer": None,
        "use_shm": False,
        "train_files": "~/data/rlhf/gsm8k/train.parquet",
        "val_files": "~/data/rlhf/gsm8k/test.parquet",
        "train_max_samples": -1,
        "val_max_samples": -1,
        "prompt_key": "prompt",
        "reward_fn_key": "data_source",
        "max_prompt_length": 512,
        "max_response_length": 512,
        "train_batch_size": 1024,
        "gen_batch_size": "${data.train_batch_size}",
        "val_batch_size": None,
        "tool_config_path": "${oc.select:actor_rollout_ref.rollout.multi_turn.tool_config_path,null}",
        "return_raw_input_ids": False,
        "return_raw_chat": True,
        "return_full_prompt": False,
        "shuffle": True,
        "seed": None,
        "dataloader_num_workers": 8,
        "image_patch_size": 14,
        "validation_shuffle": False,
        "filter_overlong_prompts": False,
        "filter_malformed_rows": False,
        "filter_overlong_prompts_workers": 1,
        "truncation": "error",
        "image_key": "images",
        "video_key": "videos",
        "trust_remote_code": False,
        "custom_cls": {"path": None, "name": None},
        "return_multi_modal_inputs": True,
        "sampler": {"class_path": None, "class_name": None},
        "datagen": {"path": None, "name": None},
        "apply_chat_template_kwargs": {},
        "function_tool_path": "${oc.select:actor_rollout_ref.rollout.multi_turn.function_tool_path,null}",
    }


def rollout_pool() -> dict[str, Any]:
    """Top-level ``rollout``: the pool of the rollout servers in ``trainer.mode=separate_async`` (veRL's fully-async
    and one-step-off-policy keys)."""
    return {"nnodes": 1, "n_gpus_per_node": 1, "custom_resources": None}


def reward_model() -> dict[str, Any]:
    """``reward_model`` (its strategy and ``model.fsdp_config`` go to ``reward_model/dp_reward_model.yaml``)."""
    return {
        "enable": False,
        "enable_resource_pool": False,
        "n_gpus_per_node": 0,
        "nnodes": 0,
        "strategy": "fsdp",
        "model": {
            "input_tokenizer": "${actor_rollout_ref.model.path}",
            "path": "~/models/FsfairX-LLaMA3-RM-v0.1",
            "external_lib": "${actor_rollout_ref.model.external_lib}",
            "trust_remote_code": False,
            "override_config": {},
            "use_shm": False,
            "use_remove_padding": False,
            "use_fused_kernels": "${actor_rollout_ref.model.use_fused_kernels}",
            "fsdp_config": {
                "param_offload": False,
                "reshard_after_forward": True,
                "fsdp_size": -1,
                "forward_prefetch": False,
            },
        },
        "micro_batch_size": None,
        "micro_batch_size_per_gpu": None,
        "max_length": None,
        "use_dynamic_bsz": "${critic.use_dynamic_bsz}",
        "forward_max_token_len_per_gpu": "${critic.forward_max_token_len_per_gpu}",
        "reward_manager": "naive",
        "use_reward_loop": True,
        "num_workers": 1,
        "reward_loop_source": "register",
        "reward_loop_module_path": None,
        "reward_loop_class_name": None,
        "ulysses_sequence_parallel_size": 1,
        "launch_reward_fn_async": False,
        "timeout_s": 30,
        "sandbox_fusion": {"url": None, "max_concurrent": 64, "memory_limit_mb": 1024},
        "overlong_buffer": {"enable": False, "len": 0, "penalty_factor": 0.0, "log": False},
        "reward_kwargs": {},
        "profiler": {},
    }


def reward_manager() -> dict[str, Any]:
    """``reward_manager``."""
    return {
        "source": "register",
        "name": "${oc.select:reward_model.reward_manager,naive}",
        "module": {"path": None, "name": "custom_reward_manager"},
    }


def custom_reward_function() -> dict[str, Any]:
    """``custom_reward_function``."""
    return {"path": None, "name": "compute_score", "reward_kwargs": {}}


def trainer() -> dict[str, Any]:
    """``trainer``."""
    return {
        "use_v1": True,
        "v1": trainer_v1(),
        "mode": "sync",
        "device": "auto",
        "balance_batch": True,
        "total_epochs": 30,
        "total_training_steps": None,
        "profile_steps": None,
        "project_name": "verl_examples",
        "experiment_name": "gsm8k",
        "logger": ["console", "wandb"],
        "log_val_generations": 0,
        "rollout_data_dir": None,
        "validation_data_dir": None,
        "nnodes": 1,
        "n_gpus_per_node": 8,
        "custom_resources": None,
        "save_freq": -1,
        "esi_redundant_time": 0,
        "resume_mode": "auto",
        "resume_from_path": None,
        "val_before_train": True,
        "val_only": False,
        "test_freq": -1,
        "critic_warmup": 0,
        "default_hdfs_dir": None,
        "del_local_ckpt_after_load": False,
        "default_local_dir": "checkpoints/${trainer.project_name}/${trainer.experiment_name}",
        "max_actor_ckpt_to_keep": None,
        "max_critic_ckpt_to_keep": None,
        "ray_wait_register_center_timeout": 300,
        "use_legacy_worker_impl": "auto",
    }


def global_profiler() -> dict[str, Any]:
    """``global_profiler``."""
    return {
        "tool": None,
        "steps": None,
        "profile_continuous_steps": False,
        "save_path": "outputs/profile",
        "global_tool_config": {
            "nsys": {
                "discrete": False,
                "controller_nsight_options": dict(NSIGHT_OPTIONS),
                "worker_nsight_options": {
                    **NSIGHT_OPTIONS,
                    "capture-range": "cudaProfilerApi",
                    "capture-range-end": None,
                    "kill": "none",
                },
            },
            "torch_memory": {
                "trace_alloc_max_entries": 100000,
                "stack_depth": 32,
                "context": "all",
                "stacks": "all",
                "kw_args": {},
            },
        },
    }


def transfer_queue() -> dict[str, Any]:
    """``transfer_queue``: veRL's data plane (there is none here: batches move as DataProto)."""
    return {
        "enable": False,
        "metrics": {"enabled": False, "port": 0},
        "backend": {
            "storage_backend": "SimpleStorage",
            "SimpleStorage": {"total_storage_size": 100000, "num_data_storage_units": 8},
        },
    }


def ray_kwargs() -> dict[str, Any]:
    """``ray_kwargs``."""
    return {
        "ray_init": {"num_cpus": None, "address": None, "runtime_env": {"py_executable": None}},
        "timeline_json_file": None,
    }


def trainer_v1() -> dict[str, Any]:
    """``trainer.v1``: veRL 0.10's trainer settings (the mode; the replay buffer's and the async modes' knobs)."""
    warmup = {"num_warmup_batches": 1}
    return {
        "trainer_mode": "sync",
        "sync": {},
        "colocate_async": dict(warmup),
        "separate_async": {
            **warmup,
            "parameter_sync_step": 4,
            "hybrid_rollout": {
                "enable_switch": False,
                "switch_threshold_ratio": 0.4,
                "adaptive_switch_threshold": True,
                "switch_threshold_step_up": 0.05,
                "switch_threshold_step_down": 0.03,
                "switch_threshold_release_steps": 2,
                "switch_cost_window_size": 3,
            },
        },
        "sampler": {
            "schedule": "fixed_lag",  # ours: how the async modes pick what to train (veRL's replay buffer: not wired)
            "max_off_policy_threshold": 8,
            "max_off_policy_strategy": "drop",
            "sync_refill_failed_groups": False,
            "custom_sampler": {"path": None, "name": None},
            "sampler_kwargs": {},
        },
    }


def reward_model_rollout() -> dict[str, Any]:
    """``reward.reward_model.rollout``: the served reward model's engine (veRL 0.10's defaults; engine ``hf``)."""
    return {
        "name": "hf",
        "dtype": "bfloat16",
        "gpu_memory_utilization": 0.5,
        "enforce_eager": True,
        "free_cache_engine": True,
        "tensor_model_parallel_size": 2,
        "max_num_batched_tokens": 8192,
        "max_model_len": None,
        "max_num_seqs": 1024,
        "load_format": "auto",
        "seed": 42,
        "engine_kwargs": {},
        "enable_chunked_prefill": True,
        "enable_prefix_caching": True,
        "prompt_length": 2048,
        "response_length": 2048,
    }


def reward() -> dict[str, Any]:
    """``reward``: veRL 0.10's reward settings (the older ``reward_model.*`` / ``reward_manager.*`` /
    ``custom_reward_function.*`` names are read into it: `verl.trainer.config.layout`)."""
    return {
        "num_workers": 1,
        "timeout_s": 30,
        "custom_reward_function": {"path": None, "name": "compute_score", "reward_kwargs": {}},
        "reward_manager": {
            "source": "register",
            "name": "naive",
            "module": {"path": None, "name": "custom_reward_manager"},
        },
        "reward_model": {
            "enable": False,
            "enable_resource_pool": False,
            "n_gpus_per_node": 8,
            "nnodes": 0,
            "model_path": None,
            "rollout": reward_model_rollout(),
        },
        "sandbox_fusion": {"url": None, "max_concurrent": 64, "memory_limit_mb": 1024},
        "reward_kwargs": {},
    }


def skip() -> dict[str, Any]:
    """``skip``: veRL 0.10's rollout caching (``skip.rollout`` is the older ``rollout.skip_rollout``)."""
    one = {"enable": False, "dump_dir": "~/.verl/rollout_dump", "steps": [], "action": "cache"}
    return {name: dict(one, steps=[]) for name in ("rollout", "rollout_tq", "async_rollout")}


def distillation() -> dict[str, Any]:
    """``distillation``: veRL 0.10's on-policy distillation (refused when enabled: not built yet)."""
    return {
        "enabled": False,
        "n_gpus_per_node": 8,
        "nnodes": 0,
        "teacher_key": "data_source",
        "teacher_models": {
            "teacher_model": {"key": None, "model_path": None, "num_replicas": 0, "inference": {}},
        },
        "distillation_loss": {
            "loss_mode": "k3",
            "topk": 32,
            "use_task_rewards": True,
            "distillation_loss_coef": 1.0,
            "loss_max_clamp": None,
            "log_prob_min_clamp": None,
            "use_policy_gradient": False,
            "policy_loss_mode": "vanilla",
            "clip_ratio": 0.2,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.2,
        },
    }
