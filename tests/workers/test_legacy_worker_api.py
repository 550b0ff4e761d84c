"""veRL's legacy worker API, as research recipes (SPPO, SPIN, PRIME) use it: a recipe's ``init_model`` override
builds the models with ``_build_model_optimizer`` / ``_build_rollout``, wraps them in its own actor subclass, and
our worker's methods then drive it. Plus the helper modules those recipes import (fsdp_utils, flops_counter,
ulysses, the Ulysses sharding manager, monkey_patch, schedules)."""

from __future__ import annotations

import logging
import sys

import pytest
import ray
import torch
from omegaconf import OmegaConf, open_dict

from tests.workers.test_fsdp_workers import PROMPTS, RESPONSE_LEN, N, arr_config, generate, prompts
from verl.protocol import DataProto
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
from verl.utils.device import get_device_id, get_device_name
from verl.utils.flops_counter import FlopsCounter, dense_decoder_flops
from verl.utils.fsdp_utils import (
    fsdp_version,
    load_fsdp_model_to_gpu,
    load_fsdp_optimizer,
    offload_fsdp_model_to_cpu,
    offload_fsdp_optimizer,
)
from verl.utils.py_functional import append_to_dict
from verl.workers.actor.dp_actor import DataParallelPPOActor, ForwardOutputs, resolve_actor_config
from verl.workers.config.actor import ActorConfig, RefConfig
from verl.workers.fsdp_workers import ActorRolloutRefWorker, AsyncActorRolloutRefWorker

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ---------------------------------------------------------------------------------------------------- a recipe
class SequenceRatioActor(DataParallelPPOActor):
    """An SPPO-style actor (recipe/sppo/dp_actor.py's shape): squared error between the sequence log-ratio and a
    per-sequence target, stepped with the legacy internals."""

    def update_policy(self, data: DataProto) -> dict:
        self.actor_module.train()
        temperature = data.meta_info["temperature"]
        keys = ["responses", "input_ids", "attention_mask", "position_ids", "old_log_probs", "seq_level_rewards"]
        batch = data.select(batch_keys=keys).batch
        metrics: dict = {}
        for _ in range(self.config.ppo_epochs):
            for mini_batch in batch.split(self.config.ppo_mini_batch_size):
                micro_size = self.config.ppo_micro_batch_size_per_gpu
                self.gradient_accumulation = self.config.ppo_mini_batch_size // micro_size
                self.actor_optimizer.zero_grad()
                for micro in mini_batch.split(micro_size):
                    micro = micro.to(get_device_id())  # as the recipes write it: "cpu" on CPU

                    entropy, log_prob = self._forward_micro_batch(
                        micro_batch=micro, temperature=temperature, calculate_entropy=False
                    )
                    assert entropy is None
                    mask = micro["attention_mask"][:, -micro["responses"].size(1) :]
                    ratio = ((log_prob - micro["old_log_probs"]) * mask).sum(-1)
                    loss = ((ratio - micro["seq_level_rewards"]) ** 2).mean() / self.gradient_accumulation
                    loss.backward()
                    append_to_dict(metrics, {"actor/loss": loss.item(), "actor/micro_rows": len(micro)})
                grad_norm = self._optimizer_step()
                append_to_dict(metrics, {"actor/grad_norm": grad_norm.item(), "actor/mini_rows": len(mini_batch)})
        self.actor_optimizer.zero_grad()
        return metrics


