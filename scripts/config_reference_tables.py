"""The hand-written tables of the config reference (``scripts/generate_config_reference.py``): descriptions of the
keys that no config dataclass documents, and the notes on where verl differs from veRL."""

from __future__ import annotations

from verl.trainer.config.validate_reward import VLLM_ONLY

_G = "global_profiler.global_tool_config"

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
    "data.tool_config_path": "Tool YAML whose schemas the chat template shows in the prompts (follows "
    "`actor_rollout_ref.rollout.multi_turn.tool_config_path`).",
    "data.return_raw_input_ids": "Also return the prompt's ids before chat templating.",
    "data.return_raw_chat": "Keep the prompt's messages in each item (`raw_prompt`).",
    "data.return_full_prompt": "Keep the chat-templated prompt text in each item (`full_prompts`).",
    "data.shuffle": "Shuffle the training prompts every epoch (a seeded, resumable sampler).",
    "data.seed": "Seed of the shuffling and of the `*_max_samples` selection; null means 1.",
    "data.dataloader_num_workers": (
        "Worker processes of the training and validation dataloaders; at most a quarter of the machine's cores "
        "are started (a cut is logged)."
    ),
    "data.image_patch_size": "Vision models: patch size used when counting image tokens.",
    "data.validation_shuffle": "Shuffle the validation set.",
    "data.filter_overlong_prompts": "Drop prompts longer than `data.max_prompt_length` when the dataset is built.",
    "data.filter_malformed_rows": "Drop rows that do not fit the schema (logging how many per file) instead of "
    "failing at start-up with the file, row and field of each problem.",
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
    "memory (the hybrid engine, see hybrid_engine.md). `false` (veRL's separate-pool scripts) is accepted with "
    "`trainer.mode=separate_async` only, whose rollout servers are on a pool of their own either way.",
    "actor_rollout_ref.nccl_timeout": "Timeout in seconds of the workers' collective operations.",
    # reward_model
    "reward_model.enable": "Score responses with a reward model (`RewardModelWorker`): its score at the last "
    "response token (`rm_scores`) is then the reward, and `compute_score` is not called.",
    "reward_model.enable_resource_pool": "Give the reward model its own resource pool.",
    "reward_model.n_gpus_per_node": "Devices per node of that pool.",
    "reward_model.nnodes": "Nodes of that pool.",
    # the rollout pool (top level)
    "rollout.nnodes": "`trainer.mode=separate_async`: nodes of the rollout servers' own pool (`rollout_pool`); no "
    "effect in the other modes (a value other than 1 warns).",
    "rollout.n_gpus_per_node": "`trainer.mode=separate_async`: rollout servers per node of that pool (one per GPU; "
    "CPU processes without GPUs); no effect in the other modes (a value other than 1 warns).",
    "rollout.custom_resources": "`trainer.mode=separate_async`: Ray custom resources each bundle of the rollout "
    "pool asks for (e.g. `{rollout_pool: 1}`): the servers go to nodes started with them (`ray start "
    "--resources='{\"rollout_pool\": 8}'`). null: wherever Ray places them.",
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
    "reward_model.ulysses_sequence_parallel_size": "Ulysses sequence-parallel degree of the reward model (1: off).",
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
    "reward_model.reward_kwargs": "Keyword arguments for the reward manager's constructor (those it declares, e.g. "
    "the `dapo` manager's `max_resp_len`) or, for the built-in managers, for every `compute_score` call; a key "
    "neither declares is an error at start-up.",
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
    "custom_reward_function.reward_kwargs": "Extra keyword arguments passed to every call of the function; a key "
    "the function does not declare is an error at start-up.",
    # trainer
    "trainer.mode": "How generation and training are scheduled: `sync` (generate, then train, in the same "
    "processes), `colocate_async` or `separate_async` (see trainer_modes.md).",
    "trainer.device": "`auto`, `cpu` or `cuda`; `cuda` without a visible CUDA device is a validation error.",
    "trainer.balance_batch": "Reorder each batch so every data-parallel rank gets about the same number of tokens "
    "(`global_seqlen/*` metrics).",
    "trainer.total_epochs": "Passes over the training data.",
    "trainer.total_training_steps": "Stop after this many steps; null: `total_epochs` × batches per epoch. Also "
    "sets the length of the learning-rate schedules.",
    "trainer.profile_steps": "veRL's older name of `global_profiler.steps`.",
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
    "trainer.custom_resources": "Ray custom resources each bundle of the training pool (`global_pool`) asks "
    "for (e.g. `{train_pool: 1}`): its workers go to nodes started with them. null: wherever Ray places them.",
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
    "global_profiler.tool": "`torch`: run `torch.profiler` in every worker over the steps in "
    "`global_profiler.steps`; null: no profiling. Other tools (`nsys`, `npu`, `torch_memory`) are a validation error.",
    "global_profiler.steps": "Steps to profile (a list of step numbers); null: none.",
    "global_profiler.profile_continuous_steps": "Merge consecutive profiled steps into one trace.",
    "global_profiler.save_path": "Folder the traces are written to (one per role, rank and step).",
    f"{_G}.nsys.discrete": "Nsight Systems: one report per profiled step and role instead of one for the whole run.",
    **{
        f"{_G}.nsys.{side}_nsight_options.{opt}": f"Nsight Systems `--{opt}` option of the {side} process."
        for side in ("controller", "worker")
        for opt in ("trace", "cuda-memory-usage", "cuda-graph-trace")
    },
    f"{_G}.nsys.worker_nsight_options.capture-range": "Nsight Systems `--capture-range` of the workers "
    "(`cudaProfilerApi`: only between the profiler's start and stop calls).",
    f"{_G}.nsys.worker_nsight_options.capture-range-end": "Nsight Systems `--capture-range-end` of the workers "
    "(null: the tool's default).",
    f"{_G}.nsys.worker_nsight_options.kill": "Nsight Systems `--kill`: the signal sent to the workers when the "
    "capture ends.",
    f"{_G}.torch_memory.trace_alloc_max_entries": "CUDA memory snapshots: allocation events recorded at most.",
    f"{_G}.torch_memory.stack_depth": "CUDA memory snapshots: stack frames recorded per event.",
    f"{_G}.torch_memory.context": "CUDA memory snapshots: which events get a stack (`all`, `alloc`, `state`).",
    f"{_G}.torch_memory.stacks": "CUDA memory snapshots: `python` or `all` (Python and C++) stacks.",
    f"{_G}.torch_memory.kw_args": "Extra arguments of `torch.cuda.memory._record_memory_history`.",
    "transfer_queue.enable": "Move batches between roles through veRL's TransferQueue instead of the driver.",
    "ray_kwargs.ray_init.num_cpus": "Logical CPUs `ray.init` starts with; null: enough for the workers the job "
    "places (when verl starts Ray itself).",
    "ray_kwargs.ray_init.address": "The Ray cluster to join (`ray start --head` printed it; `auto`: the one on this "
    "machine); null: the `RAY_ADDRESS` environment variable, else a cluster of its own on this machine. When joining, "
    "`num_cpus` is the cluster's.",
    "ray_kwargs.timeline_json_file": "Write a Ray timeline to this file.",
}

