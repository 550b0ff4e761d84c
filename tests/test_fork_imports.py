"""The module paths veRL forks and recipes import, used the way that code uses them."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from tensordict import NonTensorData, NonTensorStack, TensorDict


# ---------------------------------------------------------------- verl.utils.fs
def test_copy_to_local_returns_local_paths_and_refuses_remote_ones(tmp_path, monkeypatch):
    from verl.utils.fs import copy, copy_local_path_from_hdfs, copy_to_local, exists, is_non_local, makedirs

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert copy_to_local(str(model)) == str(model)
    assert copy_to_local("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"  # a Hub name passes through
    monkeypatch.setenv("HOME", str(tmp_path))
    assert copy_to_local("~/model", cache_dir="/unused", verbose=True) == str(model)
    assert copy_local_path_from_hdfs(f"file://{model}") == str(model)
    assert is_non_local("hdfs://nn/ckpt") and not is_non_local(str(model))
    with pytest.raises(NotImplementedError, match=r"src='hdfs://nn/ckpt': HDFS paths are not supported"):
        copy_to_local("hdfs://nn/ckpt")
    with pytest.raises(NotImplementedError, match=r"s3:// paths are not supported"):
        copy_local_path_from_hdfs("s3://bucket/model")
    with pytest.raises(TypeError, match="src must be a path string"):
        copy_to_local(3)
    makedirs(str(tmp_path / "a" / "b"), exist_ok=True)
    assert exists(str(tmp_path / "a" / "b")) and not exists(str(tmp_path / "nope"))
    assert copy(str(model), str(tmp_path / "copy")) and (tmp_path / "copy" / "config.json").read_text() == "{}"


def test_non_local_sources_go_through_the_cache_whose_transfer_is_copy(tmp_path, monkeypatch):
    import verl.utils.fs as fs

    remote = tmp_path / "remote_model"  # what an hdfs:// path stands for; the transfer reads it locally
    (remote / "sub").mkdir(parents=True)
    (remote / "config.json").write_text("{}")
    (remote / "sub" / "w.bin").write_bytes(b"123")
    calls, local_copy = [], fs.copy

    def transfer(src: str, dst: str, **kwargs) -> bool:
        calls.append(src)
        return local_copy(str(remote), dst)

    monkeypatch.setattr(fs, "copy", transfer)
    src, cache = "hdfs://nn/models/remote_model", tmp_path / "cache"
    local = fs.copy_to_local(src, cache_dir=str(cache))
    assert local == os.path.join(cache, fs.md5_encode(src), "remote_model") and calls == [src]
    assert open(os.path.join(local, "sub", "w.bin"), "rb").read() == b"123"
    record = os.path.join(local, ".directory_record.json")
    assert fs._check_directory_structure(local, record)
    assert fs.copy_to_local(src, cache_dir=str(cache)) == local and len(calls) == 1  # cached
    os.remove(os.path.join(local, "sub", "w.bin"))  # an incomplete cache is copied again
    assert not fs._check_directory_structure(local, record)
    fs.copy_to_local(src, cache_dir=str(cache))
    assert len(calls) == 2 and os.path.exists(os.path.join(local, "sub", "w.bin"))
    fs.copy_to_local(src, cache_dir=str(cache), always_recopy=True)
    assert len(calls) == 3
    with open(os.path.join(local, "config.json"), "w") as f:  # same names, another size: a changed tree
        f.write("{ }")
    assert not fs._check_directory_structure(local, record)
    assert not fs._check_directory_structure(local, os.path.join(local, "missing_record.json"))


def test_fs_cache_and_mkdir_helpers(tmp_path, monkeypatch):
    from verl.utils.fs import get_local_temp_path, local_mkdir_safe, md5_encode, verify_copy

    monkeypatch.chdir(tmp_path)
    made = local_mkdir_safe("ckpt/global_step_1")
    assert made == str(tmp_path / "ckpt" / "global_step_1") and os.path.isdir(made)
    assert local_mkdir_safe(made) == made  # again: no error
    dst = get_local_temp_path("hdfs://nn/models/qwen", str(tmp_path / "cache"))
    assert dst == str(tmp_path / "cache" / md5_encode("hdfs://nn/models/qwen") / "qwen")
    assert os.path.isdir(os.path.dirname(dst)) and len(md5_encode("x")) == 32
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "w.bin").write_bytes(b"12345")
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "w.bin").write_bytes(b"1234")
    assert not verify_copy(str(tmp_path / "src"), str(tmp_path / "dst"))
    (tmp_path / "dst" / "w.bin").write_bytes(b"54321")
    assert verify_copy(str(tmp_path / "src"), str(tmp_path / "dst"))


# ---------------------------------------------------------------- verl.utils.config / verl.utils
@dataclasses.dataclass
class _Point:
    x: int = 0
    y: int = 0


def test_omega_conf_to_dataclass_at_verl_utils_paths():
    from verl.base_config import omega_conf_to_dataclass as base_fn
    from verl.utils import omega_conf_to_dataclass
    from verl.utils.config import omega_conf_to_dataclass as config_fn
    from verl.workers.config import FSDPEngineConfig

    assert omega_conf_to_dataclass is config_fn is base_fn
    cfg = omega_conf_to_dataclass(OmegaConf.create({"param_offload": True, "fsdp_size": 2}), FSDPEngineConfig)
    assert cfg.param_offload is True and cfg.fsdp_size == 2 and cfg["strategy"] == "fsdp"
    target = OmegaConf.create({"_target_": f"{__name__}._Point", "x": 3})
    assert omega_conf_to_dataclass(target) == _Point(x=3)
    # veRL instantiates any other _target_ with hydra
    assert omega_conf_to_dataclass({"_target_": "datetime.timedelta", "seconds": 5}) == datetime.timedelta(seconds=5)


def test_validate_config_at_utils_path_reports_problems(caplog):
    from verl.trainer.config.validate import ConfigError, base_config
    from verl.utils.config import update_dict_with_config, validate_config

    # outside a Hydra app a key verl lacks is taken as the recipe's (tests/test_recipe_conventions.py); a wrong type
    # of one of verl's keys is still a problem named by its key
    bad = OmegaConf.merge(base_config(), {"trainer": {"total_epochs": "many"}})
    with pytest.raises(ConfigError, match="trainer.total_epochs"):
        validate_config(bad, use_reference_policy=False, use_critic=True, check_environment=False)
    d = {"lr": 1.0, "other": 2}
    update_dict_with_config(d, OmegaConf.create({"lr": 0.5}))
    assert d == {"lr": 0.5, "other": 2}


def test_utils_package_is_light_and_never_imports_the_trainer():
    code = (
        "import sys, verl.utils\n"
        "assert 'torch' not in sys.modules, 'import verl.utils pulled in torch'\n"
        "from verl.utils import hf_tokenizer, hf_processor, omega_conf_to_dataclass\n"
        "import verl.utils.config, verl.utils.fs, verl.utils.import_utils, verl.utils.metric, verl.utils.profiler\n"
        "import verl.utils.tensordict_utils, verl.utils.device, verl.utils.ray_utils, verl.utils.tokenizer\n"
        "bad = sorted(m for m in sys.modules if m.startswith('verl.trainer'))\n"
        "assert not bad, bad\n"
        "assert callable(hf_tokenizer) and callable(hf_processor)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


# ---------------------------------------------------------------- verl.utils.import_utils
def test_load_extern_objects_from_files_and_packages(tmp_path):
    from verl.utils import fs
    from verl.utils.import_utils import load_extern_object, load_extern_type, load_module

    src = tmp_path / "my_dataset.py"
    src.write_text("class MyDataset:\n    size = 7\n\nSCALE = 3\n")
    cls = load_extern_type(str(src), "MyDataset")
    assert cls.size == 7 and load_extern_type(f"file://{src}", "MyDataset") is cls  # imported once per process
    assert load_extern_object(str(src), "SCALE") == 3
    assert load_extern_object("pkg://verl.utils.fs", "copy_to_local") is fs.copy_to_local
    assert load_extern_object("pkg://verl/utils/fs", "is_non_local") is fs.is_non_local
    with pytest.raises(AttributeError, match="object_name='Missing'"):
        load_extern_object(str(src), "Missing")
    with pytest.raises(AttributeError, match="'Missing'.*verl.utils.fs"):
        load_extern_object("pkg://verl.utils.fs", "Missing")
    with pytest.raises(TypeError, match="not a class"):
        load_extern_type(str(src), "SCALE")
    with pytest.raises(FileNotFoundError, match="module_path="):
        load_extern_object(str(tmp_path / "nope.py"), "X")
    module = load_module(str(src), module_name="fork_imports_my_dataset")
    assert sys.modules["fork_imports_my_dataset"] is module and module.MyDataset is cls
    assert load_module("") is None
    with pytest.raises(AttributeError, match="object_name='X': module_path is empty"):
        load_extern_object(None, "X")
    broken = tmp_path / "broken.py"
    broken.write_text("this is not python :\n")
    with pytest.raises(RuntimeError, match="importing the file failed: SyntaxError") as excinfo:
        load_extern_object(str(broken), "X")
    assert isinstance(excinfo.value.__cause__, SyntaxError)


def test_import_external_libs_and_package_checks():
    import importlib.util
    import json

    from verl.utils.import_utils import (
        import_external_libs,
        is_megatron_core_available,
        is_sglang_available,
        is_vllm_available,
    )

    assert import_external_libs(None) == []
    assert import_external_libs("json") == [json]
    assert [m.__name__ for m in import_external_libs(["json", "verl.utils.fs"])] == ["json", "verl.utils.fs"]
    with pytest.raises(ImportError, match="cannot import module 'no_such_pkg_xyz'"):
        import_external_libs(["json", "no_such_pkg_xyz"])
    assert is_vllm_available() == (importlib.util.find_spec("vllm") is not None)
    assert is_sglang_available() == (importlib.util.find_spec("sglang") is not None)
    assert isinstance(is_megatron_core_available(), bool)


# ---------------------------------------------------------------- verl.utils.metric
def test_reduce_metrics_lives_in_utils_and_is_reexported():
    from verl.trainer.ppo import metric_utils
    from verl.utils.metric import AggregationType, MetricList, MetricValue, reduce_metrics
    from verl.utils.metric.utils import AggregationTypeMismatchError

    assert metric_utils.reduce_metrics is reduce_metrics
    tokens = MetricList("sum")
    tokens.extend([MetricValue(10, AggregationType.SUM), 5, torch.tensor(1)])
    metrics = {"loss": [1.0, 2.0, 3.0], "grad/max": [1, 9], "lr/min": np.array([0.5, 0.1]), "tokens": tokens}
    out = reduce_metrics(metrics)
    assert out is metrics  # veRL reduces a dict in place
    assert out == {"loss": 2.0, "grad/max": 9.0, "lr/min": 0.1, "tokens": 16.0}
    assert reduce_metrics({"x": torch.tensor(4.0), "empty": []}) == {"x": 4.0}
    assert MetricList.chain([MetricList("max", [1]), MetricList("max", [7])]).aggregate() == 7.0
    with pytest.raises(AggregationTypeMismatchError, match="sum != mean"):
        tokens.append(MetricValue(1.0, "mean"))
    with pytest.raises(ValueError, match="aggregation='median'"):
        MetricList("median")


# ---------------------------------------------------------------- verl.utils.profiler (timers)
def test_marked_timer_accumulates_and_is_the_trainers_timer(caplog):
    from verl.trainer.ppo import ray_trainer
    from verl.utils.profiler import GPUMemoryLogger, log_gpu_memory_usage, marked_timer, simple_timer

    assert ray_trainer.marked_timer is marked_timer
    timing: dict[str, float] = {}
    for _ in range(2):
        with marked_timer("gen", timing, color="red"):
            sum(range(1000))
    first = timing["gen"]
    with simple_timer("gen", timing):
        pass
    assert timing["gen"] >= first > 0
    step = marked_timer("step", timing)
    step.start()
    assert step.stop() == timing["step"] and step.last == timing["step"]
    with pytest.raises(RuntimeError, match="stopped without being started"):
        step.stop()

    @GPUMemoryLogger(role="actor", level=logging.INFO, log_only_rank_0=False)
    def update_actor(x):
        return x + 1

    with caplog.at_level(logging.INFO, logger="verl.utils.profiler.performance"):
        assert update_actor(1) == 2
        log_gpu_memory_usage("after load", level=logging.INFO, rank=None)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("[actor] Before update_actor, memory allocated (GB)") for m in messages)
    assert any(m.startswith("[actor] After update_actor") for m in messages)
    assert any(m.startswith("after load, memory allocated") for m in messages)


# ---------------------------------------------------------------- verl.utils.tokenizer
@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> str:
    """A word-level tokenizer folder with an eos token and no pad token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "</s>": 1, "hello": 2, "world": 3}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path_factory.mktemp("tok")
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>").save_pretrained(path)
    return str(path)


