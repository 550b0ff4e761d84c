"""``python -m verl.model_merger`` on real checkpoints of a 2-rank gloo FSDPEngine run (tiny Qwen2, float32).

One spawned run (the ``trained`` fixture) trains an actor, a tied-embedding actor and a critic for one step, records
their outputs on a fixed batch and saves their DCP checkpoints plus HF folders of their full state dicts. The
checkpoints are used as ``FSDPEngine.save_checkpoint`` wrote them: their ``huggingface/`` folders (config, and the
actor's tokenizer) are the engine's, nothing is added afterwards. The tests merge those checkpoints in this process
(no process group) or in a subprocess and compare with the trainer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from verl.model_merger import merge_fsdp_checkpoint, save_hf_model
from verl.model_merger.__main__ import main
from verl.utils.tiny_model import save_tiny_qwen2
from verl.workers.config.engine import FSDPEngineConfig
from verl.workers.config.optimizer import FSDPOptimizerConfig
from verl.workers.engine import FSDPEngine

WORLD = 2
RUNS = (("actor", "actor"), ("tied", "actor"), ("critic", "critic"))  # (checkpoint name, engine role)


def _batch() -> torch.Tensor:
    return torch.randint(3, 256, (4, 12), generator=torch.Generator().manual_seed(7))


def _train_and_save(rank: int, out: str, model_dirs: dict[str, str], tokenizer_dir: str) -> None:
    """Per run: one AdamW step on this rank's half of the batch, the no-grad outputs on the whole batch (every rank
    runs the forward), a DCP checkpoint (the actor's with the tokenizer of ``tokenizer_dir``), and (rank 0) a HF
    folder written by save_hf_model from the full state."""
    ids = _batch()
    records: dict[str, torch.Tensor] = {}
    for name, role in RUNS:
        optim = FSDPOptimizerConfig(lr=1e-2, lr_scheduler_type="constant")
        engine = FSDPEngine(model_dirs[name], FSDPEngineConfig(dtype="float32"), optim, role=role)
        out_logits = engine.module(input_ids=ids.chunk(WORLD)[rank]).logits.float()
        if role == "critic":
            loss = out_logits.pow(2).mean()
        else:
            targets = ids.chunk(WORLD)[rank][:, 1:].reshape(-1)
            loss = torch.nn.functional.cross_entropy(out_logits[:, :-1].reshape(-1, out_logits.shape[-1]), targets)
        loss.backward()
        engine.clip_grad_norm_and_step()
        with engine.eval_mode():
            records[name] = engine.module(input_ids=ids).logits.clone()
        engine.save_checkpoint(os.path.join(out, name), tokenizer_path=tokenizer_dir if name == "actor" else None)
        full_state = engine.get_full_state_dict()
        if rank == 0:
            save_hf_model(
                full_state, model_dirs[name], os.path.join(out, f"{name}_ref_hf"), is_value_model=role == "critic"
            )
        del engine
    if rank == 0:
        torch.save(records, os.path.join(out, "records.pt"))


def _save_tokenizer(folder: str) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, **{f"w{i}": i for i in range(3, 256)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>").save_pretrained(folder)


@pytest.fixture(scope="module")
def trained(gloo, tiny_model_dir, tmp_path_factory) -> dict:
    out = str(tmp_path_factory.mktemp("model_merger"))
    tied_dir = save_tiny_qwen2(os.path.join(out, "tied_qwen2"), seed=1, tie_word_embeddings=True)
    model_dirs = {"actor": tiny_model_dir, "tied": tied_dir, "critic": tiny_model_dir}
    tokenizer_dir = os.path.join(out, "tokenizer")  # the tokenizer the actor's checkpoint is saved with
    _save_tokenizer(tokenizer_dir)
    gloo(_train_and_save, WORLD, out, model_dirs, tokenizer_dir)
    records = torch.load(os.path.join(out, "records.pt"))
    return {"out": out, "model_dirs": model_dirs, "records": records}


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(
        [sys.executable, "-m", "verl.model_merger", *args], capture_output=True, text=True, env=env, timeout=120
    )


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape and a.dtype == b.dtype
    return (a.double() - b.double()).abs().max().item()


def _config_json(folder: str) -> dict:
    with open(os.path.join(folder, "config.json")) as f:
        return json.load(f)


# The fields of config.json that define the model (its parameters' names and shapes, its special tokens).
MODEL_FIELDS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_parameters",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)


def _model_fields(config: dict) -> dict:
    return {key: config.get(key) for key in MODEL_FIELDS}


# ----------------------------------------------------------------------------- who writes the config
def test_checkpoint_holds_the_hf_folder_the_engine_wrote(trained):
    from transformers import AutoTokenizer

    out = trained["out"]
    for name, role in RUNS:
        hf_dir = os.path.join(out, name, "huggingface")
        saved, model = _config_json(hf_dir), _config_json(trained["model_dirs"][name])
        assert _model_fields(saved) == _model_fields(model), name
        assert len(saved.get("id2label", {0: 0, 1: 1})) == (1 if role == "critic" else 2), name  # num_labels
    assert _config_json(os.path.join(out, "tied", "huggingface"))["tie_word_embeddings"] is True
    # save_checkpoint(tokenizer_path=...) put the actor's tokenizer next to its config
    assert AutoTokenizer.from_pretrained(os.path.join(out, "actor", "huggingface")).convert_tokens_to_ids("w42") == 42


@pytest.mark.parametrize("name, role", RUNS, ids=[name for name, _ in RUNS])
def test_merger_writes_the_models_config(trained, tmp_path, name, role):
    target = str(tmp_path / "merged")
    merge_fsdp_checkpoint(os.path.join(trained["out"], name), target, is_value_model=role == "critic")
    assert os.path.isfile(os.path.join(target, "config.json")), "the merger wrote no config.json"
    written = _config_json(target)
    assert _model_fields(written) == _model_fields(_config_json(trained["model_dirs"][name]))
    # the class of the model it wrote (the checkpoint's own config still names the causal LM for the critic) ...
    kind = "Qwen2ForTokenClassification" if role == "critic" else "Qwen2ForCausalLM"
    assert written["architectures"] == [kind]
    assert len(written.get("id2label", {0: 0, 1: 1})) == (1 if role == "critic" else 2)
    # ... and the dtype of the weights it wrote (float32 here: see test_dtype_option_casts for a cast)
    assert written["dtype"] == "float32"


# ----------------------------------------------------------------------------- merging
def test_merge_cli_gives_the_trainers_logits(trained, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, target = trained["out"], str(tmp_path / "actor_hf")
    args = ["merge", "--backend", "fsdp", "--local_dir", os.path.join(out, "actor"), "--target_dir", target]
    result = _cli(*args, "--use_cpu_initialization")  # config and tokenizer from the checkpoint's huggingface/
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines() == [f"merged {os.path.join(out, 'actor')} into {target}"]
    assert os.path.isfile(os.path.join(target, "model.safetensors"))
    assert AutoTokenizer.from_pretrained(target).convert_tokens_to_ids("w42") == 42  # the tokenizer came along

    model = AutoModelForCausalLM.from_pretrained(target)
    assert model.dtype == torch.float32 and model.config.dtype == torch.float32
    initial = AutoModelForCausalLM.from_pretrained(trained["model_dirs"]["actor"])
    assert not torch.equal(model.lm_head.weight, initial.lm_head.weight)  # the trained weights, not the initial
    with torch.no_grad():
        logits = model(input_ids=_batch()).logits
    # Observed: bitwise equal (the same float32 weights and kernels, unsharded).
    assert _max_diff(logits, trained["records"]["actor"]) == 0.0


def test_merge_tied_embeddings_with_default_config_folder(trained, tmp_path):
    from transformers import AutoModelForCausalLM

    target = merge_fsdp_checkpoint(os.path.join(trained["out"], "tied"), str(tmp_path / "tied_hf"))
    assert not torch.distributed.is_initialized()  # read without a process group
    model = AutoModelForCausalLM.from_pretrained(target)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    with torch.no_grad():
        assert _max_diff(model(input_ids=_batch()).logits, trained["records"]["tied"]) == 0.0


def test_merge_value_model(trained, tmp_path):
    from transformers import AutoModelForTokenClassification

    target = str(tmp_path / "critic_hf")
    local_dir = os.path.join(trained["out"], "critic")
    assert (
        main(["merge", "--backend", "fsdp", "--local_dir", local_dir, "--target_dir", target, "--is_value_model"]) == 0
    )
    model = AutoModelForTokenClassification.from_pretrained(target)
    assert model.config.num_labels == 1 and type(model).__name__ == "Qwen2ForTokenClassification"
    with torch.no_grad():
        values = model(input_ids=_batch()).logits
    assert values.shape == (4, 12, 1)
    assert _max_diff(values, trained["records"]["critic"]) == 0.0


def test_dtype_option_casts(trained, tmp_path):
    from safetensors.torch import load_file

    local_dir, start = os.path.join(trained["out"], "actor"), trained["model_dirs"]["actor"]
    # the config of the model the training started from, passed explicitly (its config.json says float32)
    target = merge_fsdp_checkpoint(local_dir, str(tmp_path / "bf16"), dtype="bfloat16", hf_model_config_path=start)
    weights = load_file(os.path.join(target, "model.safetensors"))
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    written = _config_json(target)
    assert written["dtype"] == "bfloat16" and _config_json(start)["dtype"] == "float32"
    assert _model_fields(written) == _model_fields(_config_json(start))


# ----------------------------------------------------------------------------- the test subcommand
def test_test_subcommand_against_reference_folders(trained):
    out = trained["out"]
    args = ["test", "--backend", "fsdp", "--local_dir", os.path.join(out, "actor")]
    ok = _cli(*args, "--test_hf_dir", os.path.join(out, "actor_ref_hf"))
    assert ok.returncode == 0, ok.stderr
    assert len(ok.stdout.strip().splitlines()) == 1 and ok.stdout.startswith("ok: all 27 tensors")

    bad = _cli(*args, "--test_hf_dir", trained["model_dirs"]["actor"])  # the untrained model
    assert bad.returncode == 1
    assert "FAILED: 27 of 27 tensors" in bad.stderr
    assert "model.embed_tokens.weight: values differ (max abs diff" in bad.stderr


def test_test_subcommand_value_model_and_tolerance(trained, capsys):
    out = trained["out"]
    critic = ["test", "--backend", "fsdp", "--local_dir", os.path.join(out, "critic"), "--is-value-model"]
    assert main([*critic, "--test_hf_dir", os.path.join(out, "critic_ref_hf")]) == 0
    # The tied model differs from the actor's reference in every tensor; a huge atol only forgives values.
    tied = ["test", "--backend", "fsdp", "--local_dir", os.path.join(out, "tied")]
    capsys.readouterr()
    assert main([*tied, "--test_hf_dir", os.path.join(out, "tied_ref_hf"), "--atol", "1e-6"]) == 0
    assert main([*tied, "--test_hf_dir", os.path.join(out, "actor_ref_hf"), "--atol", "1e6"]) == 0
    assert main([*tied, "--test_hf_dir", os.path.join(out, "actor_ref_hf")]) == 1
    assert "model.embed_tokens.weight: values differ" in capsys.readouterr().err


def test_test_subcommand_names_shape_and_kind_differences(trained, tmp_path, capsys):
    out = trained["out"]
    actor = ["test", "--backend", "fsdp", "--local_dir", os.path.join(out, "actor")]
    wrong_vocab = save_tiny_qwen2(str(tmp_path / "wrong_vocab"), vocab_size=300)
    assert main([*actor, "--test_hf_dir", wrong_vocab]) == 1
    err = capsys.readouterr().err
    assert "model.embed_tokens.weight: shape (256, 128) != reference (300, 128)" in err
    assert "FAILED: 27 of 27 tensors" in err  # the first 10 are listed
    assert main([*actor, "--test_hf_dir", os.path.join(out, "critic_ref_hf")]) == 1
    assert "does not hold a causal LM (is_value_model=False): missing keys [lm_head.weight]" in capsys.readouterr().err
    assert main([*actor, "--test_hf_dir", str(tmp_path / "absent")]) == 1
    assert f"reference folder {tmp_path / 'absent'} does not exist" in capsys.readouterr().err


# ----------------------------------------------------------------------------- errors name the file or key
def _damaged(trained, tmp_path, name: str, how: str) -> str:
    copy = str(tmp_path / "ckpt")
    shutil.copytree(os.path.join(trained["out"], "actor"), copy)
    file = os.path.join(copy, name)
    if how == "delete":
        shutil.rmtree(file) if os.path.isdir(file) else os.remove(file)
    else:
        os.truncate(file, os.path.getsize(file) // 2)
    return copy


@pytest.mark.parametrize(
    "name, how, message",
    [
        (".metadata", "delete", r"\.metadata is missing"),
        (".metadata", "truncate", r"\.metadata is corrupt"),
        ("__1_0.distcp", "delete", r"__1_0\.distcp is missing"),
        ("__0_0.distcp", "truncate", r"__0_0\.distcp is truncated"),
        ("huggingface", "delete", r"huggingface/config\.json does not exist: pass --hf_model_config_path"),
    ],
)
def test_damaged_checkpoint_errors_name_the_file(trained, tmp_path, capsys, name, how, message):
    import re

    local_dir = _damaged(trained, tmp_path, name, how)
    argv = ["merge", "--backend", "fsdp", "--local_dir", local_dir, "--target_dir", str(tmp_path / "t")]
    assert main(argv) == 1
    assert re.search(message, capsys.readouterr().err)
    assert not os.path.exists(tmp_path / "t")


def test_wrong_model_kind_and_config_errors_name_the_keys(trained, tmp_path, capsys):
    out = trained["out"]
    missing = str(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=f"checkpoint folder {missing} does not exist"):
        merge_fsdp_checkpoint(missing, str(tmp_path / "t"))
    with pytest.raises(ValueError, match=r"value model \(score\.weight, score\.bias\): merge it with --is-value-model"):
        merge_fsdp_checkpoint(os.path.join(out, "critic"), str(tmp_path / "t"))
    with pytest.raises(ValueError, match=r"causal LM \(lm_head\.weight\), not a value model"):
        merge_fsdp_checkpoint(os.path.join(out, "actor"), str(tmp_path / "t"), is_value_model=True)
    tied_config = os.path.join(out, "tied", "huggingface")
    with pytest.raises(ValueError, match="ties lm_head.weight to model.embed_tokens.weight, but the checkpoint holds"):
        merge_fsdp_checkpoint(os.path.join(out, "actor"), str(tmp_path / "t"), hf_model_config_path=tied_config)
    wrong_vocab = str(tmp_path / "wrong_vocab")
    save_tiny_qwen2(wrong_vocab, vocab_size=300)
    with pytest.raises(ValueError, match=r"shapes .*model\.embed_tokens\.weight \(256, 128\) \(model: \(300, 128\)\)"):
        merge_fsdp_checkpoint(os.path.join(out, "actor"), str(tmp_path / "t"), hf_model_config_path=wrong_vocab)
    assert not os.path.exists(tmp_path / "t")
    assert main(["merge", "--backend", "fsdp", "--local_dir", missing, "--target_dir", str(tmp_path / "t")]) == 1
    assert f"error: checkpoint folder {missing} does not exist" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--backend", "deepspeed"], "--backend deepspeed: not supported; use one of"),
        (["--backend", "fsdp", "--hf_upload_path", "me/model"], "--hf_upload_path/--private: uploading to the"),
        (["--backend", "fsdp", "--private"], "--hf_upload_path/--private: uploading to the"),
    ],
)
def test_unsupported_options_are_usage_errors(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["merge", "--local_dir", str(tmp_path), "--target_dir", str(tmp_path / "t"), *extra])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
