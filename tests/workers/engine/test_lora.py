"""LoRA on the FSDP engine (peft on FSDP2, real 2-rank gloo group, tiny Qwen2, float32).

One spawned 2-rank run trains a LoRA actor and a LoRA value model and records what it saw; the tests compare it with
a single-process peft reference built here: the adapters alone move, the step equals the reference's, the base model
comes back with the adapters disabled, the merged export and the saved adapter folder give the trained policy's
logits, and a checkpoint resumes exactly.
"""

from __future__ import annotations

import os

import pytest
import torch

from verl.utils.tiny_model import save_tiny_qwen2
from verl.workers.config.engine import FSDPEngineConfig
from verl.workers.config.optimizer import FSDPOptimizerConfig
from verl.workers.engine import FSDPEngine
from verl.workers.engine.hf_model import load_hf_model
from verl.workers.engine.lora import (
    ADAPTER_FOLDER,
    LoraSpec,
    apply_lora,
    is_adapter_name,
    merge_lora_stream,
    sync_name,
)

WORLD = 2
LR = 1e-2  # large, so one step moves the adapters visibly
SPEC = LoraSpec(rank=4, alpha=8, target_modules="all-linear")
# AdamW moves each adapter weight by ~lr = 1e-2 at step 1, whatever its gradient; float32 reordering of the sums over
# ranks changes elements whose gradient is near 0 by up to ~5e-6.
STEP_TOL = 2e-5


def _batch() -> torch.Tensor:
    return torch.randint(3, 256, (4, 12), generator=torch.Generator().manual_seed(7))


def _lm_loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids).logits.float()
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def _engine(model_dir: str, spec: LoraSpec = SPEC, role: str = "actor") -> FSDPEngine:
    return FSDPEngine(
        model_dir,
        FSDPEngineConfig(dtype="float32", plain_single_rank=False),
        FSDPOptimizerConfig(lr=LR, weight_decay=0.0),
        role=role,
        lora=spec,
    )


def _nudge_adapters(model: torch.nn.Module) -> None:
    """Give every lora_B a non-zero value (B = 0 at init makes the adapter an identity), the same on every rank."""
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                full = torch.randn(p.shape, generator=gen) * 0.05
                if hasattr(p, "full_tensor"):
                    from torch.distributed.tensor import distribute_tensor

                    full = distribute_tensor(full, p.device_mesh, p.placements)
                p.copy_(full)


def _two_rank_run(rank: int, model_dir: str, out: str) -> None:
    ids = _batch().chunk(WORLD)[rank]
    r: dict = {}
    engine = _engine(model_dir)
    _nudge_adapters(engine.module)
    r["trainable"] = sorted(n for n, p in engine.module.named_parameters() if p.requires_grad)
    r["sync_names"] = [name for name, _ in engine.iter_full_state_dict()]
    r["adapter_names"] = [name for name, _ in engine.iter_full_state_dict(adapters_only=True)]
    r["before"] = {n: t.clone() for n, t in engine.iter_full_state_dict()}
    _lm_loss(engine.module, ids).backward()  # FSDP2 averages the ranks' gradients
    r["grad_norm"] = engine.clip_grad_norm_and_step()
    r["after"] = {n: t.clone() for n, t in engine.iter_full_state_dict()}
    r["hf"] = engine.get_full_state_dict()
    full = _batch()
    with engine.eval_mode():
        r["lora_logits"] = engine.module(input_ids=full).logits
        with engine.adapters_disabled():
            r["base_logits"] = engine.module(input_ids=full).logits
    ckpt = os.path.join(out, "ckpt")
    engine.save_checkpoint(ckpt, hf_weights=True)
    # a new engine started from the saved adapter folder (model.lora_adapter_path) is the trained policy
    saved = LoraSpec(rank=SPEC.rank, alpha=SPEC.alpha, adapter_path=os.path.join(ckpt, ADAPTER_FOLDER))
    started = _engine(model_dir, saved)
    with started.eval_mode():
        r["from_adapter_logits"] = started.module(input_ids=full).logits
    r["from_adapter_trainable"] = sum(p.requires_grad for p in started.module.parameters())
    _lm_loss(engine.module, ids).backward()  # FSDP2 averages the ranks' gradients
    engine.clip_grad_norm_and_step()
    r["step2"] = {n: t.clone() for n, t in engine.iter_full_state_dict(adapters_only=True)}
    engine.load_checkpoint(ckpt)
    _lm_loss(engine.module, ids).backward()  # FSDP2 averages the ranks' gradients
    engine.clip_grad_norm_and_step()
    r["step2_resumed"] = {n: t.clone() for n, t in engine.iter_full_state_dict(adapters_only=True)}
    other = _engine(model_dir, LoraSpec(rank=2, alpha=8))
    try:
        other.load_checkpoint(ckpt)
        r["mismatch_error"] = None
    except ValueError as e:
        r["mismatch_error"] = str(e)

    critic = _engine(model_dir, role="critic")
    r["critic_trainable"] = sorted(n for n, p in critic.module.named_parameters() if p.requires_grad)
    values = critic.module(input_ids=ids).logits
    values.float().pow(2).mean().backward()
    critic.clip_grad_norm_and_step()
    r["critic_names"] = [name for name, _ in critic.iter_full_state_dict()]
    r["critic_hf"] = critic.get_full_state_dict()
    if rank == 0:
        torch.save(r, os.path.join(out, "records.pt"))


