"""Judge data for the generative-reward example: the arithmetic task's answers, right and wrong, with the verdict a
judge should give.

    python examples/generative_reward/build_judge_data.py --train $TRAIN --val $VAL --out judge_data

For each question of the task's parquet files (veRL's schema: ``prompt`` messages, ``reward_model.ground_truth``),
several candidate answers — the right one, near misses, other numbers — each as a chat asking the judge to compare
the answer with the reference (``Reference: 7 Answer: 8``), and the verdict ``score: 1`` (they match) or
``score: 0``. Half the rows are right. Writes ``train.parquet`` and ``val.parquet`` with columns ``prompt``
(messages) and ``response`` (the verdict), the SFT trainer's single-turn layout.
"""

from __future__ import annotations

import argparse
import os
import random

import pandas as pd


def judge_prompt(question: str, answer: str, reference: str) -> list[dict[str, str]]:
    """The chat a judge gets: the reference answer, then the answer to check (next to each other: a tiny model
    learns to compare them far sooner than with the question between; ``question`` is not shown)."""
    return [{"role": "user", "content": f"Reference: {reference} Answer: {answer}"}]


def verdict(answer: str, reference: str) -> str:
    """What the judge should say."""
    return "score: 1" if answer.strip() == reference.strip() else "score: 0"


def candidates(reference: str, rng: random.Random) -> list[str]:
    """The right answer three times (half the rows are right) and three wrong ones: a near miss, another number, and
    what a policy early in training says (nothing, a number repeated, a number run into another)."""
    value = int(reference)
    near = value + rng.choice([-2, -1, 1, 2])
    other = rng.choice([n for n in range(0, 19) if n != value])
    malformed = rng.choice(["", f"{reference} {reference}", f"{reference}{rng.randint(0, 9)}", f"{near}?"])
    return [reference, reference, reference, str(near), str(other), malformed]


def build(path: str, seed: int) -> pd.DataFrame:
    rng = random.Random(seed)
    rows = []
    for _, row in pd.read_parquet(path).iterrows():
        question = row["prompt"][0]["content"]
        reference = str(row["reward_model"]["ground_truth"])
        for answer in candidates(reference, rng):
            rows.append({"prompt": judge_prompt(question, answer, reference), "response": verdict(answer, reference)})
    rng.shuffle(rows)
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", required=True, help="the task's train parquet")
    parser.add_argument("--val", required=True, help="the task's validation parquet")
    parser.add_argument("--out", required=True, help="folder for train.parquet and val.parquet")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for split, path, seed in (("train", args.train, 0), ("val", args.val, 1)):
        frame = build(path, seed)
        frame.to_parquet(os.path.join(args.out, f"{split}.parquet"))
        print(f"{split}: {len(frame)} rows, {sum(r == 'score: 1' for r in frame['response'])} right")


if __name__ == "__main__":
    main()
