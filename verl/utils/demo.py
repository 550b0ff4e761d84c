"""The built-in demo: a tiny model, its tokenizer and a synthetic arithmetic task, generated offline on first use.

``python -m verl.trainer.main_ppo`` with neither ``actor_rollout_ref.model.path`` nor ``data.train_files`` trains on
these assets. :func:`ensure_demo_assets` materialises them under ``$VERL_CACHE_DIR`` (default ``~/.cache/verl``)::

    <cache>/demo/v<DEMO_VERSION>/
        model/        tiny Qwen2 (hidden 128, 4 heads, 2 layers, seed 0) + its tokenizer (HF folder)
        data/         train.parquet, test.parquet (veRL's schema, data_source "verl/arithmetic")
        manifest.json written last; lists the above

Everything is deterministic (the same files for the same library versions), built in a temp dir and renamed into
place, so several processes may call :func:`ensure_demo_assets` at once: one rename wins, the others reuse its
result.

The task: ``"What is 3 + 4?"`` → ``"7"``; operands 0-9, ``+`` and ``-`` (never negative). Its reward
(:mod:`verl.utils.reward_score.arithmetic`, where the formula is documented) is
``0.2 · starts with a number + 0.4 · closeness of that number + 0.4 · stopped right after it``: a random policy
already earns ~0.02 on average, and GRPO raises that to ~0.8 within tens of steps.

The tokenizer: byte-level BPE (320 tokens) trained on text generated from a fixed seed, with Qwen2's pre-tokenizer
(every digit its own token), ChatML special tokens ``<|endoftext|>`` (id 0, pad), ``<|im_start|>`` (1),
``<|im_end|>`` (2, EOS) and a ChatML ``chat_template``. The model's ``vocab_size`` is the tokenizer's length; its
generation config stops on ``<|im_end|>`` and ``<|endoftext|>``, as Qwen2 instruct models do.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from verl.utils.reward_score.arithmetic import DATA_SOURCE as DEMO_DATA_SOURCE

__all__ = [
    "DEMO_DATA_SOURCE",
    "DEMO_VERSION",
    "DemoAssets",
    "build_demo_tokenizer",
    "default_cache_dir",
    "ensure_demo_assets",
    "make_arithmetic_rows",
    "materialise",
    "save_demo_model",
]

logger = logging.getLogger(__name__)

# Bump when anything below changes what is written: old caches stay valid for old versions.
DEMO_VERSION = 1

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN]  # ids 0, 1, 2
TOKENIZER_VOCAB_SIZE = 320
MODEL_SEED = 0
TRAIN_SIZE, TEST_SIZE = 1024, 128
TRAIN_SEED, TEST_SEED = 1, 2

QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class DemoAssets:
    """Paths of the materialised demo assets (the tokenizer lives in the model folder)."""

    model_path: str
    tokenizer_path: str
    train_files: str
    val_files: str


def default_cache_dir() -> str:
    """``$VERL_CACHE_DIR``, or ``~/.cache/verl``."""
    return os.path.expanduser(os.environ.get("VERL_CACHE_DIR") or os.path.join("~", ".cache", "verl"))


def _question(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    if rng.random() < 0.5:
        return f"What is {a} + {b}?", a + b
    a, b = max(a, b), min(a, b)
    return f"What is {a} - {b}?", a - b


def make_arithmetic_rows(num_rows: int, seed: int, split: str) -> list[dict[str, Any]]:
    """``num_rows`` demo questions in veRL's parquet schema, identical for the same ``seed``."""
    rng = random.Random(seed)
    rows = []
    for index in range(num_rows):
        question, answer = _question(rng)
        rows.append(
            {
                "data_source": DEMO_DATA_SOURCE,
                "prompt": [{"role": "user", "content": question}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(answer)},
                "extra_info": {"split": split, "index": index, "question": question, "answer": str(answer)},
            }
        )
    return rows


def _tokenizer_corpus() -> Iterator[str]:
    """Deterministic training text: chat-formatted questions and answers, plus some plain English."""
    rng = random.Random(1234)
    words = (
        "the a of and to in is it you that he was for on are with as his they be at one have this from or had by "
        "word but what some we can out other were all there when up use your how said an each she which do their "
        "time if will way about many then them write would like so these her long make thing see him two has look "
        "more day could go come did number sound no most people my over know water than call first who may down side "
        "been now find answer question sum plus minus equals"
    ).split()
    for _ in range(2000):
        question, answer = _question(rng)
        yield f"user\n{question}\nassistant\n{answer}\n"  # special tokens are never merged: leave them out
        yield " ".join(rng.choice(words) for _ in range(rng.randint(3, 12))).capitalize() + rng.choice(".?!")