# Keys of ours that veRL does not have.
OURS: dict[str, str] = {
    "trainer.mode": "",
    "async_training.max_lag": "veRL bounds staleness by samples (`staleness_threshold`); ours counts weight versions.",
    "async_training.default_rollout_is": "veRL leaves the correction to `algorithm.rollout_correction`; ours turns "
    "token-level truncated IS on in an async mode at lag > 0 when that section asks for none.",
    "trainer.device": "",
    "trainer.custom_resources": "",
    "ray_kwargs.ray_init.address": "",
    "rollout.custom_resources": "",
    "reward_model.timeout_s": "",
    "data.filter_malformed_rows": "",
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
    "trainer.device": "`cpu` places the workers on CPU-only bundles with `CUDA_VISIBLE_DEVICES` empty, so they "
    "run on CPU with gloo even on a GPU cluster (not yet run on one); `auto` uses the GPUs when the cluster has them.",
    "trainer.n_gpus_per_node": "on a machine without GPUs it counts CPU worker processes.",
    "trainer.logger": "the default names `wandb`: on a machine without the `trackers` extra, pass "
    "`trainer.logger='[console]'`.",
    "actor_rollout_ref.rollout.name": "veRL requires it (usually `vllm`); here it defaults to `hf`, our torch engine, "
    "which runs everywhere. `sglang` runs on CUDA (`.[sglang]`) and on CPU with the setup of docs/sglang.md.",
    "actor_rollout_ref.rollout.mode": "`sync` is accepted too; both take the same generation path (the in-process "
    "engines). Any other value is a validation error.",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "the in-process `vllm` engine needs 1: another value with "
    "`rollout.name=vllm` is a validation error; the `hf` engine ignores it (a value other than 1 warns).",
    "actor_rollout_ref.model.external_lib": "with the environment checked (the default at start-up), a module that "
    "cannot be found is a validation error.",
    "actor_rollout_ref.model.path": "with the environment checked, a local-looking path (absolute, `~`, `./`, `../`) "
    "that is not a folder is a validation error; a hub id such as `Qwen/Qwen2.5-0.5B` is left to the loader.",
    "reward_model.model.input_tokenizer": "veRL re-applies the reward model's chat template when it is set (its "
    "default); here the reward model scores the policy's token ids as they are.",
    "actor_rollout_ref.actor.strategy": "`fsdp` and `fsdp2` both select the FSDP2 engine; `megatron` comes with "
    "`model_engine=megatron` ([megatron.md](megatron.md)).",
    "actor_rollout_ref.ref.strategy": "`fsdp` and `fsdp2` both select the FSDP2 engine.",
    "critic.strategy": "`fsdp` and `fsdp2` both select the FSDP2 engine; `megatron` comes with "
    "`model_engine=megatron` ([megatron.md](megatron.md)).",
    "actor_rollout_ref.actor.ppo_micro_batch_size": "setting it is an error here; use `ppo_micro_batch_size_per_gpu`.",
    "critic.ppo_micro_batch_size": "setting it is an error here; use `ppo_micro_batch_size_per_gpu`.",
    "critic.forward_micro_batch_size": "setting it is an error here; use `forward_micro_batch_size_per_gpu`.",
    "actor_rollout_ref.ref.log_prob_micro_batch_size": "setting it is an error here; use "
    "`log_prob_micro_batch_size_per_gpu`.",
    "actor_rollout_ref.model.lora_rank": "vLLM rounds its `max_lora_rank` up to one of its ranks (1, 8, 16, 32, ...); "
    "the reference policy is the actor with its adapters disabled ([LoRA](lora.md)).",
    "actor_rollout_ref.actor.rollout_n": "set by the worker from `actor_rollout_ref.rollout.n`.",
    "critic.rollout_n": "set by the worker from `actor_rollout_ref.rollout.n`.",
    "actor_rollout_ref.actor.fsdp_config.param_offload": "a no-op on CPU (the shards already live in host memory).",
    "actor_rollout_ref.actor.fsdp_config.offload_policy": "an error on CPU: FSDP2's `CPUOffloadPolicy` needs an "
    "accelerator.",
    "actor_rollout_ref.actor.policy_loss.rollout_correction": "leave it null: with "
    "`algorithm.rollout_correction.bypass_mode=true` the trainer fills it (and sets `loss_mode=bypass_mode`).",
    "data.datagen.path": "a non-null value fails at start-up: dynamically generated datasets are not supported yet.",
    "async_training.staleness_threshold": "veRL's default is 0.1; ours is null (the bound is `max_lag`); a value above "
    "`max_lag` is an error; with `trainer.mode=sync` or `colocate_async` a value warns (no effect).",
    "async_training.trigger_parameter_sync_step": "veRL's default is 4; ours is 1 (a push after every update); "
    "`trainer.mode=sync` and `colocate_async` refuse any other value.",
    "async_training.require_batches": "veRL's default is 1 (the trainer batch in mini-batches); ours is null: the "
    "trainer takes `data.train_batch_size` prompts, and a value that disagrees with it is an error.",
    "async_training.partial_rollout": "veRL's default is true; ours is false. The requests are aborted and resumed "
    "inside the rollout server (no partial output goes back to the agent loop); refused outside `separate_async`.",
    "async_training.use_rollout_log_probs": "veRL's default is true; ours is false (the old log-probs are recomputed). "
    "True is `algorithm.rollout_correction.bypass_mode=true` in every mode.",
}


