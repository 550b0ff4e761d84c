"""``verl.trainer.fsdp_sft_trainer`` on the demo's tiny model and SFT files built from the demo's arithmetic rows.

One ``python -m`` run (4 steps, checkpoints at steps 2 and 4) is shared by most checks; a 2-rank ``torchrun`` run
must log the same losses; in-process runs (world size 1) check micro-batch invariance, exact resume and the
multi-turn path. Every run uses one CPU thread per process, so that runs in and out of this process compute
bit-identical results.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf

from verl.trainer.config.sft import sft_base_config, validate_sft_config
from verl.trainer.config.validate import ConfigError
from verl.trainer.fsdp_sft_trainer import run_sft
from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset
from verl.utils.dataset.sft_dataset import SFTDataset
from verl.utils.demo import ensure_demo_assets
from verl.utils.tokenizer import hf_tokenizer

TIMEOUT_S = 300
TRAIN_ROWS, VAL_ROWS = 32, 16

# ChatML with tool schemas (a system turn listing them) and assistant tool calls (a <tool_call> block each).
TOOL_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\nTools:' }}{% for tool in tools %}{{ '\n' + (tool | tojson) }}{% endfor %}"
    "{{ '<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] }}"
    "{% for call in message.get('tool_calls', []) %}{{ '<tool_call>' + (call['function'] | tojson) + '</tool_call>' }}"
    "{% endfor %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate an expression."}}]


def _conversation(question: str, expression: str, answer: str) -> list[dict]:
    call = {"type": "function", "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})}}
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": answer},
        {"role": "assistant", "content": f"The answer is {answer}."},
    ]


def _sft_rows(rows: list[dict]) -> list[dict]:
    return [
        {
            "prompt": r["extra_info"]["question"],
            "response": r["reward_model"]["ground_truth"],
            "extra_info": r["extra_info"],
            "reward_model": r["reward_model"],
        }
        for r in rows
    ]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """The demo model and the SFT parquet files: single-turn train/val, a multi-turn file with a tool call."""
    root = tmp_path_factory.mktemp("sft")
    assets = ensure_demo_assets(tmp_path_factory.getbasetemp() / "verl_cache")  # shared with the other tests
    train = pq.read_table(assets.train_files).to_pylist()[:TRAIN_ROWS]
    val = pq.read_table(assets.val_files).to_pylist()[:VAL_ROWS]
    out = {"model": assets.model_path, "root": str(root)}
    for name, rows in (("train", _sft_rows(train)), ("val", _sft_rows(val))):
        out[name] = str(root / f"{name}.parquet")
        pq.write_table(pa.Table.from_pylist(rows), out[name])
    multi = []
    for r in train[:8]:
        question, answer = r["extra_info"]["question"], r["reward_model"]["ground_truth"]
        expression = question.removeprefix("What is ").removesuffix("?")
        multi.append({"messages": _conversation(question, expression, answer), "tools": json.dumps(TOOLS)})
    out["multi"] = str(root / "multi.parquet")
    pq.write_table(pa.Table.from_pylist(multi), out["multi"])
    return out


def common(files: dict[str, str], ckpt: str) -> list[str]:
    """The overrides every run shares: 32 rows in batches of 8 (4 steps, one epoch), constant lr, no warmup."""
    return [
        f"data.train_files={files['train']}",
        f"data.val_files={files['val']}",
        "data.prompt_key=prompt",
        "data.response_key=response",
        "data.max_length=32",
        "data.train_batch_size=8",
        "data.micro_batch_size_per_gpu=4",
        f"model.partial_pretrain={files['model']}",
        "model.fsdp_config.dtype=float32",
        "optim.lr=3e-3",
        "optim.warmup_steps_ratio=0.0",
        "optim.lr_scheduler=constant",
        "trainer.total_epochs=1",
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={ckpt}",
    ]


def read_log(path: Path) -> dict[int, dict]:
    """``{step: merged metrics}`` of a file-logger jsonl."""
    steps: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record["data"]:
            steps.setdefault(record["step"], {}).update(record["data"])
    return steps


def sft_cli(cli, files: dict[str, str], name: str, *overrides: str, launcher: tuple[str, ...] = ("-m",)) -> dict:
    """Run the trainer in a subprocess (``cli.command``: counted in the suite's CLI runs); returns its metrics by
    step and where it wrote."""
    work = Path(files["root"]) / name
    work.mkdir()
    env = {"VERL_FILE_LOGGER_PATH": str(work / "log.jsonl"), "OMP_NUM_THREADS": "1"}
    args = [
        sys.executable,
        *launcher,
        "verl.trainer.fsdp_sft_trainer",
        *common(files, str(work / "ckpt")),
        f"hydra.run.dir={work / 'hydra'}",
        *overrides,
    ]
    proc = cli.command(args, work, env, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return {"steps": read_log(work / "log.jsonl"), "ckpt": work / "ckpt", "output": proc.stdout + proc.stderr}


@contextlib.contextmanager
def one_thread(log: Path) -> Iterator[None]:
    threads, saved = torch.get_num_threads(), os.environ.get("VERL_FILE_LOGGER_PATH")
    torch.set_num_threads(1)
    os.environ["VERL_FILE_LOGGER_PATH"] = str(log)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        if saved is None:
            os.environ.pop("VERL_FILE_LOGGER_PATH", None)
        else:
            os.environ["VERL_FILE_LOGGER_PATH"] = saved


def in_process(files: dict[str, str], name: str, *overrides: str, values: dict | None = None) -> dict[int, dict]:
    """Run the trainer in this process (``run_sft`` makes a world-size-1 group); returns its metrics by step.
    ``values``: more settings as a nested mapping (for values a dotlist cannot carry)."""
    work = Path(files["root"]) / name
    work.mkdir(exist_ok=True)
    dotlist = [*common(files, str(work / "ckpt")), "trainer.logger=[file]", *overrides]
    config = OmegaConf.merge(sft_base_config(), OmegaConf.from_dotlist(dotlist), values or {})
    log = work / f"log{len(list(work.glob('log*.jsonl')))}.jsonl"  # one per run (a resumed run shares the folder)
    with one_thread(log):
        run_sft(config)
    return read_log(log)


@pytest.fixture(scope="module")
def straight(files, cli) -> dict:
    """``python -m`` for all 4 steps, validating and saving every 2 (gradient checkpointing on)."""
    return sft_cli(cli, files, "straight", "trainer.save_freq=2", "trainer.test_freq=2")


# ------------------------------------------------------------------------------------------------ the CLI run
def test_cli_run_trains_validates_and_saves(straight):
    steps = straight["steps"]
    assert sorted(steps) == [1, 2, 3, 4]
    losses = [steps[s]["train/loss"] for s in range(1, 5)]
    assert losses[3] < losses[0] - 0.5, losses
    assert all(steps[s]["train/lr"] == 3e-3 for s in steps)
    assert steps[4]["val/loss"] < steps[2]["val/loss"], steps
    assert "val/loss" not in steps[1] and "val/loss" not in steps[3]
    ckpt = straight["ckpt"]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "4"
    for step in (2, 4):
        folder = ckpt / f"global_step_{step}"
        for part in (".metadata", "extra_state.pt", "rng_rank_0.pt", "data.pt", "trainer_state.pt"):
            assert (folder / part).is_file(), (folder, part)
    assert not [p for p in ckpt.iterdir() if p.name.startswith(".tmp_")]


def test_huggingface_folder_loads_and_the_merger_agrees(straight, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.model_merger.__main__ import main as merger

    folder = straight["ckpt"] / "global_step_4" / "huggingface"
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert model.config.use_cache is True  # gradient checkpointing turned it off for training only
    assert (folder / "generation_config.json").is_file()
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], tokenize=False)
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    assert model(ids).logits.shape[-1] == model.config.vocab_size
    target = tmp_path / "merged"
    assert merger(["merge", "--backend", "fsdp", "--local_dir", str(folder.parent), "--target_dir", str(target)]) == 0
    merged = AutoModelForCausalLM.from_pretrained(target).state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, merged[name]), name


# ------------------------------------------------------------------------------------------------ invariance
def test_two_ranks_under_torchrun_log_the_same_losses(files, straight, cli):
    launcher = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m")
    run = sft_cli(
        cli,
        files,
        "torchrun",
        "trainer.total_training_steps=2",
        "data.micro_batch_size_per_gpu=2",
        "trainer.n_gpus_per_node=2",
        launcher=launcher,
    )
    for step in (1, 2):
        for key in ("train/loss", "train/grad_norm"):
            assert run["steps"][step][key] == pytest.approx(straight["steps"][step][key], rel=1e-5), (step, key)
    assert run["steps"][2]["val/loss"] == pytest.approx(straight["steps"][2]["val/loss"], rel=1e-5)
    assert (run["ckpt"] / "global_step_2" / "rng_rank_1.pt").is_file()


def test_loss_does_not_depend_on_the_micro_batch_size(files, straight):
    steps = in_process(files, "micro1", "data.micro_batch_size_per_gpu=1", "trainer.total_training_steps=2")
    for step in (1, 2):
        for key in ("train/loss", "train/grad_norm"):
            assert steps[step][key] == pytest.approx(straight["steps"][step][key], rel=1e-5), (step, key)


def test_stop_at_step_2_then_resume_gives_the_straight_runs_losses(files, straight):
    first = in_process(files, "resume", "trainer.total_training_steps=2")
    assert sorted(first) == [1, 2]
    second = in_process(files, "resume", "trainer.resume_mode=auto")
    assert sorted(second) == [3, 4]
    for step in (3, 4):
        for key in ("train/loss", "train/grad_norm", "val/loss"):
            if key in straight["steps"][step]:
                assert second[step][key] == straight["steps"][step][key], (step, key)


def test_lora_run_trains_the_adapters_and_saves_them_merged(files):
    """LoRA SFT in process, the model loaded from a /dev/shm copy: the loss falls, the checkpoint holds the adapter
    folder, and its huggingface folder (merged weights) gives the logits of the base model with that adapter."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    overrides = ("model.lora_rank=8", "model.lora_alpha=16", "model.use_shm=true", "optim.lr=3e-2")
    steps = in_process(files, "lora", *overrides, "trainer.save_freq=4")
    losses = [steps[s]["train/loss"] for s in range(1, 5)]
    assert losses[3] < losses[0] - 0.3, losses
    folder = Path(files["root"]) / "lora" / "ckpt" / "global_step_4"
    assert (folder / "lora_adapter" / "adapter_model.safetensors").is_file()
    merged = AutoModelForCausalLM.from_pretrained(folder / "huggingface", dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(files["model"], dtype=torch.float32)
    adapted = PeftModel.from_pretrained(base, folder / "lora_adapter")
    ids = torch.randint(3, 200, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        # merged W + BA vs. peft's W x + B(A x): the same sums in another order (~3e-5 apart with peft 0.21)
        torch.testing.assert_close(merged(ids).logits, adapted(ids).logits, rtol=0, atol=1e-4)


def test_multi_turn_run_with_a_tool_call_and_a_custom_template(files):
    steps = in_process(
        files,
        "multi",
        f"data.train_files={files['multi']}",
        "data.val_files=null",
        "data.multiturn.enable=true",
        "data.max_length=384",
        "data.train_batch_size=4",
        values={"data": {"chat_template": TOOL_TEMPLATE}},
    )
    assert sorted(steps) == [1, 2] and all("val/loss" not in m for m in steps.values())
    saved = hf_tokenizer(str(Path(files["root"]) / "multi" / "ckpt" / "global_step_2" / "huggingface"))
    assert saved.chat_template == TOOL_TEMPLATE


# ------------------------------------------------------------------------------------------------ datasets
def test_single_turn_loss_mask_is_the_response_exactly(files):
    tokenizer = hf_tokenizer(files["model"])
    config = {
        "prompt_key": "extra_info",
        "prompt_dict_keys": ["question"],
        "response_key": "reward_model",
        "response_dict_keys": ["ground_truth"],
        "max_length": 32,
    }
    dataset = SFTDataset(files["train"], tokenizer, config)
    row = pq.read_table(files["train"]).to_pylist()[0]
    prompt = f"<|im_start|>user\n{row['prompt']}<|im_end|>\n<|im_start|>assistant\n"
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    response_ids = tokenizer(row["response"] + "<|im_end|>", add_special_tokens=False)["input_ids"]
    n, pad = len(prompt_ids) + len(response_ids), 32 - len(prompt_ids) - len(response_ids)
    item = dataset[0]
    assert item["input_ids"].tolist() == prompt_ids + response_ids + [tokenizer.pad_token_id] * pad
    assert item["loss_mask"].tolist() == [0] * len(prompt_ids) + [1] * len(response_ids) + [0] * pad
    assert item["attention_mask"].tolist() == [1] * n + [0] * pad
    assert item["position_ids"].tolist() == list(range(n)) + [n - 1] * pad
    assert len(dataset) == TRAIN_ROWS


def test_multi_turn_loss_mask_covers_the_assistant_turns_only(files):
    tokenizer = hf_tokenizer(files["model"])
    tokenizer.chat_template = TOOL_TEMPLATE
    dataset = MultiTurnSFTDataset(files["multi"], tokenizer, {"max_length": 384})
    row = pq.read_table(files["multi"]).to_pylist()[0]
    question = row["messages"][0]["content"]
    expression = question.removeprefix("What is ").removesuffix("?")
    answer = row["messages"][2]["content"]
    call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    pieces = [  # (text, trained), written out by hand from the template; each turn up to an assistant's content
        (
            "<|im_start|>system\nTools:\n"
            + json.dumps(TOOLS[0])
            + f"<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n",
            False,
        ),
        ("<|im_start|>assistant\n", False),
        (f"<tool_call>{call}</tool_call><|im_end|>\n", True),
        (f"<|im_start|>tool\n{answer}<|im_end|>\n", False),
        ("<|im_start|>assistant\n", False),
        (f"The answer is {answer}.<|im_end|>\n", True),
    ]
    ids, mask = [], []
    for text, trained in pieces:
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids, mask = ids + piece, mask + [int(trained)] * len(piece)
    item = dataset[0]
    assert item["input_ids"][: len(ids)].tolist() == ids
    assert item["loss_mask"].tolist() == mask + [0] * (384 - len(ids))
    assert item["attention_mask"].sum() == len(ids)


def test_truncation_left_and_right_keep_the_mask_with_its_tokens(files):
    tokenizer = hf_tokenizer(files["model"])
    full = SFTDataset(files["train"], tokenizer, {"max_length": 32})
    n = len(full.ids[0])
    for mode, cut in (("left", slice(n - 8, n)), ("right", slice(0, 8))):
        short = SFTDataset(files["train"], tokenizer, {"max_length": 8, "truncation": mode}, max_samples=2)
        assert short.ids[0] == full.ids[0][cut] and short.loss_masks[0] == full.loss_masks[0][cut], mode


# ------------------------------------------------------------------------------------------------ errors
def test_truncation_error_names_the_row_and_the_limit(files):
    tokenizer = hf_tokenizer(files["model"])
    with pytest.raises(
        ValueError, match=r"data\.max_length=8 \(data\.truncation=error\):\n.*train\.parquet: row 0: \d+ tokens"
    ):
        SFTDataset(files["train"], tokenizer, {"max_length": 8})


def test_bad_column_and_bad_rows_are_named(files, tmp_path):
    tokenizer = hf_tokenizer(files["model"])
    with pytest.raises(ValueError, match=r"has no column 'question' \(data\.prompt_key\)"):
        SFTDataset(files["train"], tokenizer, {"prompt_key": "question"})
    with pytest.raises(ValueError, match=r"row 0: column 'extra_info' has no key 'text' \(data\.prompt_dict_keys\)"):
        SFTDataset(files["train"], tokenizer, {"prompt_key": "extra_info", "prompt_dict_keys": ["text"]})
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "What is 1 + 1?", "response": r} for r in ("2", None)]), bad)
    with pytest.raises(ValueError, match=r"bad\.parquet: row 1: column 'response': expected a string, got None"):
        SFTDataset(str(bad), tokenizer, {})
    convo = tmp_path / "convo.parquet"
    pq.write_table(pa.Table.from_pylist([{"messages": [{"role": "user", "content": "hi"}]}]), convo)
    with pytest.raises(ValueError, match=r"convo\.parquet: row 0: column 'messages': no assistant message"):
        MultiTurnSFTDataset(str(convo), tokenizer, {})