def test_hf_tokenizer_sets_pad_token_and_hf_processor_is_none_for_text_models(tokenizer_dir, caplog):
    from verl.utils import hf_processor, hf_tokenizer
    from verl.utils.tokenizer import hf_tokenizer as tokenizer_fn

    # the function, or (once anything imported verl.utils.hf_tokenizer) that module, which calls it
    assert hf_tokenizer is tokenizer_fn or hf_tokenizer is sys.modules.get("verl.utils.hf_tokenizer")
    with caplog.at_level(logging.WARNING, logger="verl.utils.tokenizer"):
        tok = hf_tokenizer(tokenizer_dir)
    assert tok.pad_token == "</s>" and tok.pad_token_id == tok.eos_token_id == 1
    assert any("pad_token" in r.getMessage() for r in caplog.records)
    assert tok("hello world")["input_ids"] == [2, 3]
    assert hf_tokenizer(tokenizer_dir, correct_pad_token=False).pad_token is None
    assert hf_processor(tokenizer_dir) is None
    # veRL's other spelling: importing the module shadows the function attribute, and stays callable
    import verl.utils
    from verl.utils.hf_tokenizer import hf_tokenizer as module_fn

    assert module_fn is tokenizer_fn
    from verl.utils import hf_tokenizer as after_module_import

    assert verl.utils.hf_tokenizer is after_module_import
    assert after_module_import(tokenizer_dir).pad_token == "</s>"