# veRL 0.10's keys (the V1 interface); the older names they replace are described as such below.
DESCRIPTIONS |= {
    "data.function_tool_path": "File of `@function_tool` functions whose schemas the prompts show (follows "
    "`actor_rollout_ref.rollout.multi_turn.function_tool_path`).",
    "reward.num_workers": "Processes that run `compute_score` (0: threads of the driver process). veRL 0.10's "
    "reward-loop workers; its default is 8, ours 1 (a laptop's cores).",
    "reward.timeout_s": "Per-sample limit in seconds on one `compute_score` call; a sample that raises or runs past "
    "it scores 0 and is counted in `reward/error_count` / `reward/timeout_count` (null or <= 0: no limit).",
    "reward.custom_reward_function.path": "File defining your reward function; null: the built-in rule chosen by "
    "`data_source` (`verl.utils.reward_score.default_compute_score`).",
    "reward.custom_reward_function.name": "Name of the function: `compute_score(data_source, solution_str, "
    "ground_truth, extra_info=None, **kwargs)` returning a number or a dict with a `score`.",
    "reward.custom_reward_function.reward_kwargs": "Extra keyword arguments passed to every call of the function; a "
    "key the function does not declare is an error at start-up.",
    "reward.reward_manager.source": "`register`: `reward.reward_manager.name` names a registered manager; "
    "`importlib`: load a class from `reward.reward_manager.module.path`.",
    "reward.reward_manager.name": "Registered reward manager: `naive` (one `compute_score` call per sample), "
    "`batch` (one call per batch), `dapo` (naive plus the overlong penalty), `gdpo`, or a reward-loop manager "
    "(veRL 0.10's contract, `async run_single` per sample): `rate_limited` (within `reward.max_concurrent` / "
    "`max_rpm` / `max_tpm` / `timeout`), `remote` (in `reward.num_workers` separate processes) or a user's "
    "([rewards.md](rewards.md)).",
    "reward.reward_manager.module.path": "File of a custom reward-manager class (`source: importlib`).",
    "reward.reward_manager.module.name": "Class name in that file.",
    "reward.reward_model.enable": "Serve a reward model ([rewards.md](rewards.md)): a causal LM is a judge that "
    "`reward.custom_reward_function` asks through `reward_router_address`; a classifier without a custom function "
    "gives the reward itself (its score of the prompt and response, veRL's rule).",
    "reward.reward_model.enable_resource_pool": "Give the reward model its own resource pool; without, its replicas "
    "run beside the training workers (not in `separate_async`).",
    "reward.reward_model.n_gpus_per_node": "Devices (CPU bundles on CPU) per node of that pool: one judge replica "
    "each.",
    "reward.reward_model.nnodes": "Nodes of that pool.",
    "reward.reward_model.model_path": "Reward-model folder: a causal LM (a judge; its tokenizer renders the "
    "router's chat requests) or a classifier with one label (`ForTokenClassification` / "
    "`ForSequenceClassification`).",
    "reward.reward_model.rollout.name": "The served judge's engine: `hf` or `vllm`.",
    "reward.reward_model.rollout.dtype": "The judge engine's dtype.",
    "reward.reward_model.rollout.prompt_length": "Longest judge prompt, in tokens.",
    "reward.reward_model.rollout.response_length": "Default `max_tokens` of a router request that gives none.",
    "reward.reward_model.rollout.seed": "The judge engine's sampling seed.",
    "reward.reward_model.rollout.free_cache_engine": "As `actor_rollout_ref.rollout.free_cache_engine`, for the "
    "judge's engine.",
    "reward.reward_model.rollout.engine_kwargs": "As `actor_rollout_ref.rollout.engine_kwargs`, for the judge.",
    **{
        f"reward.reward_model.rollout.{key}": f"As `actor_rollout_ref.rollout.{key}`, for the judge's vLLM engine."
        for key in VLLM_ONLY
    },
    "reward.sandbox_fusion.url": "URL of a SandboxFusion code-execution service for code rewards.",
    "reward.sandbox_fusion.max_concurrent": "Concurrent requests to that service.",
    "reward.sandbox_fusion.memory_limit_mb": "Memory limit per sandboxed execution, in MB.",
    "reward.reward_kwargs": "Keyword arguments for the reward manager's constructor (those it declares, e.g. the "
    "`dapo` manager's `max_resp_len` and `overlong_buffer_cfg.{enable,len,penalty_factor,log}`) or, for the "
    "built-in managers, for every `compute_score` call; a key neither declares is an error at start-up.",
    "trainer.use_v1": "veRL 0.10's choice between its V1 and V0 trainers; here one trainer runs both layouts and "
    "`false` only logs that (the mode is `trainer.v1.trainer_mode`, or its older name `trainer.mode`).",
    "trainer.v1.trainer_mode": "How generation and training are scheduled: `sync` (generate, then train, in the same "
    "processes), `colocate_async` or `separate_async` (see trainer_modes.md). `trainer.mode` is its older name.",
    "trainer.v1.sync": "Settings of the sync mode (none).",
    "trainer.v1.colocate_async.num_warmup_batches": "Batches generated ahead of training: the fixed lag, "
    "`async_training.max_lag` (one setting, two names).",
    "trainer.v1.separate_async.num_warmup_batches": "Batches generated ahead of training: the fixed lag, "
    "`async_training.max_lag` (one setting, two names).",
    "trainer.v1.separate_async.parameter_sync_step": "Optimizer steps (mini-batches) per weight push; when set, "
    "`data.train_batch_size` must equal it × `ppo_mini_batch_size`. Under `fixed_lag` the mini-batches train once "
    "the step's whole batch is generated; under `replay_buffer` each as it is sampled, on the step's π_old (veRL's "
    "streaming).",
    "trainer.v1.sampler.schedule": "Ours: how a step's batch is chosen. `fixed_lag`: `async_training.max_lag` "
    "batches ahead, each from one weight version, trained in order (reproducible; lag 0 equals sync). "
    "`replay_buffer`: veRL 0.10's buffer: sync (DAPO-filtered groups refilled two for one under "
    "`max_inflight_gen_batches`, the surplus discarded) and colocate_async (`num_warmup_batches` ahead; stale and "
    "filtered groups refilled one for one, the rest kept) and separate_async (the same, each step streamed in "
    "`parameter_sync_step` mini-batches).",
    "trainer.v1.sampler.max_off_policy_threshold": "The oldest group trained, in model versions; the fixed lag L "
    "(age L + 1) must not pass it (checked at start-up).",
    "trainer.v1.sampler.max_off_policy_strategy": "`drop` or `wait` for a group past the threshold; under the fixed "
    "lag none gets there, so both act alike.",
    "model_engine": "Training engine of the roles (a config group: it picks the `${model_engine}_actor` / `_ref` / "
    "`_critic` files): `dp` (FSDP) or `megatron` (Megatron-Core, [megatron.md](megatron.md)).",
    "distillation.enabled": "On-policy distillation from teacher models ([distillation.md](distillation.md)).",
}
_SWITCH = "trainer.v1.separate_async.hybrid_rollout"
DESCRIPTIONS |= {
    f"{_SWITCH}.enable_switch": "separate_async under `schedule=replay_buffer`: lend the training workers' engines to "
    "generation after a push while groups are missing, take them back once the threshold is sampleable.",
    f"{_SWITCH}.switch_threshold_ratio": "Share of `train_batch_size` that must be sampleable before the engines are "
    "taken back (at least one mini-batch); in (0, 1].",
    f"{_SWITCH}.adaptive_switch_threshold": "Move the ratio with the trainer's idle and calm steps.",
    f"{_SWITCH}.switch_threshold_step_up": "Rise of the ratio after `switch_threshold_release_steps` idle steps.",
    f"{_SWITCH}.switch_threshold_step_down": "Fall of the ratio after as many calm steps (not below one mini-batch).",
    f"{_SWITCH}.switch_threshold_release_steps": "Idle or calm steps in a row before the ratio moves.",
    f"{_SWITCH}.switch_cost_window_size": "Switches averaged for the switch's cost, weighed against the saving.",
}
DESCRIPTIONS["trainer.v1.sampler.sync_refill_failed_groups"] = (
    "Sync mode, `schedule=replay_buffer`: a prompt group whose samples all failed in their agent loops is replaced "
    "by a new prompt (default: it trains as padding samples). The async modes' buffers always evict and refill a "
    "group with a failed sample."
)
for _key in ("custom_sampler.path", "custom_sampler.name", "sampler_kwargs"):
    DESCRIPTIONS[f"trainer.v1.sampler.{_key}"] = (
        "A replay buffer class of your own (file and class name; a subclass of "
        "`verl.trainer.ppo.v1.replay_buffer.ReplayBuffer`), and keyword arguments its constructor gets as "
        "`sampler_kwargs`; `schedule=replay_buffer` only."
    )
