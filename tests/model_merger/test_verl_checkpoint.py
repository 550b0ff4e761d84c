"""``python -m verl.model_merger`` on checkpoints in veRL's own FSDP layout, written as veRL's checkpoint manager does.

One spawned 2-rank gloo run (the ``verl_ckpts`` fixture) shards tiny Qwen2 models with FSDP2 (``fully_shard``: an
actor with an odd vocabulary, so its embedding rows split 128/127, and a critic) and with FSDP1 on a device mesh,
and each rank writes ``model_world_size_2_rank_<r>.pt`` = ``torch.save(model.state_dict())`` (DTensor values), its
optimizer and extra-state files; rank 0 writes ``fsdp_config.json`` and ``huggingface/`` (config and tokenizer, no
weights). The tests merge them (no process group) and compare with the source models.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard

from verl.model_merger.__main__ import main
from verl.model_merger.fsdp import merge_fsdp_checkpoint
from verl.model_merger.verl_fsdp import assemble_dtensor, load_verl_fsdp_state_dict
from verl.utils.tiny_model import build_tiny_qwen2, save_tiny_qwen2

WORLD = 2
VOCAB = 255  # odd: the FSDP shards of the embedding and lm_head are uneven
RUNS = (("actor", 2), ("critic", 2), ("fsdp1_actor", 1))  # (checkpoint folder, FSDP version)


def _batch() -> torch.Tensor:
    return torch.randint(3, VOCAB, (3, 10), generator=torch.Generator().manual_seed(11))


def _save_tokenizer(folder: str) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>").save_pretrained(folder)


def _write_verl_checkpoints(rank: int, out: str, sources: dict[str, str], tokenizer_dir: str) -> None:
    """What veRL's FSDPCheckpointManager.save_checkpoint writes, for each run of RUNS."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardedStateDictConfig, StateDictType, fully_shard
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("fsdp",))
    for name, version in RUNS:
        model_class = AutoModelForTokenClassification if name == "critic" else AutoModelForCausalLM
        model = model_class.from_pretrained(sources[name], dtype=torch.float32)
        hf_model = model
        if version == 2:
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            state_dict = model.state_dict()
        else:
            model = FSDP(model, device_mesh=mesh, device_id=torch.device("cpu"), use_orig_params=True)
            with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig()):
                state_dict = model.state_dict()
        folder = os.path.join(out, name)
        os.makedirs(folder, exist_ok=True)
        suffix = f"world_size_{WORLD}_rank_{rank}.pt"
        torch.save(state_dict, os.path.join(folder, f"model_{suffix}"))
        torch.save(torch.optim.AdamW(model.parameters()).state_dict(), os.path.join(folder, f"optim_{suffix}"))
        torch.save(
            {"lr_scheduler": None, "rng": {"cpu": torch.get_rng_state()}}, os.path.join(folder, f"extra_{suffix}")
        )
        if rank == 0:
            hf_dir = os.path.join(folder, "huggingface")
            hf_model.config.save_pretrained(hf_dir)
            AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(hf_dir)
            with open(os.path.join(folder, "fsdp_config.json"), "w") as f:
                json.dump({"FSDP_version": version, "world_size": WORLD}, f, indent=4)
        torch.distributed.barrier()


@pytest.fixture(scope="module")
def verl_ckpts(gloo, tmp_path_factory) -> dict:
    out = str(tmp_path_factory.mktemp("verl_ckpt"))
    actor_src = save_tiny_qwen2(os.path.join(out, "actor_src"), seed=0, vocab_size=VOCAB)
    critic_src = os.path.join(out, "critic_src")
    build_tiny_qwen2(seed=1, value_head=True, vocab_size=VOCAB).save_pretrained(critic_src)
    tokenizer_dir = os.path.join(out, "tokenizer")
    _save_tokenizer(tokenizer_dir)
    sources = {"actor": actor_src, "critic": critic_src, "fsdp1_actor": actor_src}
    gloo(_write_verl_checkpoints, WORLD, out, sources, tokenizer_dir)
    return {"out": out, "sources": sources}