def test_bad_keys_fail_before_any_process_group_naming_each(files, tmp_path):
    overrides = [*common(files, str(tmp_path)), "data.promt_key=question"]
    with pytest.raises(ConfigError, match=r"unknown key 'data\.promt_key'"):
        run_sft(OmegaConf.merge(sft_base_config(), OmegaConf.from_dotlist(overrides)))
    bad = [
        *common(files, str(tmp_path)),
        "data.truncation=middle",
        "ulysses_sequence_parallel_size=2",
        "model.lora_rank=8",
        "model.lora_alpha=-2",
        "optim.lr_scheduler=wsd",
        "trainer.checkpoint.save_contents=[model]",
    ]
    with pytest.raises(ConfigError) as info:
        validate_sft_config(OmegaConf.merge(sft_base_config(), OmegaConf.from_dotlist(bad)))
    problems = info.value.problems
    for start in (
        "data.truncation='middle'",
        "ulysses_sequence_parallel_size=2: sequence parallelism",
        "model.lora_alpha=-2 must be a positive number",
        "optim.lr_scheduler='wsd'",
        "trainer.checkpoint.save_contents=['model']",
    ):
        assert any(p.startswith(start) for p in problems), (start, problems)
    assert not torch.distributed.is_initialized()


def test_keys_without_effect_warn_by_name(files, tmp_path, caplog):
    overrides = [*common(files, str(tmp_path)), "use_remove_padding=true", "model.use_liger=true"]
    validate_sft_config(OmegaConf.merge(sft_base_config(), OmegaConf.from_dotlist(overrides)))
    assert "use_remove_padding=True has no effect here" in caplog.text
    assert "model.use_liger=True has no effect here" in caplog.text
