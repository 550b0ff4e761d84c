"""The generative-reward example's parts (``examples/generative_reward``): the grades its judge is taught and the
data it is taught on. Its scoring function is exercised against a served judge in ``test_reward_router.py``; the
whole example (a judge SFT of 1,024 steps, then 80 GRPO steps) takes minutes and is measured in docs/rewards.md, not
run here."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl.utils.demo import ensure_demo_assets
from verl.utils.import_utils import load_module

DATA = load_module(str(Path(__file__).resolve().parents[3] / "examples" / "generative_reward" / "build_judge_data.py"))


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("", 0),  # nothing
        ("seven", 0),  # no number
        ("19 and more", 1),  # a number, far, more text
        ("19", 2),  # only a number, far
        (" 13 ", 3),  # within 6 (spaces do not count)
        ("10", 4),  # within 3
        ("8", 5),  # within 1
        ("7", 6),  # right
        ("7?", 5),  # right, then more text
        ("77", 2),  # a number run into another is another number
    ],
)
def test_each_grade_is_one_more_thing_the_policy_got_right(answer, expected):
    assert DATA.grade(answer, "7") == expected


def test_the_judge_data_holds_every_grade_for_every_question(tmp_path):
    assets = ensure_demo_assets(tmp_path / "verl_cache")
    vocabulary = DATA.vocabulary_of(assets.tokenizer_path)
    assert vocabulary and not any(piece.startswith("<|") for piece in vocabulary)
    rows = DATA.build(assets.val_files, 1, vocabulary)
    assert len(rows) == 128 * 12  # twelve answers per question
    assert set(rows.response) == {f"score: {g}" for g in range(DATA.MAX_GRADE + 1)}
    for messages, verdict in zip(rows.prompt, rows.response, strict=True):
        reference, answer = messages[0]["content"].removeprefix("Reference: ").split(" Answer: ", 1)
        assert verdict == f"score: {DATA.grade(answer, reference)}"
    assert rows.equals(DATA.build(assets.val_files, 1, vocabulary))  # the same data for the same seed