# ---------------------------------------------------------------- verl.utils.device
def test_device_helpers_agree_with_torch():
    from verl.utils.device import (
        get_device_id,
        get_device_name,
        get_nccl_backend,
        get_torch_device,
        get_visible_devices_keyword,
        is_cuda_available,
        is_npu_available,
    )

    cuda = torch.cuda.is_available()
    assert bool(is_cuda_available) == is_cuda_available() == cuda and (is_cuda_available == cuda)
    assert not is_npu_available or get_device_name() == "npu"
    assert get_device_name() == ("cuda" if cuda else "cpu")
    device = get_torch_device()
    assert device is torch.cuda if cuda else device.synchronize is torch.cpu.synchronize
    if not cuda:  # veRL's workers log these; on CPU: the process's peak and current resident memory
        assert device.max_memory_allocated() >= device.memory_allocated() > 10 * 2**20
    assert get_nccl_backend() == ("nccl" if cuda else "gloo")
    assert get_visible_devices_keyword() == "CUDA_VISIBLE_DEVICES"
    assert get_device_id() == (torch.cuda.current_device() if cuda else "cpu")  # veRL's: .to() stays on CPU


# ---------------------------------------------------------------- verl.utils.tensordict_utils
def _batch() -> TensorDict:
    from verl.utils.tensordict_utils import get_tensordict

    nested = torch.nested.as_nested_tensor(
        [torch.arange(n, dtype=torch.float32) for n in (1, 2, 3, 4)], layout=torch.jagged
    )
    return get_tensordict(
        {"x": torch.arange(8).view(4, 2), "ids": nested, "turns": [[], [0.5], {"a": 1}, "s"]},
        non_tensor_dict={"temperature": 0.7},
    )


