"""Judge data for the generative-reward example: answers to the arithmetic task, good and bad, with the grade a
judge should give.

    python examples/generative_reward/build_judge_data.py --train $TRAIN --val $VAL --tokenizer $MODEL --out judge_data

For each question of the task's parquet files (veRL's schema: ``prompt`` messages, ``reward_model.ground_truth``),
several candidate answers — what a policy says early (tokens drawn at random from ``--tokenizer``'s vocabulary),
numbers at every distance from the reference and the reference itself, each bare or followed by more text — as a
chat asking the judge to compare the answer with the reference (``Reference: 7 Answer: 8``), and the grade
``score: 0`` … ``score: 6`` (:func:`grade`). Writes ``train.parquet`` and ``val.parquet`` with columns ``prompt``
(messages) and ``response`` (the verdict), the SFT trainer's single-turn layout.

Why graded: a policy trained from scratch never says the right number at first, so a judge that only says right or
wrong gives every sample of a group the same reward, and GRPO nothing to learn from. Each grade step is one thing the
policy can learn at a time: say a number, say only the number, come nearer (three steps), be right.
"""

from __future__ import annotations

import argparse
import os
import random
import re

import pandas as pd

MAX_GRADE = 6
NEARER = (6, 3, 1)  # a point for each of these distances to the reference that the answer is within
_LEAD = re.compile(r"[-+]?\d+")


def judge_prompt(answer: str, reference: str) -> list[dict[str, str]]:
    """The chat a judge gets: the reference answer next to the answer to check (a tiny model learns to compare them
    far sooner than with the question between them)."""
    return [{"role": "user", "content": f"Reference: {reference} Answer: {answer}"}]


def grade(answer: str, reference: str) -> int:
    """The grade a judge should give, 0 … ``MAX_GRADE``: one point each for starting with a number, for saying only
    that number, for a number within each distance of ``NEARER`` from the reference, and for the reference itself."""
    text = answer.strip()
    lead = _LEAD.match(text)
    if lead is None:
        return 0
    distance = abs(int(lead.group()) - int(reference))
    return 1 + (lead.group() == text) + sum(distance <= d for d in NEARER) + (distance == 0)


def verdict(answer: str, reference: str) -> str:
    """What the judge should say."""
    return f"score: {grade(answer, reference)}"


def candidates(reference: str, rng: random.Random, vocabulary: list[str]) -> list[str]:
    """Twelve answers to one question: random tokens (what an untrained policy says) and a number at each grade's
    distance from the reference (the reference itself included), each number bare and once followed by random
    tokens."""

    def noise() -> str:
        return "".join(rng.choice(vocabulary) for _ in range(rng.randint(1, 7)))

    value = int(reference)
    bounds = (0, *reversed(NEARER), 30)
    numbers = [reference]
    for low, high in zip(bounds, bounds[1:], strict=False):  # a distance in (low, high]
        offsets = [o for o in range(-high, high + 1) if low < abs(o) <= high and value + o >= 0]
        numbers.append(str(value + rng.choice(offsets)))
    answers = [noise(), noise()]
    for number in numbers:
        answers += [number, number + noise()]
    return answers


def vocabulary_of(tokenizer_path: str) -> list[str]:
    """The decoded text of every ordinary token of the tokenizer (a decoded answer has no ChatML markers)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    pieces = (tokenizer.decode([i]) for i in range(len(tokenizer)))
    return [piece for piece in pieces if not piece.startswith("<|")]


def build(path: str, seed: int, vocabulary: list[str]) -> pd.DataFrame:
    """The judge rows for every question of the task's parquet file at ``path``."""
    rng = random.Random(seed)
    rows = []
    for _, row in pd.read_parquet(path).iterrows():
        reference = str(row["reward_model"]["ground_truth"])
        for answer in candidates(reference, rng, vocabulary):
            rows.append({"prompt": judge_prompt(answer, reference), "response": verdict(answer, reference)})
    rng.shuffle(rows)
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", required=True, help="the task's train parquet")
    parser.add_argument("--val", required=True, help="the task's validation parquet")
    parser.add_argument("--tokenizer", required=True, help="the policy's tokenizer (its tokens are the noise)")
    parser.add_argument("--out", required=True, help="folder for train.parquet and val.parquet")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    vocabulary = vocabulary_of(args.tokenizer)
    for split, path, seed in (("train", args.train, 0), ("val", args.val, 1)):
        frame = build(path, seed, vocabulary)
        frame.to_parquet(os.path.join(args.out, f"{split}.parquet"))
        print(f"{split}: {len(frame)} rows, grades {frame['response'].value_counts().sort_index().to_dict()}")


if __name__ == "__main__":
    main()