def _outputs(folder: str, value_model: bool = False) -> torch.Tensor:
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    model_class = AutoModelForTokenClassification if value_model else AutoModelForCausalLM
    model = model_class.from_pretrained(folder)
    assert model.dtype == torch.float32
    with torch.no_grad():
        return model(input_ids=_batch()).logits


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape and a.dtype == b.dtype
    return (a.double() - b.double()).abs().max().item()


# ----------------------------------------------------------------------------- the files as veRL writes them
def test_rank_files_hold_dtensors_that_load_without_a_process_group(verl_ckpts):
    from torch.distributed.tensor import DTensor

    files = [os.path.join(verl_ckpts["out"], "actor", f"model_world_size_2_rank_{r}.pt") for r in range(WORLD)]
    shards = [torch.load(f, map_location="cpu", weights_only=False)["model.embed_tokens.weight"] for f in files]
    assert not torch.distributed.is_initialized()
    assert all(isinstance(s, DTensor) and s.placements == (Shard(0),) for s in shards)
    assert [tuple(s._local_tensor.shape) for s in shards] == [(128, 128), (127, 128)]
    assert shards[0].shape == (VOCAB, 128) and shards[1].device_mesh.get_coordinate() == (1,)

    merged = load_verl_fsdp_state_dict(os.path.join(verl_ckpts["out"], "actor"))
    source = build_tiny_qwen2(seed=0, vocab_size=VOCAB).state_dict()
    assert list(merged) == list(source)
    assert all(torch.equal(merged[k], source[k]) for k in source)