for _key in ("metrics.enabled", "metrics.port", "backend.storage_backend", "backend.SimpleStorage.total_storage_size"):
    DESCRIPTIONS[f"transfer_queue.{_key}"] = "veRL's TransferQueue (none here: batches move as DataProto)."
DESCRIPTIONS["transfer_queue.backend.SimpleStorage.num_data_storage_units"] = DESCRIPTIONS["transfer_queue.enable"] = (
    "veRL's TransferQueue (none here: batches move as DataProto)."
)
for _group in ("rollout", "rollout_tq", "async_rollout"):
    for _key in ("enable", "dump_dir", "steps", "action"):
        DESCRIPTIONS[f"skip.{_group}.{_key}"] = (
            "veRL 0.10's rollout caching (not built yet: a value other than the default is refused; "
            "`actor_rollout_ref.rollout.skip_rollout` reuses one saved generation)."
        )
_DISTIL = "distillation.distillation_loss"
DESCRIPTIONS.update(
    {
        "distillation.n_gpus_per_node": "Devices per node of the teacher pool (CPU: worker processes).",
        "distillation.nnodes": "Nodes of the teacher pool (must be > 0 when distilling).",
        "distillation.teacher_key": "The sample field that routes it to a teacher (several teachers: each teacher's "
        "`key`; a value naming no teacher is an error).",
        "distillation.teacher_models.teacher_model.key": "The routing key of this teacher (one teacher: `default`).",
        "distillation.teacher_models.teacher_model.model_path": "The teacher model (HF folder; the student's "
        "tokenizer).",
        "distillation.teacher_models.teacher_model.num_replicas": "Replicas of this teacher (one teacher: they fill "
        "the pool).",
        "distillation.teacher_models.teacher_model.inference": "The teacher's serving engine: the student's "
        "`actor_rollout_ref.rollout.*` under these (`name`: hf or vllm).",
        f"{_DISTIL}.loss_mode": "`k1`/`kl`, `abs`, `k2`/`mse`, `k3`/`low_var_kl` (on the sampled token) or "
        "`forward_kl_topk` (over the teacher's top-k); or a registered loss of your own.",
        f"{_DISTIL}.topk": "The k of the top-k losses (the teacher's `prompt_logprobs`).",
        f"{_DISTIL}.use_task_rewards": "Keep the task's policy loss and add the distillation loss × "
        "`distillation_loss_coef`; false: the distillation loss alone.",
        f"{_DISTIL}.distillation_loss_coef": "Weight of the distillation loss beside the task's (with "
        "`use_task_rewards`).",
        f"{_DISTIL}.loss_max_clamp": "Bound each token's distillation loss to ±this (null: none).",
        f"{_DISTIL}.log_prob_min_clamp": "Floor of both sides' log-probs before the loss (null: none).",
        f"{_DISTIL}.use_policy_gradient": "−loss (detached) as the advantage of a PPO clipped loss instead of "
        "back-propagating the loss (`k1` needs it).",
        f"{_DISTIL}.policy_loss_mode": "The policy loss of `use_policy_gradient` (`vanilla` only).",
        f"{_DISTIL}.clip_ratio": "PPO clip of `use_policy_gradient` (the default of the two below).",
        f"{_DISTIL}.clip_ratio_low": "Lower PPO clip of `use_policy_gradient`.",
        f"{_DISTIL}.clip_ratio_high": "Upper PPO clip of `use_policy_gradient`.",
    }
)