class RecipeWorker(ActorRolloutRefWorker):
    """``init_model`` as recipe/sppo/sppo_worker.py writes it, line for line where it can be."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        override_model_config = OmegaConf.to_container(OmegaConf.create(self.config.model.get("override_config", {})))
        use_remove_padding = self.config.model.get("use_remove_padding", False)
        use_fused_kernels = self.config.model.get("use_fused_kernels", False)
        if self._is_actor or self._is_rollout:
            optim_config = self.config.actor.optim if self._is_actor else None
            fsdp_config = self.config.actor.fsdp_config if self._is_actor else OmegaConf.create()
            self.actor_module_fsdp, self.actor_optimizer, self.actor_lr_scheduler, self.actor_model_config = (
                self._build_model_optimizer(
                    model_path=self.config.model.path,
                    fsdp_config=fsdp_config,
                    optim_config=optim_config,
                    override_model_config=override_model_config,
                    use_remove_padding=use_remove_padding,
                    use_fused_kernels=use_fused_kernels,
                    enable_gradient_checkpointing=self.config.model.get("enable_gradient_checkpointing", False),
                    trust_remote_code=self.config.model.get("trust_remote_code", False),
                    use_liger=self.config.model.get("use_liger", False),
                    role="actor",
                )
            )
            self.actor_module = self.actor_module_fsdp._fsdp_wrapped_module
            if self._is_offload_param:
                offload_fsdp_model_to_cpu(self.actor_module_fsdp)
            if self._is_offload_optimizer:
                offload_fsdp_optimizer(optimizer=self.actor_optimizer)
        if self._is_actor:
            OmegaConf.set_struct(self.config.actor, True)
            with open_dict(self.config.actor):
                self.config.actor.use_remove_padding = use_remove_padding
                self.config.actor.use_fused_kernels = use_fused_kernels
            self.actor = SequenceRatioActor(
                config=self.config.actor, actor_module=self.actor_module_fsdp, actor_optimizer=self.actor_optimizer
            )
        if self._is_rollout:
            self._build_rollout(trust_remote_code=self.config.model.get("trust_remote_code", False))
        if self._is_ref:
            self.ref_module_fsdp = self._build_model_optimizer(
                model_path=self.config.model.path,
                fsdp_config=self.config.ref.fsdp_config,
                optim_config=None,
                override_model_config=override_model_config,
                use_remove_padding=use_remove_padding,
                use_fused_kernels=use_fused_kernels,
                trust_remote_code=self.config.model.get("trust_remote_code", False),
                use_liger=self.config.model.get("use_liger", False),
                role="ref",
            )[0]
            OmegaConf.set_struct(self.config.ref, True)
            with open_dict(self.config.ref):
                self.config.ref.use_remove_padding = use_remove_padding
                self.config.ref.use_fused_kernels = use_fused_kernels
            self.ref_policy = SequenceRatioActor(config=self.config.ref, actor_module=self.ref_module_fsdp)
        if self._is_actor:
            self.flops_counter = FlopsCounter(self.actor_model_config)
            self.checkpoint_manager = FSDPCheckpointManager(
                model=self.actor_module_fsdp,
                optimizer=self.actor.actor_optimizer,
                lr_scheduler=self.actor_lr_scheduler,
                processing_class=self.processor if self.processor is not None else self.tokenizer,
                checkpoint_config=self.config.actor.checkpoint,
            )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def legacy_facts(self) -> dict:
        with self.ulysses_sharding_manager:
            pass
        return {
            "raw_mini": self.config.actor.ppo_mini_batch_size,
            "actor_mini": self.actor.config.ppo_mini_batch_size_per_rank,
            "ref_config": type(self.ref_policy.config).__name__,
            "same_engine": self.actor.engine is self.actor_engine and self.ref_policy.engine is self.ref_engine,
            "unwrapped": self.actor_module is self.actor_engine.module,
            "offload": (self._is_offload_param, self._is_offload_optimizer),
            "flops": self.flops_counter.estimate_flops([10, 20], 1.0)[0] > 0,
            "world_size": self.world_size,
        }


@pytest.fixture(scope="module")
def recipe_group(ray_cluster, tiny_model_dir):
    pool = RayResourcePool([2], use_gpu=False, max_colocate_count=1)
    config = arr_config(tiny_model_dir)
    config.actor.fsdp_config.param_offload = True  # the recipe's offload calls run (a logged no-op on CPU)
    config.actor.checkpoint = {"save_contents": ["model", "optimizer", "extra"]}  # in every full veRL config
    cls = RayClassWithInitArgs(ray.remote(RecipeWorker), config=config, role="actor_rollout_ref")
    wg = RayWorkerGroup(pool, cls, name_prefix="legacy_recipe")
    wg.set_weight_sync_verification(True)
    wg.init_model()
    yield wg
    wg.shutdown()
    pool.release()


def test_a_recipe_init_model_drives_our_worker_methods(recipe_group, tmp_path):
    facts = recipe_group.legacy_facts()[0]
    # veRL's normalisation: 4 prompts × n=2 ÷ 2 ranks = 4 samples per rank, in the key the recipe's actor reads
    assert facts["raw_mini"] == facts["actor_mini"] == PROMPTS * N // 2
    assert facts["ref_config"] == "RefConfig" and facts["same_engine"] and facts["unwrapped"]
    assert facts["offload"] == (True, False) and facts["flops"] and facts["world_size"] == 2

    batch = generate(recipe_group, prompts())
    assert batch.batch["responses"].shape == (PROMPTS * N, RESPONSE_LEN)
    batch = batch.union(recipe_group.compute_log_prob(batch))
    old = batch.batch["old_log_probs"]
    mask = batch.batch["response_mask"]
    ref = recipe_group.compute_ref_log_prob(batch).batch["ref_log_prob"]
    torch.testing.assert_close(ref * mask, old * mask, rtol=0, atol=1e-6)  # same weights before any update

    recipe_group.save_checkpoint(str(tmp_path / "actor"))
    batch.batch["seq_level_rewards"] = torch.linspace(-1.0, 1.0, len(batch))
    metrics = recipe_group.update_actor(batch).meta_info["metrics"]
    assert metrics["actor/mini_rows"] == [4, 4] and metrics["actor/micro_rows"] == [2, 2, 2, 2]
    assert all(g > 0 for g in metrics["actor/grad_norm"]) and "actor/lr" in metrics
    after = recipe_group.compute_log_prob(batch).batch["old_log_probs"]
    assert ((after - old) * mask).abs().max() > 1e-3  # the recipe's update_policy moved the policy

    recipe_group.load_checkpoint(str(tmp_path / "actor"))
    torch.testing.assert_close(recipe_group.compute_log_prob(batch).batch["old_log_probs"], old, rtol=0, atol=0)
    recipe_group.update_weights()  # verified push of the restored weights
    again = generate(recipe_group, prompts())
    torch.testing.assert_close(again.batch["rollout_log_probs"], batch.batch["rollout_log_probs"], rtol=0, atol=0)


def test_async_worker_is_veRLs_name_for_ours():
    assert issubclass(AsyncActorRolloutRefWorker, ActorRolloutRefWorker)


# ---------------------------------------------------------------------------------------------------- units
def test_ulysses_is_the_identity_at_size_one_and_refuses_more():
    from verl.utils import ulysses
    from verl.workers.sharding_manager.fsdp_ulysses import FSDPUlyssesShardingManager

    x = torch.arange(12.0).reshape(1, 12)
    pos = torch.arange(12).reshape(1, 12)
    ids, positions, pad = ulysses.ulysses_pad_and_slice_inputs(x, pos, sp_size=1)
    assert ids is x and positions is pos and pad == 0
    assert ulysses.gather_outputs_and_unpad(x, gather_dim=1, unpad_dim=1, padding_size=0) is x
    assert ulysses.get_ulysses_sequence_parallel_world_size() == 1 and ulysses.get_ulysses_sequence_parallel_rank() == 0
    assert ulysses.get_ulysses_sequence_parallel_group() is None
    with pytest.raises(NotImplementedError, match="ulysses_sequence_parallel_size=2"):
        ulysses.ulysses_pad_and_slice_inputs(x, pos, sp_size=2)
    with pytest.raises(NotImplementedError, match="ulysses_sequence_parallel_size=4"):
        ulysses.validate_ulysses_config(8, 4)
    data = DataProto.from_dict({"x": x})
    with FSDPUlyssesShardingManager(None) as manager:
        assert manager.preprocess_data(data) is data and manager.postprocess_data(data) is data


def test_apply_monkey_patch_accepts_size_one_and_refuses_by_name(caplog):
    from verl.models.transformers.monkey_patch import apply_monkey_patch
    from verl.utils.tiny_model import build_tiny_qwen2

    model = build_tiny_qwen2()
    with caplog.at_level(logging.INFO, logger="verl.models.transformers.monkey_patch"):
        apply_monkey_patch(model, ulysses_sp_size=1, use_remove_padding=True)
    assert "nothing to patch" in caplog.text
    with pytest.raises(NotImplementedError, match="ulysses_sequence_parallel_size=2"):
        apply_monkey_patch(model, ulysses_sp_size=2)
    with pytest.raises(NotImplementedError, match="use_fused_kernels"):
        apply_monkey_patch(model, use_fused_kernels=True)


def test_flops_counter_hand_count_on_a_tiny_qwen2(monkeypatch):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    monkeypatch.delenv("VERL_PEAK_TFLOPS", raising=False)
    config = Qwen2Config(
        hidden_size=8,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=16,
        num_hidden_layers=2,
        vocab_size=32,
        tie_word_embeddings=False,
    )
    # By hand: per layer q 8·8 + k 8·4 + v 8·4 + o 8·8 = 192 and MLP 3·8·16 = 384; 2 layers + embedding and head
    # 2·32·8 = 512 → N = 1664 matmul weights. Sequences of 3 and 5 tokens: 6·1664·8 = 79872, attention
    # 12 · 2 layers · 2 heads · 4 dims · (9 + 25) = 6528 → 86400 FLOPs.
    assert dense_decoder_flops(config, [3, 5]) == 86400
    weights = sum(p.numel() for n, p in Qwen2ForCausalLM(config).named_parameters() if p.dim() == 2)
    assert weights == 1664  # the count's N is the real model's matrices
    achieved, promised = FlopsCounter(config).estimate_flops([3, 5], 0.5)
    assert achieved == pytest.approx(86400 / 0.5 / 1e12, rel=1e-12) and promised == 0.448  # CPU's stated figure
    config.model_type = "gpt2"
    assert FlopsCounter(config).estimate_flops([3, 5], 0.5)[0] == 0.0


def test_offload_helpers_round_trip_a_module_and_optimizer_state():
    from verl.utils.tiny_model import build_tiny_qwen2

    model = build_tiny_qwen2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.tensor([[3, 4, 5]])).logits.sum().backward()
    optimizer.step()
    before = {k: v.clone() for k, v in optimizer.state_dict()["state"][0].items()}
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    offload_fsdp_model_to_cpu(model)
    offload_fsdp_optimizer(optimizer)
    load_fsdp_model_to_gpu(model)
    load_fsdp_optimizer(optimizer, device_id=0)
    device = torch.device(get_device_name()).type
    assert all(p.device.type == device for p in model.parameters())
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    after = optimizer.state_dict()["state"][0]
    assert all(torch.equal(after[k].cpu(), v.cpu()) for k, v in before.items())
    assert fsdp_version(model) == 0


def test_forward_outputs_read_as_a_tuple_and_by_key():
    log_probs, entropy = torch.zeros(2, 3), torch.ones(2, 3)
    out = ForwardOutputs({"log_probs": log_probs, "entropys": entropy})
    got_entropy, got_log_probs = out
    assert got_entropy is entropy and got_log_probs is log_probs
    assert out["log_probs"] is log_probs and "entropys" in out and out.get("sum_pi_squared") is None
    assert ForwardOutputs({"log_probs": log_probs})[0] is None


def test_resolve_actor_config_takes_veRLs_ref_section_and_refuses_fused_kernels():
    ref = resolve_actor_config({"log_prob_micro_batch_size_per_gpu": 4, "use_remove_padding": False})
    assert isinstance(ref, RefConfig)
    actor = resolve_actor_config({"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 2})
    assert isinstance(actor, ActorConfig) and actor.ppo_mini_batch_size_per_rank == 4
    with pytest.raises(NotImplementedError, match="use_fused_kernels"):
        resolve_actor_config({"use_fused_kernels": True})


def test_lr_schedules_and_model_size(caplog):
    from verl.utils.model import print_model_size
    from verl.utils.torch_functional import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=1.0)
    constant = get_constant_schedule_with_warmup(optimizer, num_warmup_steps=4)
    lrs = []
    for _ in range(6):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        constant.step()
    assert lrs == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    optimizer = torch.optim.SGD([param], lr=1.0)
    cosine = get_cosine_schedule_with_warmup(optimizer, 2, 6, min_lr_ratio=0.1, init_lr_ratio=0.5)
    lrs = []
    for _ in range(7):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        cosine.step()
    # warmup 0.5 → 1 over 2 steps, then 0.1 + 0.9·(1 + cos(π·k/4))/2 for k = 0..4
    assert lrs == pytest.approx([0.5, 0.75, 1.0, 0.1 + 0.9 * 0.8535534, 0.55, 0.1 + 0.9 * 0.1464466, 0.1], abs=1e-6)
    with caplog.at_level(logging.INFO, logger="verl.utils.model"):
        print_model_size(torch.nn.Linear(1000, 1000), name="lin")
    assert "lin contains 1.00M parameters" in caplog.text
