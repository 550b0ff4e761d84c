"""The built-in demo assets: deterministic, atomic, safe under concurrent first use, and a learnable task."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import torch

from verl.utils import demo
from verl.utils.demo import DEMO_DATA_SOURCE, DemoAssets, ensure_demo_assets, make_arithmetic_rows
from verl.utils.reward_score import default_compute_score


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> DemoAssets:
    return ensure_demo_assets(tmp_path_factory.mktemp("cache"))


def test_assets_are_a_consistent_model_tokenizer_and_task(assets):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(assets.tokenizer_path)
    model = AutoModelForCausalLM.from_pretrained(assets.model_path)
    assert assets.tokenizer_path == assets.model_path
    assert model.config.vocab_size == len(tok) == demo.TOKENIZER_VOCAB_SIZE
    assert (model.config.hidden_size, model.config.num_attention_heads, model.config.num_hidden_layers) == (128, 4, 2)
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert (tok.pad_token_id, tok.eos_token_id) == (0, 2)
    assert (model.config.pad_token_id, model.config.eos_token_id) == (0, 2)
    assert model.generation_config.eos_token_id == [2, 0]
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 3 + 4?"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n"
    pieces = tok.convert_ids_to_tokens(tok("1234567890 12", add_special_tokens=False)["input_ids"])
    assert pieces == list("1234567890") + ["Ġ", "1", "2"]  # every digit its own token
    rows = pq.read_table(assets.train_files).to_pylist()
    assert len(rows) == demo.TRAIN_SIZE and len(pq.read_table(assets.val_files)) == demo.TEST_SIZE
    assert rows[0]["data_source"] == DEMO_DATA_SOURCE and rows[0]["prompt"][0]["role"] == "user"


def test_ensure_is_idempotent_and_honours_the_cache_env(assets, tmp_path, monkeypatch):
    marker = os.path.join(os.path.dirname(assets.model_path), "manifest.json")
    before = os.stat(marker).st_mtime_ns
    cache = os.path.dirname(os.path.dirname(os.path.dirname(assets.model_path)))
    assert ensure_demo_assets(cache) == assets
    assert os.stat(marker).st_mtime_ns == before  # nothing rebuilt
    monkeypatch.setenv("VERL_CACHE_DIR", cache)
    assert demo.default_cache_dir() == cache and ensure_demo_assets() == assets
    monkeypatch.delenv("VERL_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert demo.default_cache_dir() == os.path.join(str(tmp_path), ".cache", "verl")


def test_assets_are_deterministic(assets, tmp_path):
    other = ensure_demo_assets(tmp_path)
    for name in ("tokenizer.json", "config.json", "chat_template.jinja"):
        with (
            open(os.path.join(assets.model_path, name), "rb") as a,
            open(os.path.join(other.model_path, name), "rb") as b,
        ):
            assert a.read() == b.read(), name
    from safetensors.torch import load_file

    first = load_file(os.path.join(assets.model_path, "model.safetensors"))
    second = load_file(os.path.join(other.model_path, "model.safetensors"))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    assert pq.read_table(assets.train_files).to_pylist() == pq.read_table(other.train_files).to_pylist()


RACERS = 4
_RACE = """
import os, sys, time
from verl.utils import demo

