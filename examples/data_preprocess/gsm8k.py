"""Convert GSM8K to veRL's parquet schema (train.parquet, test.parquet).

    python examples/data_preprocess/gsm8k.py --local_dataset_path ~/datasets/gsm8k --local_save_dir ~/data/gsm8k

``--local_dataset_path``: a local copy in the public GSM8K layout, a folder holding the train and test splits as
parquet (Hugging Face layout: ``main/train-00000-of-00001.parquet``, ...) or JSON lines (GitHub layout:
``train.jsonl``, ``test.jsonl``), each row with ``question`` and an ``answer`` that ends with ``#### <number>``.
Without it the script asks the Hugging Face hub for ``openai/gsm8k`` (needs network access).

Each output row: ``data_source`` "openai/gsm8k", the question plus an instruction as a one-message chat ``prompt``,
``reward_model.ground_truth`` the number after ``####`` (commas removed), and ``extra_info`` with the split, index,
raw question and raw answer.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import re
import sys
from typing import Any

logger = logging.getLogger("gsm8k")

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
_FINAL_ANSWER = re.compile(r"####\s*(-?[0-9.,]+)\s*$")


def find_split(root: str, split: str) -> str:
    """The file of ``split`` under ``root``: ``*<split>*.parquet`` or ``*<split>*.jsonl``, preferring the ``main``
    config of the Hugging Face layout."""
    if os.path.isfile(root):
        raise ValueError(f"--local_dataset_path={root!r} must be a folder holding the train and test files")
    found = sorted(
        p
        for ext in ("parquet", "jsonl")
        for p in glob.glob(os.path.join(root, "**", f"*{split}*.{ext}"), recursive=True)
        if "socratic" not in os.path.relpath(p, root)
    )
    if not found:
        raise FileNotFoundError(f"no {split} split (*{split}*.parquet or *{split}*.jsonl) under {root!r}")
    main = [p for p in found if f"{os.sep}main{os.sep}" in p]
    return (main or found)[0]


def read_rows(path: str) -> list[dict[str, Any]]:
    """Rows of a parquet or JSON-lines file."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    rows = []
    with open(path) as f:
        for line_no, line in enumerate(f):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}: row {line_no}: not valid JSON: {e}") from e
    return rows


def convert(rows: list[dict[str, Any]], split: str, source: str) -> list[dict[str, Any]]:
    """GSM8K rows → veRL rows; a row without a question or a ``#### <n>`` answer raises, naming file, row, field."""
    out = []
    for index, row in enumerate(rows):
        question, answer = row.get("question"), row.get("answer")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{source}: row {index}: field 'question': expected a non-empty string, got {question!r}")
        match = _FINAL_ANSWER.search(answer) if isinstance(answer, str) else None
        if match is None:
            raise ValueError(f"{source}: row {index}: field 'answer': must end with '#### <number>', got {answer!r}")
        out.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": match.group(1).replace(",", "")},
                "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
            }
        )
    return out


def _load_from_hub() -> dict[str, list[dict[str, Any]]]:
    import datasets

    ds = datasets.load_dataset("openai/gsm8k", "main")
    return {split: list(ds[split]) for split in ("train", "test")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local_dataset_path", default=None, help="local copy of GSM8K (parquet or jsonl)")
    parser.add_argument("--local_save_dir", default="~/data/gsm8k", help="where train.parquet / test.parquet go")
    parser.add_argument("--local_dir", default=None, help="deprecated alias of --local_save_dir")
    args = parser.parse_args(argv)

    import pyarrow as pa
    import pyarrow.parquet as pq

    if args.local_dataset_path:
        root = os.path.expanduser(args.local_dataset_path)
        sources = {split: find_split(root, split) for split in ("train", "test")}
        raw = {split: read_rows(path) for split, path in sources.items()}
    else:
        sources = {split: f"openai/gsm8k[{split}]" for split in ("train", "test")}
        try:
            raw = _load_from_hub()
        except Exception as e:
            logger.error("could not download openai/gsm8k (%s: %s); pass --local_dataset_path", type(e).__name__, e)
            return 1
    out = os.path.expanduser(args.local_dir or args.local_save_dir)
    os.makedirs(out, exist_ok=True)
    for split, rows in raw.items():
        path = os.path.join(out, f"{split}.parquet")
        pq.write_table(pa.Table.from_pylist(convert(rows, split, sources[split])), path)
        logger.info("wrote %d rows to %s", len(rows), path)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(main())