# veRL's older names: each is read into its newer one (verl/trainer/config/layout.py).
_OLDER = {
    "trainer.mode": "trainer.v1.trainer_mode",
    "reward_model.enable": "reward.reward_model.enable",
    "reward_model.enable_resource_pool": "reward.reward_model.enable_resource_pool",
    "reward_model.n_gpus_per_node": "reward.reward_model.n_gpus_per_node",
    "reward_model.nnodes": "reward.reward_model.nnodes",
    "reward_model.model.path": "reward.reward_model.model_path",
    "reward_model.reward_manager": "reward.reward_manager.name",
    "reward_model.num_workers": "reward.num_workers",
    "reward_model.reward_loop_source": "reward.reward_manager.source",
    "reward_model.reward_loop_module_path": "reward.reward_manager.module.path",
    "reward_model.reward_loop_class_name": "reward.reward_manager.module.name",
    "reward_model.timeout_s": "reward.timeout_s",
    "reward_model.reward_kwargs": "reward.reward_kwargs",
    "reward_manager.source": "reward.reward_manager.source",
    "reward_manager.name": "reward.reward_manager.name",
    "reward_manager.module.path": "reward.reward_manager.module.path",
    "reward_manager.module.name": "reward.reward_manager.module.name",
    "custom_reward_function.path": "reward.custom_reward_function.path",
    "custom_reward_function.name": "reward.custom_reward_function.name",
    "custom_reward_function.reward_kwargs": "reward.custom_reward_function.reward_kwargs",
    "rollout.nnodes": "actor_rollout_ref.rollout.nnodes",
    "rollout.n_gpus_per_node": "actor_rollout_ref.rollout.n_gpus_per_node",
    **{f"reward_model.sandbox_fusion.{k}": f"reward.sandbox_fusion.{k}" for k in ("url", "max_concurrent")},
    "reward_model.sandbox_fusion.memory_limit_mb": "reward.sandbox_fusion.memory_limit_mb",
    **{
        f"reward_model.overlong_buffer.{k}": f"reward.reward_kwargs.overlong_buffer_cfg.{k}"
        for k in ("enable", "len", "penalty_factor", "log")
    },
}
for _old, _new in _OLDER.items():
    DESCRIPTIONS[_old] = (
        f"veRL's older name of `{_new}`: a value set here is read into it with a warning (a different value in "
        "both is an error)."
    )
OURS["reward.timeout_s"] = OURS.pop("reward_model.timeout_s")
DESCRIPTIONS["ray_kwargs.ray_init.runtime_env.py_executable"] = (
    "The Python interpreter (or a prefix such as `uv run ...`) Ray starts its worker processes with; null: this "
    "interpreter."
)