def slow_build(folder):  # stands in for the real build: same files, same protocol, begun by every racer at once
    entered = sys.argv[2]
    open(os.path.join(entered, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(entered)) < int(sys.argv[3]):  # none renames before all have started building
        if time.monotonic() > deadline:
            sys.exit(f"only {os.listdir(entered)} of {sys.argv[3]} racers began building in 60 s")
        time.sleep(0.01)
    for sub in ("model", "data"):
        os.makedirs(os.path.join(folder, sub))
    with open(os.path.join(folder, "model", "builder"), "w") as f:
        f.write(str(os.getpid()))
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        f.write("{}")

demo._build = slow_build
print(demo.ensure_demo_assets(sys.argv[1]).model_path)
"""


def test_concurrent_first_use_builds_once(tmp_path):
    entered = tmp_path / "entered"
    entered.mkdir()
    cache = tmp_path / "cache"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACE, str(cache), str(entered), str(RACERS)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(RACERS)
    ]
    outputs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0] * RACERS
    assert sorted(int(pid) for pid in os.listdir(entered)) == sorted(p.pid for p in procs)  # all built, at once
    assert len(set(outputs)) == 1
    with open(os.path.join(outputs[0], "builder")) as f:
        assert int(f.read()) in {p.pid for p in procs}  # one builder's complete copy won
    assert os.listdir(cache / "demo") == [f"v{demo.DEMO_VERSION}"]  # the others removed their temp dirs


def test_losing_the_rename_race_keeps_the_winner(tmp_path, monkeypatch):
    real_build = demo._build
    final = tmp_path / "demo" / f"v{demo.DEMO_VERSION}"

    def build_then_lose(folder):
        real_build(folder)
        os.makedirs(final)
        real_build(str(final))  # a competitor finished first

    monkeypatch.setattr(demo, "_build", build_then_lose)
    result = ensure_demo_assets(tmp_path)
    assert result.model_path == str(final / "model")
    assert os.listdir(tmp_path / "demo") == [final.name]


def test_a_failed_rename_without_a_winner_raises(tmp_path, monkeypatch):
    final = tmp_path / "demo" / f"v{demo.DEMO_VERSION}"

    def build_then_block(folder):
        os.makedirs(final / "junk")  # the target exists, not empty, with no manifest

    monkeypatch.setattr(demo, "_build", build_then_block)
    with pytest.raises(OSError, match=f"-> '{re.escape(str(final))}'"):  # os.replace's error, naming the target
        ensure_demo_assets(tmp_path)
    assert sorted(os.listdir(tmp_path / "demo")) == [final.name]  # our temp dir was cleaned up


def test_rows_follow_the_schema_and_are_right():
    rows = make_arithmetic_rows(200, seed=5, split="train")
    assert rows == make_arithmetic_rows(200, seed=5, split="train")
    assert rows != make_arithmetic_rows(200, seed=6, split="train")
    ops = set()
    for i, row in enumerate(rows):
        question = row["prompt"][0]["content"]
        a, op, b = question.removeprefix("What is ").removesuffix("?").split()
        expected = int(a) + int(b) if op == "+" else int(a) - int(b)
        ops.add(op)
        assert row["reward_model"] == {"style": "rule", "ground_truth": str(expected)}
        assert expected >= 0 and row["extra_info"]["index"] == i and row["extra_info"]["split"] == "train"
    assert ops == {"+", "-"}  # subtractions included: their answers are the ones that could be negative


def test_a_random_policy_scores_a_little(assets):
    """The task is learnable from a random init: sampled answers already earn a small, non-zero reward."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(assets.tokenizer_path)
    model = AutoModelForCausalLM.from_pretrained(assets.model_path)
    rows = make_arithmetic_rows(16, seed=0, split="train")
    texts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    tok.padding_side = "left"
    batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(0)
    out = model.generate(**batch, do_sample=True, max_new_tokens=8, num_return_sequences=8, top_k=None)
    responses = out[:, batch["input_ids"].shape[1] :]
    scores = []
    for k, ids in enumerate(responses.tolist()):
        end = next((j for j, t in enumerate(ids) if t in (0, 2)), None)  # the generation config's EOS ids
        ended = end is not None
        text = tok.decode(ids[: end + 1] if ended else ids, skip_special_tokens=True)
        row = rows[k // 8]
        result = default_compute_score(
            row["data_source"], text, row["reward_model"]["ground_truth"], {"response_ended": ended}
        )
        scores.append(result["score"])
    assert sum(s > 0 for s in scores) >= 3  # 7 of 128 when measured
    assert 0 < sum(scores) / len(scores) < 0.1