def test_get_tensordict_get_pop_and_assign_non_tensor():
    from verl.utils.tensordict_utils import (
        assign_non_tensor,
        get,
        get_keys,
        get_non_tensor_data,
        get_tensordict,
        pop,
        pop_keys,
    )

    td = _batch()
    assert td.batch_size == torch.Size([4]) and isinstance(td.get("turns"), NonTensorStack)
    assert get(td, "turns") == [[], [0.5], {"a": 1}, "s"] and get(td, "temperature") == 0.7
    assert get(td, "missing", "d") == "d" and get_non_tensor_data(td, "temperature", None) == 0.7
    assign_non_tensor(td, tag="run1", scores=[1, 2, 3, 4])
    assert isinstance(td.get("tag"), NonTensorData) and get(td, "scores") == [1, 2, 3, 4]
    assert pop(td, "tag") == "run1" and "tag" not in td.keys() and pop(td, "tag", 5) == 5
    sub = get_keys(td, ["x", "temperature"])
    assert set(sub.keys()) == {"x", "temperature"} and get(sub, "temperature") == 0.7
    popped = pop_keys(td, ["scores"])
    assert get(popped, "scores") == [1, 2, 3, 4] and "scores" not in td.keys()
    with pytest.raises(KeyError, match="'nope'"):
        get_keys(td, ["nope"])
    with pytest.raises(ValueError, match="'b' has 3 rows"):
        get_tensordict({"a": torch.zeros(2), "b": torch.zeros(3)})
    with pytest.raises(TypeError, match="list holding tensors"):
        get_tensordict({"a": [torch.zeros(1)]})