@pytest.fixture(scope="module")
def lora_run(gloo, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_engine")
    model_dir = save_tiny_qwen2(root / "model")
    gloo(_two_rank_run, WORLD, str(model_dir), str(root))
    return str(model_dir), str(root), torch.load(os.path.join(root, "records.pt"), weights_only=False)


def _reference(model_dir: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The same LoRA step in one process, plain peft: the model after it and its sync-named state before it."""
    base = load_hf_model(model_dir, value_model=False, dtype=torch.float32, seed=0)
    model = apply_lora(base, SPEC, seed=FSDPEngineConfig().seed)
    _nudge_adapters(model)
    before = {sync_name(k): v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=0.0)
    _lm_loss(model, _batch()).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return model, before


def test_only_the_adapters_train_and_the_step_matches_one_process(lora_run):
    model_dir, _, r = lora_run
    assert r["trainable"] and all("lora_A" in n or "lora_B" in n for n in r["trainable"])
    assert set(r["adapter_names"]) == {n for n in r["sync_names"] if is_adapter_name(n)}
    assert len(r["adapter_names"]) == 2 * 14  # q k v o gate up down in 2 layers, A and B each
    assert "model.layers.0.self_attn.q_proj.weight" in r["sync_names"]  # base weights under their HF names
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in r["adapter_names"]
    for name in r["sync_names"]:
        moved = not torch.equal(r["before"][name], r["after"][name])
        assert moved == is_adapter_name(name), name
    model, before = _reference(model_dir)
    assert all(torch.equal(before[n], r["before"][n]) for n in r["sync_names"])
    after = {sync_name(k): v for k, v in model.state_dict().items()}
    for name in r["adapter_names"]:
        torch.testing.assert_close(r["after"][name], after[name], rtol=0, atol=STEP_TOL)


def test_adapters_disabled_is_the_base_model_and_the_export_is_merged(lora_run):
    model_dir, _, r = lora_run
    base = load_hf_model(model_dir, value_model=False, dtype=torch.float32, seed=0)
    with torch.no_grad():
        base_logits = base(input_ids=_batch()).logits
    assert torch.equal(r["base_logits"], base_logits)
    assert not torch.allclose(r["lora_logits"], base_logits, atol=1e-3)
    assert not any("lora" in n or "base_layer" in n for n in r["hf"])
    assert list(r["hf"]) == list(base.state_dict())
    base.load_state_dict(r["hf"])
    with torch.no_grad():
        merged_logits = base(input_ids=_batch()).logits
    torch.testing.assert_close(merged_logits, r["lora_logits"], rtol=0, atol=1e-5)


def test_checkpoint_resumes_exactly_and_holds_the_adapter_folder(lora_run):
    model_dir, root, r = lora_run
    for name, tensor in r["step2"].items():
        assert torch.equal(tensor, r["step2_resumed"][name]), name
    assert "LoRA" in r["mismatch_error"] and "'rank': 2" in r["mismatch_error"]
    from peft import PeftModel

    folder = os.path.join(root, "ckpt", ADAPTER_FOLDER)
    base = load_hf_model(model_dir, value_model=False, dtype=torch.float32, seed=0)
    peft_model = PeftModel.from_pretrained(base, folder)
    with torch.no_grad():
        logits = peft_model(input_ids=_batch()).logits
    torch.testing.assert_close(logits, r["lora_logits"], rtol=0, atol=1e-6)
    # the checkpoint's huggingface folder holds the merged weights
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(os.path.join(root, "ckpt", "huggingface"), dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=_batch()).logits, r["lora_logits"], rtol=0, atol=1e-5)


def test_lora_adapter_path_starts_from_the_saved_adapter(lora_run, tmp_path):
    from omegaconf import OmegaConf

    from verl.trainer.config.validate_lora import check_lora

    _, root, r = lora_run
    torch.testing.assert_close(r["from_adapter_logits"], r["lora_logits"], rtol=0, atol=1e-6)
    assert r["from_adapter_trainable"] == len(r["trainable"])  # loaded trainable, not frozen
    folder = os.path.join(root, "ckpt", ADAPTER_FOLDER)

    def problems(rank: int, path: str) -> list[str]:
        found: list[str] = []
        config = {"actor_rollout_ref": {"model": {"lora_rank": rank, "lora_adapter_path": path}}}
        check_lora(OmegaConf.create(config), found, check_environment=True)
        return found

    assert problems(4, folder) == []
    assert "holds a rank-4 adapter, but actor_rollout_ref.model.lora_rank=8" in problems(8, folder)[0]
    assert "adapter_config.json does not exist" in problems(4, str(tmp_path))[0]
    assert "needs actor_rollout_ref.model.lora_rank > 0" in problems(0, folder)[0]


def test_ref_engine_keys_warn_with_lora(caplog):
    from tests.trainer.config.test_validate import VALID
    from verl.trainer.config.validate import merged, validate_config

    ref_key = "actor_rollout_ref.ref.fsdp_config.param_offload=true"
    with caplog.at_level("WARNING", logger="verl.trainer.config.validate_lora"):
        validate_config(merged([*VALID, "actor_rollout_ref.model.lora_rank=8", ref_key]), check_environment=False)
    assert "ref.fsdp_config.{param_offload} has no effect with model.lora_rank > 0" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="verl.trainer.config.validate_lora"):
        validate_config(merged([*VALID, ref_key]), check_environment=False)
    assert "has no effect with model.lora_rank" not in caplog.text


def test_a_lora_critic_trains_its_head_and_adapters(lora_run):
    _, _, r = lora_run
    heads = [n for n in r["critic_trainable"] if "lora_" not in n]
    assert heads == ["base_model.model.score.modules_to_save.default.bias"] or all("score" in n for n in heads)
    assert heads and any("lora_A" in n for n in r["critic_trainable"])
    assert "score.weight" in r["critic_names"] and not any("original_module" in n for n in r["critic_names"])
    assert "score.weight" in r["critic_hf"] and not any("lora" in n for n in r["critic_hf"])


def test_merge_stream_names_a_missing_part():
    stream = [("model.q.weight", torch.ones(2, 2)), ("base_model.model.model.q.lora_A.weight", torch.ones(1, 2))]
    with pytest.raises(ValueError, match="lack a part"):
        list(merge_lora_stream(stream, {"model.q"}, 2.0))


def test_spec_from_config_refuses_bad_values():
    assert LoraSpec.from_config({"lora_rank": 0}) is None
    spec = LoraSpec.from_config({"lora_rank": 8, "lora_alpha": 32, "target_modules": ["q_proj", "v_proj"]})
    assert spec.scaling == 4.0 and spec.target_modules == ["q_proj", "v_proj"]
    with pytest.raises(ValueError, match="critic.model.lora_alpha"):
        LoraSpec.from_config({"lora_rank": 8, "lora_alpha": 0}, key="critic.model")
    with pytest.raises(ValueError, match="target_modules is empty"):
        LoraSpec.from_config({"lora_rank": 8, "target_modules": []})


def test_model_merger_cli_merges_the_adapters(lora_run, tmp_path):
    """``python -m verl.model_merger merge`` on the LoRA checkpoint: a plain Hugging Face folder whose logits are the
    trained policy's; without the adapter folder it names the missing file."""
    import shutil
    import subprocess
    import sys

    from transformers import AutoModelForCausalLM

    _, root, r = lora_run
    ckpt, target = os.path.join(root, "ckpt"), str(tmp_path / "merged")
    argv = [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", ckpt]
    proc = subprocess.run([*argv, "--target_dir", target], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    merged = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    assert not any("lora" in name for name in merged.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=_batch()).logits, r["lora_logits"], rtol=0, atol=1e-5)
    broken = str(tmp_path / "broken")
    shutil.copytree(ckpt, broken, ignore=shutil.ignore_patterns(ADAPTER_FOLDER))
    proc = subprocess.run(
        [*argv[:-1], broken, "--target_dir", str(tmp_path / "x")], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0 and "lora_adapter/adapter_config.json" in proc.stdout + proc.stderr


def test_a_lora_actor_with_the_sglang_rollout_is_refused():
    from tests.trainer.config.test_validate import VALID
    from verl.trainer.config.validate import merged, validate_config

    config = merged([*VALID, "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.rollout.name=sglang"])
    with pytest.raises(ValueError, match=r"lora_rank=8 with actor_rollout_ref.rollout.name='sglang'"):
        validate_config(config, check_environment=False)
