"""The names veRL's recipes (dapo, spin, sppo, retool, fapo, prime, entropy, ...) import from veRL, and what they do
here: the imports a recipe's modules run first, then each helper called as a recipe calls it."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import time

import pytest
import torch

from verl.protocol import DataProto

# (module, names) that recipes import beyond the trainer's own API
RECIPE_IMPORTS = [
    ("verl.trainer.constants_ppo", ["get_ppo_ray_runtime_env", "PPO_RAY_RUNTIME_ENV"]),
    ("verl.trainer.ppo.reward", ["compute_reward", "compute_reward_async", "get_custom_reward_fn"]),
    ("verl.trainer.ppo.utils", ["Role", "WorkerType", "need_reference_policy", "need_reward_model"]),
    ("verl.utils.device", ["auto_set_device", "is_cuda_available", "get_device_name", "get_nccl_backend"]),
    ("verl.utils.hdfs_io", ["copy", "makedirs", "exists"]),
    ("verl.utils.model", ["compute_position_id_with_mask"]),
    ("verl.utils.py_functional", ["append_to_dict", "timeout_limit"]),
    ("verl.utils.ray_utils", ["get_event_loop"]),
    ("verl.utils.rollout_trace", ["rollout_trace_op", "rollout_trace_attr", "RolloutTraceConfig"]),
    ("verl.workers.rollout.schemas", ["Message", "FinishReasonTypeEnum"]),
    ("verl.workers.config.optimizer", ["build_optimizer"]),
    ("verl.workers.fsdp_workers", ["ActorRolloutRefWorker", "create_device_mesh", "get_sharding_strategy"]),
]


@pytest.mark.parametrize(("module", "names"), RECIPE_IMPORTS, ids=[m for m, _ in RECIPE_IMPORTS])
def test_recipe_imports_resolve(module, names):
    imported = importlib.import_module(module)
    missing = [name for name in names if not hasattr(imported, name)]
    assert not missing, f"{module} lacks {missing}"


def test_ppo_runtime_env_carries_verl_settings_and_skips_set_defaults(monkeypatch):
    from verl.trainer.constants_ppo import PPO_RAY_RUNTIME_ENV, get_ppo_ray_runtime_env, ppo_worker_env

    monkeypatch.setenv("VERL_SOMETHING", "7")
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    env = get_ppo_ray_runtime_env()["env_vars"]
    assert env["VERL_SOMETHING"] == "7"
    assert env["TOKENIZERS_PARALLELISM"] == PPO_RAY_RUNTIME_ENV["env_vars"]["TOKENIZERS_PARALLELISM"]
    assert "RAY_AUTH_MODE" not in env  # already set here: a local cluster inherits it
    assert ppo_worker_env()["RAY_AUTH_MODE"] == "disabled"


def test_append_to_dict_gathers_metrics_under_a_prefix():
    from verl.utils.py_functional import append_to_dict

    metrics: dict = {"a": [1]}
    append_to_dict(metrics, {"a": 2, "b": 3})
    append_to_dict(metrics, {"a": 4}, prefix="val/")
    assert metrics == {"a": [1, 2], "b": [3], "val/a": [4]}


def _slow(seconds: float) -> str:
    time.sleep(seconds)
    return "done"


def _raises() -> None:
    raise KeyError("inner")


@pytest.mark.parametrize("use_signals", [False, True])
def test_timeout_limit_returns_raises_and_times_out(use_signals):
    from verl.utils.py_functional import timeout_limit

    assert timeout_limit(5, use_signals=use_signals)(_slow)(0.01) == "done"
    with pytest.raises(KeyError, match="inner"):
        timeout_limit(5, use_signals=use_signals)(_raises)()
    start = time.perf_counter()
    with pytest.raises(TimeoutError, match="_slow timed out after 0.3 s"):
        timeout_limit(0.3, use_signals=use_signals)(_slow)(30)
    assert time.perf_counter() - start < 10  # stopped at the deadline, not after the call's 30 s


def test_get_event_loop_outside_and_inside_a_loop():
    from verl.utils.ray_utils import get_event_loop

    loop = get_event_loop()
    assert loop.run_until_complete(asyncio.sleep(0, result=3)) == 3

    async def inside():
        return get_event_loop() is asyncio.get_running_loop()

    assert loop.run_until_complete(inside())


def test_auto_set_device_leaves_a_cpu_config_alone():
    from omegaconf import OmegaConf

    from verl.utils.device import auto_set_device

    config = OmegaConf.create({"trainer": {"device": "cuda"}})
    auto_set_device(config)  # no NPU here
    assert config.trainer.device == "cuda"
    auto_set_device(None)


def test_need_reward_model_reads_the_mapping():
    from verl.trainer.ppo.utils import Role, need_reward_model

    assert need_reward_model({Role.RewardModel: object})
    assert not need_reward_model({Role.ActorRollout: object})


def test_compute_reward_async_runs_as_a_ray_task(ray_cluster):
    from verl.trainer.ppo.reward import compute_reward_async

    def _score_length(data: DataProto, return_dict: bool = False):  # local: Ray ships it by value
        scores = data.batch["responses"].ne(0).float()
        return {"reward_tensor": scores, "reward_extra_info": {"n": [1] * len(data)}} if return_dict else scores

    data = DataProto.from_dict({"responses": torch.tensor([[3, 4, 0], [5, 0, 0]])})
    reward, extra = ray_cluster.get(compute_reward_async.remote(data, reward_fn=_score_length))
    assert torch.equal(reward, torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))
    assert extra == {"n": [1, 1]}
    with pytest.raises(Exception, match="needs reward_fn, or config and tokenizer"):
        ray_cluster.get(compute_reward_async.remote(data))


def test_position_ids_from_a_left_padded_mask():
    from verl.utils.model import compute_position_id_with_mask

    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    assert compute_position_id_with_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 3]]


def test_message_and_finish_reason():
    from verl.tools.schemas import ToolResponse
    from verl.workers.rollout.schemas import FinishReasonTypeEnum, Message

    assert Message(role="user", content="hi").model_dump() == {"role": "user", "content": "hi", "tool_calls": None}
    assert Message(role="tool", content=ToolResponse(text="4")).content.text == "4"
    assert FinishReasonTypeEnum.from_str("tool_calls") is FinishReasonTypeEnum.TOOL_CALL
    with pytest.raises(ValueError, match="'eos'"):
        FinishReasonTypeEnum.from_str("eos")


def test_hdfs_io_copies_local_files_and_folders_and_refuses_hdfs(tmp_path):
    from verl.utils import hdfs_io

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("x")
    hdfs_io.makedirs(str(tmp_path / "out"), exist_ok=True)
    hdfs_io.copy(str(tmp_path / "src"), str(tmp_path / "out" / "tree"))
    hdfs_io.copy(str(tmp_path / "src" / "a.txt"), str(tmp_path / "out" / "b.txt"))
    assert (tmp_path / "out" / "tree" / "a.txt").read_text() == "x"
    assert hdfs_io.exists(str(tmp_path / "out" / "b.txt"))
    with pytest.raises(NotImplementedError, match="hdfs://"):
        hdfs_io.copy("hdfs://cluster/ckpt", os.fspath(tmp_path / "x"))


def test_build_optimizer_from_the_config():
    from verl.workers.config import FSDPOptimizerConfig
    from verl.workers.config.optimizer import build_optimizer

    params = [torch.nn.Parameter(torch.zeros(3))]
    optimizer = build_optimizer(params, FSDPOptimizerConfig(lr=0.5, weight_decay=0.0, betas=(0.8, 0.9)))
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.param_groups[0]["lr"] == 0.5 and optimizer.param_groups[0]["betas"] == (0.8, 0.9)


def _mesh_on_two_ranks(rank: int, results) -> None:
    from torch.distributed.fsdp import ShardingStrategy

    from verl.workers.fsdp_workers import create_device_mesh, get_sharding_strategy

    full = create_device_mesh(world_size=2, fsdp_size=-1)
    hybrid = create_device_mesh(world_size=2, fsdp_size=1)
    assert full.mesh_dim_names == ("fsdp",) and full.ndim == 1
    assert hybrid.mesh_dim_names == ("ddp", "fsdp") and tuple(hybrid.shape) == (2, 1)
    assert get_sharding_strategy(full) is ShardingStrategy.FULL_SHARD
    assert get_sharding_strategy(full, zero3_enable=False) is ShardingStrategy.SHARD_GRAD_OP
    assert get_sharding_strategy(hybrid) is ShardingStrategy.HYBRID_SHARD
    try:
        create_device_mesh(world_size=4, fsdp_size=-1)
    except ValueError as error:
        assert "the process group has 2" in str(error)
    else:
        raise AssertionError("a world size other than the group's was accepted")
    results[rank] = True


def test_device_mesh_and_sharding_strategy_on_two_ranks(gloo):
    import torch.multiprocessing as mp

    results = mp.Manager().dict()
    gloo(_mesh_on_two_ranks, 2, results)
    assert dict(results) == {0: True, 1: True}


# the legacy worker internals that recipes' init_model overrides and actors call (sppo, spin, prime)
LEGACY_IMPORTS = [
    (
        "verl.utils.fsdp_utils",
        [
            "get_fsdp_wrap_policy",
            "get_init_weight_context_manager",
            "init_fn",
            "load_fsdp_model_to_gpu",
            "load_fsdp_optimizer",
            "offload_fsdp_model_to_cpu",
            "offload_fsdp_optimizer",
            "fsdp_version",
        ],
    ),
    ("verl.utils.checkpoint.fsdp_checkpoint_manager", ["FSDPCheckpointManager"]),
    ("verl.utils.flops_counter", ["FlopsCounter"]),
    ("verl.utils.ulysses", ["gather_outputs_and_unpad", "ulysses_pad_and_slice_inputs"]),
    ("verl.workers.sharding_manager.fsdp_ulysses", ["FSDPUlyssesShardingManager"]),
    ("verl.models.transformers.monkey_patch", ["apply_monkey_patch"]),
    ("verl.utils.model", ["print_model_size"]),
    ("verl.utils.torch_functional", ["get_constant_schedule_with_warmup", "get_cosine_schedule_with_warmup"]),
    ("verl.workers.fsdp_workers", ["AsyncActorRolloutRefWorker"]),
]


@pytest.mark.parametrize(("module", "names"), LEGACY_IMPORTS, ids=[m for m, _ in LEGACY_IMPORTS])
def test_legacy_worker_imports_resolve(module, names):
    imported = importlib.import_module(module)
    missing = [name for name in names if not hasattr(imported, name)]
    assert not missing, f"{module} lacks {missing}"


def test_legacy_worker_methods_and_actor_internals_exist():
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    for name in ("_build_model_optimizer", "_build_rollout"):
        assert callable(getattr(ActorRolloutRefWorker, name)), name
    for name in ("_forward_micro_batch", "_optimizer_step", "update_policy", "compute_log_prob"):
        assert callable(getattr(DataParallelPPOActor, name)), name


def test_fsdp_wrap_policy_wraps_the_decoder_layers_and_weights_init_on_the_cpu(caplog):
    from verl.utils.fsdp_utils import get_fsdp_wrap_policy, get_init_weight_context_manager
    from verl.utils.tiny_model import build_tiny_qwen2

    model = build_tiny_qwen2()
    policy = get_fsdp_wrap_policy(model, config={"min_num_params": 0})
    layer = model.model.layers[0]
    assert policy(module=layer, recurse=False, nonwrapped_numel=0)
    assert not policy(module=model.lm_head, recurse=False, nonwrapped_numel=0)
    assert get_fsdp_wrap_policy(model, config={"disable": True}) is None
    with pytest.raises(NotImplementedError, match="min_num_params"):
        get_fsdp_wrap_policy(model, config={"min_num_params": 1000})
    # a name that is not in the model is skipped, said once; none found is an error naming the classes
    layer_name = type(layer).__name__
    with caplog.at_level(logging.WARNING, logger="verl.utils.fsdp_utils"):
        policy = get_fsdp_wrap_policy(model, config={"transformer_layer_cls_to_wrap": [layer_name, "GhostLayer"]})
    assert policy(module=layer, recurse=False, nonwrapped_numel=0) and "['GhostLayer']" in caplog.text
    with pytest.raises(ValueError, match=r"Could not find any of the transformer layer classes \['GhostLayer'\]"):
        get_fsdp_wrap_policy(model, config={"transformer_layer_cls_to_wrap": ["GhostLayer"]})
    with get_init_weight_context_manager(use_meta_tensor=False)():
        assert torch.empty(1).device.type == "cpu"