def test_concat_chunk_select_pad_and_union_with_nested_and_non_tensors():
    from verl.utils.tensordict_utils import (
        assert_tensordict_eq,
        chunk_tensordict,
        concat_tensordict,
        contiguous,
        get,
        index_select_tensor_dict,
        make_iterator,
        pad_to_divisor,
        union_tensor_dict,
        unpad,
    )

    td = _batch()
    halves = chunk_tensordict(td, 2)
    assert [len(h) for h in halves] == [2, 2] and [r.tolist() for r in halves[1]["ids"].unbind()] == [
        [0.0, 1.0, 2.0],
        [0.0, 1.0, 2.0, 3.0],
    ]
    assert get(halves[1], "turns") == [{"a": 1}, "s"] and get(halves[0], "temperature") == 0.7
    joined = concat_tensordict(halves)
    assert_tensordict_eq(joined, td)
    picked = index_select_tensor_dict(td, [3, 0])
    assert picked["x"].tolist() == [[6, 7], [0, 1]] and get(picked, "turns") == ["s", []]
    assert [len(r) for r in picked["ids"].unbind()] == [4, 1] and get(picked, "temperature") == 0.7
    padded, pad = pad_to_divisor(td, 3)
    assert pad == 2 and len(padded) == 6 and padded["x"][4:].tolist() == [[0, 1], [2, 3]]
    assert_tensordict_eq(unpad(padded, pad), td)
    with pytest.raises(AssertionError, match="'x': values differ"):
        assert_tensordict_eq(td, td.clone().apply(lambda t: t + 1 if not t.is_nested else t))
    other = TensorDict({"y": torch.ones(4)}, batch_size=[4])
    other["temperature"] = NonTensorData(0.7)
    union = union_tensor_dict(td.exclude("ids"), other)
    assert get(union, "temperature") == 0.7 and union["y"].tolist() == [1.0] * 4
    clash = TensorDict({"x": torch.zeros(4, 2, dtype=torch.long)}, batch_size=[4])
    with pytest.raises(ValueError, match="'x' holds different values"):
        union_tensor_dict(td.exclude("ids"), clash)
    dense = contiguous(TensorDict({"t": torch.arange(6).view(2, 3).t()}, batch_size=[3]))
    assert dense["t"].is_contiguous()
    batches = list(make_iterator(td.exclude("ids"), mini_batch_size=2, epochs=2))
    assert len(batches) == 4 and batches[2]["x"].tolist() == [[0, 1], [2, 3]]