def build_demo_tokenizer(
    corpus: Iterator[str] | None = None,
    vocab_size: int = TOKENIZER_VOCAB_SIZE,
    added_tokens: tuple[str, ...] = (),
    chat_template: str = CHATML_TEMPLATE,
):
    """Train the demo tokenizer (deterministic) and wrap it as a ``PreTrainedTokenizerFast`` with a chat template.

    ``corpus`` / ``vocab_size`` / ``added_tokens`` (plain added tokens, e.g. ``<tool_call>``) / ``chat_template``
    build a variant (the tool demo's); the defaults build the demo's own tokenizer."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    # Qwen2's normalizer and pre-tokenizer (each digit its own piece): AutoTokenizer loads this folder as a
    # Qwen2Tokenizer, which installs exactly these, so the tokenizer behaves the same however it is loaded.
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus if corpus is not None else _tokenizer_corpus(), trainer=trainer)
    if added_tokens:  # like Qwen's <tool_call>: one token each, not special (kept when decoding)
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added_tokens])
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=None, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, unk_token=None
    )
    wrapped.chat_template = chat_template
    return wrapped


def _write_parquet(rows: list[dict[str, Any]], path: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)


def save_demo_model(tokenizer: Any, model_dir: str) -> None:
    """Save a fresh tiny Qwen2 (seed ``MODEL_SEED``) sized for ``tokenizer``, and the tokenizer, into ``model_dir``."""
    from verl.utils.tiny_model import build_tiny_qwen2

    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in SPECIAL_TOKENS}
    model = build_tiny_qwen2(
        seed=MODEL_SEED,
        vocab_size=len(tokenizer),
        pad_token_id=ids[PAD_TOKEN],
        bos_token_id=ids[PAD_TOKEN],
        eos_token_id=ids[EOS_TOKEN],
    )
    model.generation_config.eos_token_id = [ids[EOS_TOKEN], ids[PAD_TOKEN]]  # like Qwen2 instruct models
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)


def _build(folder: str) -> None:
    """Write every demo asset into ``folder`` (which exists and is empty)."""
    data_dir = os.path.join(folder, "data")
    os.makedirs(data_dir)
    save_demo_model(build_demo_tokenizer(), os.path.join(folder, "model"))
    _write_parquet(make_arithmetic_rows(TRAIN_SIZE, TRAIN_SEED, "train"), os.path.join(data_dir, "train.parquet"))
    _write_parquet(make_arithmetic_rows(TEST_SIZE, TEST_SEED, "test"), os.path.join(data_dir, "test.parquet"))
    manifest = {
        "version": DEMO_VERSION,
        "model": "model",
        "train_files": "data/train.parquet",
        "val_files": "data/test.parquet",
    }
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump(manifest, f)


def _assets(folder: str) -> DemoAssets:
    model = os.path.join(folder, "model")
    data = os.path.join(folder, "data")
    return DemoAssets(model, model, os.path.join(data, "train.parquet"), os.path.join(data, "test.parquet"))


def ensure_demo_assets(cache_dir: str | os.PathLike | None = None) -> DemoAssets:
    """Materialise the demo assets under ``cache_dir`` (default :func:`default_cache_dir`) unless they are there.

    Idempotent and safe to call from several processes at once: each builds in its own temp dir, then renames it to
    ``<cache>/demo/v<DEMO_VERSION>``; the first rename wins and the losers discard their copy.
    """
    return _assets(materialise(cache_dir, f"v{DEMO_VERSION}", _build))


def materialise(cache_dir: str | os.PathLike | None, name: str, build: Any) -> str:
    """``<cache>/demo/<name>``, built by ``build(folder)`` (which writes ``manifest.json`` last) unless it exists;
    built in a temp dir and renamed into place, so concurrent callers are safe."""
    root = os.path.join(os.path.expanduser(os.fspath(cache_dir or default_cache_dir())), "demo")
    final = os.path.join(root, name)
    if os.path.isfile(os.path.join(final, "manifest.json")):
        return final
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=root)
    try:
        logger.info("building the verl demo assets into %s", final)
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:  # another process renamed its copy first (the target exists and is not empty)
            if not os.path.isfile(os.path.join(final, "manifest.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
