"""DAPO's math scorer (``verl.utils.reward_score.math_dapo``) on hand-worked responses, and its routing."""

from __future__ import annotations

import pytest

from verl.utils import reward_score
from verl.utils.reward_score import default_compute_score, math_dapo
from verl.utils.reward_score.math_dapo import compute_score, normalize_final_answer


def right(pred: str) -> dict:
    return {"score": 1.0, "acc": True, "pred": pred}


def wrong(pred: str) -> dict:
    return {"score": -1.0, "acc": False, "pred": pred}


class TestAnswerLine:
    def test_a_correct_answer_scores_one(self):
        assert compute_score("3 + 4 = 7, so\nAnswer: 7", "7") == right("7")

    def test_a_wrong_answer_scores_minus_one(self):
        assert compute_score("3 + 4 = 8, so\nAnswer: 8", "7") == wrong("8")

    def test_no_answer_line_is_invalid(self):
        # "answer is" without a colon is no answer line; nor is a bare number
        assert compute_score("So the answer is 7", "7") == wrong("[INVALID]")
        assert compute_score("7", "7") == wrong("[INVALID]")
        assert compute_score("", "7") == wrong("[INVALID]")

    def test_the_last_answer_line_counts_in_any_case(self):
        assert compute_score("Answer: 3\nno, wait.\nanswer : 7", "7") == right("7")
        assert compute_score("ANSWER:7", "7") == right("7")
        assert compute_score("Answer: 7\nAnswer: 3", "7") == wrong("3")

    def test_the_answer_runs_to_the_end_of_its_line(self):
        # \s* after the colon crosses a newline, so an answer on the next line is read too
        assert compute_score("Answer:\n7", "7") == right("7")
        assert compute_score("Answer: 7 because 3 + 4 = 7\nthe end", "7") == right("7")  # after the last "="

    def test_only_the_last_300_characters_are_read(self):
        assert compute_score("Answer: 7\n" + "." * 290, "7") == right("7")
        assert compute_score("Answer: 7\n" + "." * 300, "7") == wrong("[INVALID]")

    def test_a_non_string_ground_truth_is_compared_as_text(self):
        assert compute_score("Answer: 42", 42) == right("42")


class TestNormalisation:
    @pytest.mark.parametrize(
        "response, truth, pred",
        [
            ("Answer: $1,000$ dollars", "1000", "1000"),  # math span, unit word, thousands separator
            ("Answer: x = 5", "5", "5"),  # what follows the last "="
            ("Answer: 90^\\circ", "90", "90"),  # degree sign
            ("Answer: 12 cm", "12", "12"),  # unit
            ("Answer: \\boxed{42}", "42", "42"),  # a box inside the answer line
            ("Answer: \\text{(B)}", "(B)", "(B)"),  # \text{} unwrapped
            ("Answer: \\frac12", "\\frac{1}{2}", "\\frac{1}{2}"),  # TeX shorthand
            ("Answer: \\sqrt2", "\\sqrt{2}", "\\sqrt{2}"),
            ("Answer: $7.$", "7", "7"),  # a period just before the closing $ goes
            ("Answer: an apple", "apple", "apple"),  # articles
        ],
    )
    def test_equivalent_forms_agree(self, response, truth, pred):
        assert compute_score(response, truth) == right(pred)

    @pytest.mark.parametrize(
        "response, truth, pred",
        [
            ("Answer: 0.5", "\\frac{1}{2}", "0.5"),  # textual, not symbolic
            ("Answer: 7.", "7", "7."),  # a bare trailing period stays
            ("Answer: 1000.0", "1000", "1000.0"),
        ],
    )
    def test_different_forms_disagree(self, response, truth, pred):
        assert compute_score(response, truth) == wrong(pred)

    def test_the_ground_truth_is_normalised_too(self):
        assert normalize_final_answer("$1,000$") == "1000"
        assert compute_score("Answer: 1000", "$1,000$") == right("1000")

    def test_a_separator_stays_unless_the_answer_is_an_integer(self):
        assert normalize_final_answer("1,2") == "12"
        assert normalize_final_answer("(1,2)") == "(1,2)"


class TestStrictBox:
    def test_the_last_box_of_the_tail_is_compared_as_written(self):
        assert compute_score("so \\boxed{3} or rather \\boxed{7}", "7", strict_box_verify=True) == right("7")
        # no normalisation: shorthand and spacing matter
        assert compute_score("\\boxed{\\frac12}", "\\frac{1}{2}", strict_box_verify=True) == wrong("\\frac12")
        assert compute_score("Answer: 7", "7", strict_box_verify=True) == wrong("[INVALID]")

    def test_a_box_before_the_last_100_characters_is_not_read(self):
        assert compute_score("\\boxed{7}" + "." * 95, "7", strict_box_verify=True) == wrong("[INVALID]")
        assert compute_score("\\boxed{7}" + "." * 90, "7", strict_box_verify=True) == right("7")

    def test_pause_tokens_move_the_window(self):
        text = "\\boxed{7}" + "." * 200
        assert compute_score(text, "7", strict_box_verify=True, pause_tokens_index=[0, 1, 2, 50]) == right("7")
        assert compute_score(text, "7", strict_box_verify=True, pause_tokens_index=[0, 1, 2, 150]) == wrong("[INVALID]")
        with pytest.raises(ValueError, match="4 positions"):
            compute_score(text, "7", strict_box_verify=True, pause_tokens_index=[50])


class TestBoxes:
    def test_last_boxed_only_string_balances_braces(self):
        assert math_dapo.last_boxed_only_string("\\boxed{1} \\boxed{\\frac{1}{2}} end") == "\\boxed{\\frac{1}{2}}"
        assert math_dapo.last_boxed_only_string("\\boxed{open") is None
        assert math_dapo.last_boxed_only_string("none") is None

    def test_remove_boxed(self):
        assert math_dapo.remove_boxed("\\boxed{x+1}") == "x+1"
        with pytest.raises(ValueError, match=r"not a \\boxed\{\.\.\.\} expression: 'x\+1'"):
            math_dapo.remove_boxed("x+1")

    def test_a_boxed_ground_truth_can_be_extracted(self):
        assert math_dapo.is_correct_minerva("Answer: 7", "so \\boxed{7}", gt_need_extract=True) == (True, "7")


class TestRouting:
    @pytest.mark.parametrize("source", ["math_dapo", "math", "math_dapo_reasoning", "aime24", "aime_2025", "aime"])
    def test_dapo_sources_use_the_dapo_rule(self, source):
        assert default_compute_score(source, "Answer: 7", "7") == right("7")
        assert default_compute_score(source, "7", "7") == wrong("[INVALID]")

    def test_the_math_datasets_keep_their_boxed_rule(self, monkeypatch):
        # without the optional math-verify (its rule reads "Answer: 7" too): the boxed rule, not DAPO's answer line
        monkeypatch.setattr(reward_score, "math_verify_available", lambda: False)
        assert default_compute_score("lighteval/MATH", "\\boxed{7}", "7") == 1.0
        assert default_compute_score("HuggingFaceH4/MATH-500", "Answer: 7", "7") == 0.0