# ---------------------------------------------------------------- verl.protocol serialization helpers
def test_protocol_serialization_helpers_round_trip():
    from verl.protocol import (
        deserialize_single_tensor,
        deserialize_tensordict,
        list_of_dict_to_dict_of_list,
        numpy_dict_to_tensor_dict,
        serialize_single_tensor,
        serialize_tensordict,
    )

    t = torch.randn(3, 4).to(torch.bfloat16)
    dtype, shape, data = serialize_single_tensor(t)
    assert (dtype, shape, data.dtype, data.size) == ("bfloat16", (3, 4), np.uint8, 24)
    assert torch.equal(deserialize_single_tensor((dtype, shape, bytes(data))), t)  # read-only buffer: copied
    nested = torch.nested.as_nested_tensor([torch.arange(2), torch.arange(5)], layout=torch.jagged)
    td = TensorDict({"x": torch.arange(6).view(2, 3).t().contiguous()[:2], "ids": nested}, batch_size=[2])
    back = deserialize_tensordict(serialize_tensordict(td))
    assert back.batch_size == td.batch_size and torch.equal(back["x"], td["x"])
    assert [r.tolist() for r in back["ids"].unbind()] == [[0, 1], [0, 1, 2, 3, 4]]
    assert list_of_dict_to_dict_of_list([{"a": 1, "b": 2}, {"a": 3, "b": 4}]) == {"a": [1, 3], "b": [2, 4]}
    assert list_of_dict_to_dict_of_list([]) == {}
    with pytest.raises(KeyError, match=r"list_of_dict\[1\].*extra \['c'\], missing \['b'\]"):
        list_of_dict_to_dict_of_list([{"a": 1, "b": 2}, {"a": 3, "c": 4}])
    converted = numpy_dict_to_tensor_dict({"a": np.arange(3), "b": np.ones((3, 2))})
    assert converted.batch_size == torch.Size([3]) and converted["b"].shape == (3, 2)


# ---------------------------------------------------------------- McoreEngineConfig, registries, BaseConfig
def test_mcore_engine_config_has_verls_fields_and_validates():
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import McoreEngineConfig

    cfg = McoreEngineConfig()
    assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size, cfg.context_parallel_size) == (1, 1, 1)
    assert cfg.virtual_pipeline_model_parallel_size is None and cfg.use_distributed_optimizer is True
    assert cfg.sequence_parallel is False  # corrected: TP size 1
    assert cfg.override_transformer_config == {} and cfg.strategy == "megatron" and cfg.seed == 42
    built = omega_conf_to_dataclass(
        OmegaConf.create({"tensor_model_parallel_size": 2, "param_offload": True}), McoreEngineConfig
    )
    assert built.sequence_parallel is True and built["param_offload"] is True
    with pytest.raises(
        dataclasses.FrozenInstanceError, match=r"McoreEngineConfig\.tensor_model_parallel_size is frozen"
    ):
        built.tensor_model_parallel_size = 4
    with pytest.raises(ValueError, match=r"megatron.pipeline_model_parallel_size=0 must be an integer >= 1"):
        McoreEngineConfig(pipeline_model_parallel_size=0)
    with pytest.raises(ValueError, match="megatron.dtype='fp8'"):
        McoreEngineConfig(dtype="fp8")


