"""Checking that a merged Hugging Face folder really holds a model before anyone uses it.

A merge that wrote only a tokenizer, or an index naming shards that were never written, would otherwise be found
out much later, when ``from_pretrained`` fails on another machine.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

__all__ = ["validate_hf_model_output"]

CONFIG_FILE = "config.json"
SINGLE_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def _has_bytes(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _config_problem(folder: Path) -> str | None:
    path = folder / CONFIG_FILE
    if not _has_bytes(path):
        return f"missing or empty {CONFIG_FILE}"
    try:
        value = _read_json(path)
    except (OSError, UnicodeError, ValueError) as e:
        return f"invalid {CONFIG_FILE}: {e}"
    return None if isinstance(value, dict) else f"{CONFIG_FILE} is not a JSON object"


def _index_problem(folder: Path, index_name: str) -> str | None:
    """None when the index at ``folder/index_name`` names only shards that exist (non-empty) inside ``folder``."""
    try:
        index = _read_json(folder / index_name)
    except (OSError, UnicodeError, ValueError) as e:
        return f"invalid {index_name}: {e}"
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        return f"{index_name} has an empty or missing weight_map"
    shards = set()
    for shard in weight_map.values():
        if not isinstance(shard, str) or not shard:
            return f"{index_name} has invalid shard names (each must be a non-empty file name)"
        shards.add(shard)
    unsafe = sorted(s for s in shards if PurePosixPath(s).is_absolute() or ".." in PurePosixPath(s).parts)
    if unsafe:
        return f"{index_name} has unsafe shard paths outside the folder: {unsafe}"
    missing = sorted(s for s in shards if not _has_bytes(folder.joinpath(*PurePosixPath(s).parts)))
    if missing:
        return f"{index_name} names missing or empty shards: {missing}"
    return None


def validate_hf_model_output(target_dir: str | Path) -> None:
    """Raise RuntimeError, listing every problem, unless ``target_dir`` holds a non-empty ``config.json`` (a JSON
    object) and complete weights: a non-empty ``model.safetensors`` / ``pytorch_model.bin``, or an index
    (``*.index.json``) whose shards all exist, non-empty, inside the folder."""
    folder = Path(target_dir)
    problems = []
    config_problem = _config_problem(folder)
    if config_problem:
        problems.append(config_problem)
    complete = any(_has_bytes(folder / name) for name in SINGLE_WEIGHT_FILES)
    index_problems = []
    for index_name in INDEX_FILES:
        if (folder / index_name).exists():
            problem = _index_problem(folder, index_name)
            if problem is None:
                complete = True
            else:
                index_problems.append(problem)
    if not complete:
        problems += index_problems
        problems.append(f"no complete model weights (looked for {', '.join(SINGLE_WEIGHT_FILES + INDEX_FILES)})")
    if problems:
        raise RuntimeError(f"{folder} is not a complete Hugging Face model: {'; '.join(problems)}")