# ----------------------------------------------------------------------------- merging
def test_merge_cli_fsdp2_actor_gives_the_source_logits(verl_ckpts, tmp_path):
    from transformers import AutoTokenizer

    local_dir, target = os.path.join(verl_ckpts["out"], "actor"), str(tmp_path / "actor_hf")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(
        [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", local_dir]
        + ["--target_dir", target],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines() == [f"merged {local_dir} into {target}"]
    assert "read 27 tensors of 2 rank files (FSDP_version 2, DTensor)" in result.stderr
    assert "unpickling of the DeviceMesh" not in result.stderr  # the expected warning is silenced
    assert os.path.isfile(os.path.join(target, "model.safetensors"))
    assert AutoTokenizer.from_pretrained(target).convert_tokens_to_ids("w42") == 42
    # Observed: bitwise equal (the same float32 weights, unsharded).
    assert _max_diff(_outputs(target), _outputs(verl_ckpts["sources"]["actor"])) == 0.0


def test_merge_fsdp1_checkpoint_on_a_device_mesh(verl_ckpts, tmp_path):
    target = merge_fsdp_checkpoint(os.path.join(verl_ckpts["out"], "fsdp1_actor"), str(tmp_path / "fsdp1_hf"))
    assert _max_diff(_outputs(target), _outputs(verl_ckpts["sources"]["actor"])) == 0.0


def test_merge_and_test_value_model(verl_ckpts, tmp_path, capsys):
    local_dir, target = os.path.join(verl_ckpts["out"], "critic"), str(tmp_path / "critic_hf")
    assert (
        main(["merge", "--backend", "fsdp", "--local_dir", local_dir, "--target_dir", target, "--is-value-model"]) == 0
    )
    values = _outputs(target, value_model=True)
    assert values.shape == (3, 10, 1)
    assert _max_diff(values, _outputs(verl_ckpts["sources"]["critic"], value_model=True)) == 0.0
    test = ["test", "--backend", "fsdp", "--local_dir", local_dir, "--is-value-model"]
    assert main([*test, "--test_hf_dir", verl_ckpts["sources"]["critic"]]) == 0
    assert "ok: all 28 tensors" in capsys.readouterr().out
    assert main(["merge", "--backend", "fsdp", "--local_dir", local_dir, "--target_dir", str(tmp_path / "t")]) == 1
    assert "merge it with --is-value-model" in capsys.readouterr().err


def test_test_subcommand_names_differences(verl_ckpts, tmp_path, capsys):
    actor = ["test", "--backend", "fsdp", "--local_dir", os.path.join(verl_ckpts["out"], "actor")]
    assert main([*actor, "--test_hf_dir", verl_ckpts["sources"]["actor"]]) == 0
    other = save_tiny_qwen2(str(tmp_path / "other"), seed=5, vocab_size=VOCAB)
    assert main([*actor, "--test_hf_dir", other]) == 1
    assert "model.embed_tokens.weight: values differ" in capsys.readouterr().err


# ----------------------------------------------------------------------------- errors name the file
def _damaged(verl_ckpts, tmp_path, how: str) -> str:
    copy = str(tmp_path / "ckpt")
    shutil.copytree(os.path.join(verl_ckpts["out"], "actor"), copy)
    rank = [os.path.join(copy, f"model_world_size_2_rank_{r}.pt") for r in range(WORLD)]
    if how == "missing rank":
        os.remove(rank[1])
    elif how == "world size":
        with open(os.path.join(copy, "fsdp_config.json"), "w") as f:
            json.dump({"FSDP_version": 2, "world_size": 4}, f)
    elif how == "no config":
        shutil.rmtree(os.path.join(copy, "huggingface"))
    elif how == "truncated":
        os.truncate(rank[0], os.path.getsize(rank[0]) // 2)
    elif how == "swapped":
        os.rename(rank[0], rank[0] + ".tmp")
        os.rename(rank[1], rank[0])
        os.rename(rank[0] + ".tmp", rank[1])
    return copy


@pytest.mark.parametrize(
    "how, message",
    [
        ("missing rank", r"checkpoint file \S+/model_world_size_2_rank_1\.pt is missing \(rank 1 of world size 2"),
        ("world size", r"\S+/fsdp_config\.json says world_size=4, but the model files of \S+ are model_world_size_2_"),
        ("no config", r"\S+/huggingface/config\.json does not exist: pass --hf_model_config_path"),
        ("truncated", r"checkpoint file \S+/model_world_size_2_rank_0\.pt is truncated or corrupt"),
        ("swapped", r"\S+/model_world_size_2_rank_0\.pt was saved by the rank at mesh coordinate \(1,\), not \(0,\)"),
    ],
)
def test_damaged_checkpoint_errors_name_the_file(verl_ckpts, tmp_path, capsys, how, message):
    local_dir = _damaged(verl_ckpts, tmp_path, how)
    assert main(["merge", "--backend", "fsdp", "--local_dir", local_dir, "--target_dir", str(tmp_path / "t")]) == 1
    assert re.search(message, capsys.readouterr().err)
    assert not os.path.exists(tmp_path / "t")


def test_folder_without_a_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"holds no model checkpoint: neither a DCP checkpoint .* nor veRL"):
        merge_fsdp_checkpoint(str(tmp_path), str(tmp_path / "t"))


# ----------------------------------------------------------------------------- assembling shards (no files)
def test_assemble_hsdp_and_2d_shards():
    full = torch.arange(6 * 6.0).reshape(6, 6)
    mesh = torch.tensor([[0, 1, 2], [3, 4, 5]])  # (ddp, fsdp)
    rows, read = full.chunk(3), []

    def row_shard(rank: int, coordinate: tuple[int, ...]) -> torch.Tensor:
        read.append(rank)
        assert rank == mesh[coordinate]
        return rows[coordinate[1]]

    assert torch.equal(assemble_dtensor("w", mesh, (Replicate(), Shard(0)), row_shard), full)
    assert read == [0, 1, 2]  # one replica of the ddp dimension is read
    blocks = {(i, j): full.chunk(2, dim=0)[i].chunk(3, dim=1)[j] for i in range(2) for j in range(3)}
    assert torch.equal(assemble_dtensor("w", mesh, (Shard(0), Shard(1)), lambda rank, c: blocks[c]), full)
    with pytest.raises(ValueError, match="w: 1 placements for a 2-dimensional device mesh"):
        assemble_dtensor("w", mesh, (Shard(0),), lambda rank, c: full)