def test_registries_are_plain_dicts_a_fork_can_fill():
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY, get_policy_loss_fn
    from verl.workers.reward_manager import REWARD_MANAGER_REGISTRY as from_package
    from verl.workers.reward_manager.registry import REWARD_MANAGER_REGISTRY, get_reward_manager_cls

    assert type(ADV_ESTIMATOR_REGISTRY) is dict and type(POLICY_LOSS_REGISTRY) is dict
    assert from_package is REWARD_MANAGER_REGISTRY and type(REWARD_MANAGER_REGISTRY) is dict
    assert "grpo" in ADV_ESTIMATOR_REGISTRY and "vanilla" in POLICY_LOSS_REGISTRY

    def my_estimator(token_level_rewards, response_mask, **kwargs):
        return token_level_rewards, token_level_rewards

    def my_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, **kw):
        return log_prob.sum(), {}

    class MyRewardManager:
        pass

    try:
        ADV_ESTIMATOR_REGISTRY["fork_est"] = my_estimator
        POLICY_LOSS_REGISTRY["fork_loss"] = my_loss
        REWARD_MANAGER_REGISTRY["fork_rm"] = MyRewardManager
        assert core_algos.get_adv_estimator_fn("fork_est") is my_estimator
        assert get_policy_loss_fn("fork_loss") is my_loss
        assert get_reward_manager_cls("fork_rm") is MyRewardManager
    finally:
        ADV_ESTIMATOR_REGISTRY.pop("fork_est", None)
        POLICY_LOSS_REGISTRY.pop("fork_loss", None)
        REWARD_MANAGER_REGISTRY.pop("fork_rm", None)
    with pytest.raises(ValueError, match="Unknown advantage estimator simply: fork_est "):
        core_algos.get_adv_estimator_fn("fork_est")


def test_base_config_reads_like_verls_mapping():
    from verl.workers.config import FSDPEngineConfig, RolloutConfig

    cfg = FSDPEngineConfig()
    assert cfg["fsdp_size"] == -1 and cfg.get("fsdp_size") == -1 and cfg.get("missing", 7) == 7
    assert "param_offload" in cfg and "missing" not in cfg and "to_dict" not in cfg
    assert list(cfg)[:2] == ["wrap_policy", "param_offload"] and len(cfg) == len(dataclasses.fields(cfg))
    with pytest.raises(KeyError, match="'missing'"):
        cfg["missing"]
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"FSDPEngineConfig\.param_offload is frozen"):
        cfg.param_offload = True
    rollout = RolloutConfig()
    assert rollout["greedy"] == rollout.greedy and rollout.get("greedy") == rollout.greedy  # properties read too


# ---------------------------------------------------------------- Ray: colocated raw class, parallel_put, pools
def test_create_colocated_worker_raw_cls_builds_a_plain_fused_class(monkeypatch):
    from verl.single_controller.base import ClassWithInitArgs, Worker
    from verl.single_controller.base.decorator import Dispatch, register
    from verl.single_controller.ray import RayClassWithInitArgs, create_colocated_worker_raw_cls

    class Actor(Worker):
        def __init__(self, lr: float) -> None:
            super().__init__()
            self.lr = lr

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def get_lr(self) -> float:
            return self.lr

        def ref_lr(self) -> float:  # not registered: reachable through _fuw_execute only
            return self.fused_worker_dict["ref"].lr

    class Ref(Worker):
        lr = 0.0

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    raw = create_colocated_worker_raw_cls({"actor": RayClassWithInitArgs(Actor, 0.1), "ref": ClassWithInitArgs(Ref)})
    assert not hasattr(raw, "remote") and raw.is_fused_worker and raw.raw_cls_dict == {"actor": Actor, "ref": Ref}
    fused = raw()
    assert isinstance(fused.actor, Actor) and fused.worker_dict["ref"] is fused.ref
    assert fused.actor_get_lr() == 0.1 and fused._fuw_execute("actor_fwmn_ref_lr") == 0.0
    with pytest.raises(ValueError, match="'<role>_fwmn_<method>'"):
        fused._fuw_execute("critic_fwmn_x")


def test_parallel_put_keeps_order(ray_cluster):
    import ray

    from verl.utils.ray_utils import parallel_put, ray_noset_visible_devices

    items = [np.full(1000, i) for i in range(20)]
    refs = parallel_put(items, max_workers=4)
    assert all(isinstance(r, ray.ObjectRef) for r in refs)
    assert [int(a[0]) for a in ray.get(refs)] == list(range(20))
    with pytest.raises(ValueError, match="data_list is empty"):
        parallel_put([])
    assert ray_noset_visible_devices({"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"})
    assert not ray_noset_visible_devices({})


def test_split_and_merge_resource_pools_on_real_ray(ray_cluster):
    import ray

    from verl.single_controller.base import Worker
    from verl.single_controller.base.decorator import Dispatch, register
    from verl.single_controller.ray import (
        RayClassWithInitArgs,
        RayResourcePool,
        RayWorkerGroup,
        SubRayResourcePool,
        merge_resource_pool,
        split_resource_pool,
    )

    class EnvWorker(Worker):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def env(self) -> tuple:
            return tuple(os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))

    class RecordingCls(RayClassWithInitArgs):
        """Remembers the bundle each actor is placed on."""

        bundles: list[int] = []

        def __call__(self, placement_group, placement_group_bundle_idx, **kwargs):
            RecordingCls.bundles.append(placement_group_bundle_idx)
            return super().__call__(placement_group, placement_group_bundle_idx, **kwargs)

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    pool = RayResourcePool([3], use_gpu=False, max_colocate_count=1, name_prefix="fork_split")
    one, two = split_resource_pool(pool, [1, 2])
    assert isinstance(two, SubRayResourcePool) and (one.world_size, two.world_size) == (1, 2)
    assert (one.start_bundle_index, two.start_bundle_index) == (0, 1) and two.pgs == pool.pgs
    assert [b for _, b in two.bundle_slots()] == [1, 2] and two.local_world_size_list() == [2, 2]
    with pytest.raises(ValueError, match="split_size=2 must be a positive divisor"):
        split_resource_pool(pool, 2)
    last = split_resource_pool(two, 1)[1]  # a split of a split: bundle 2 of the pool
    assert last.start_bundle_index == 2 and last.local_rank_list() == [0]
    group = RayWorkerGroup(last, RecordingCls(EnvWorker), name_prefix="fork_split_last")
    try:
        assert RecordingCls.bundles == [2]  # the view's own bundle, not the pool's first
        assert group.env() == [("0", "1", "0", "1")]  # a group of its own: rank 0 of 1
    finally:
        group.shutdown()
    other = RayResourcePool([1], use_gpu=False, max_colocate_count=1, name_prefix="fork_other")
    merged = merge_resource_pool(one, other)
    try:
        assert merged.world_size == 2 and merged.store == [1, 1]
        assert merged.bundle_slots() == [(pool.pgs[0], 0), (other.pgs[0], 0)]
        merged.release()  # a view: the pools keep their placement groups
        assert pool.pgs is not None and other.pgs is not None
        with pytest.raises(ValueError, match="differ in use_gpu"):
            merge_resource_pool(pool, RayResourcePool([1], use_gpu=True))
    finally:
        other.release()
        pool.release()
