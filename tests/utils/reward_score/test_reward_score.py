"""Rule rewards (gsm8k, MATH, the demo task) and the data-source routing of default_compute_score."""

from __future__ import annotations

import sys

import pytest

import verl.utils.reward_score as reward_score
from verl.utils.reward_score import arithmetic, default_compute_score, gsm8k, math_reward


class TestGsm8k:
    def test_strict_takes_the_number_after_the_last_marker(self):
        assert gsm8k.extract_solution("first #### 3 then\n#### 1,234.") == "1234"
        assert gsm8k.extract_solution("The answer is 5") is None
        assert gsm8k.compute_score("so #### 72", "72") == 1.0
        assert gsm8k.compute_score("so #### 72.00", "72") == 1.0  # same number
        assert gsm8k.compute_score("so #### 71", "72") == 0.0
        assert gsm8k.compute_score("so #### 71", "72", format_score=0.1) == 0.1
        assert gsm8k.compute_score("no marker 72", "72", format_score=0.1) == 0.0
        assert gsm8k.compute_score("#### -3", "-3") == 1.0
        assert gsm8k.compute_score("#### 1,200", "1200") == 1.0

    def test_only_the_tail_counts(self):
        assert gsm8k.compute_score("#### 72" + " filler" * 100, "72") == 0.0

    def test_flexible_takes_the_last_number(self):
        assert gsm8k.extract_solution("we get 3, then 4 apples.", method="flexible") == "4"
        assert gsm8k.extract_solution("no digits . here", method="flexible") is None
        assert gsm8k.compute_score("maybe 8 or 9", "9", method="flexible") == 1.0

    def test_unknown_method_raises(self):
        with pytest.raises(ValueError, match="'strict' or 'flexible'"):
            gsm8k.extract_solution("#### 1", method="loose")


class TestMathReward:
    def test_last_boxed_answer_with_nested_braces(self):
        text = r"first \boxed{1} then \boxed{\frac{1}{\sqrt{2}}} done"
        assert math_reward.last_boxed_only_string(text) == r"\boxed{\frac{1}{\sqrt{2}}}"
        assert math_reward.last_boxed_only_string(r"\fbox{3}") == r"\fbox{3}"
        assert math_reward.last_boxed_only_string(r"so $\boxed 5$ ok") == r"\boxed 5"
        assert math_reward.last_boxed_only_string(r"\boxed{unclosed") is None
        assert math_reward.last_boxed_only_string(r"\boxed") is None
        assert math_reward.last_boxed_only_string("none") is None
        assert math_reward.remove_boxed(r"\boxed{x+1}") == "x+1"
        assert math_reward.remove_boxed(r"\boxed 5") == "5"
        assert math_reward.remove_boxed("plain") == "plain"

    @pytest.mark.parametrize(
        ("answer", "truth"),
        [
            (r"\dfrac{1}{2}", r"\frac12"),
            ("0.5", "1/2"),
            (r"10\text{ cm}", "10"),
            (r"x = 3", "3"),
            (r"50\%", "50"),
            (r"90^\circ", "90"),
            (r"2\sqrt2", r"2\sqrt{2}"),
            (r"\left( 1, 2 \right)", "(1,2)"),
            (".5", "0.5"),
            (r"-\frac{3}{4}", "-0.75"),
            (r"\text{yes}", "yes"),
        ],
    )
    def test_equivalent_answers(self, answer, truth):
        assert math_reward.is_equiv(answer, truth)

    @pytest.mark.parametrize(("answer", "truth"), [("3", "4"), (r"\frac{1}{0}", "1"), ("x+1", "x+2"), (None, "1")])
    def test_different_answers(self, answer, truth):
        assert not math_reward.is_equiv(answer, truth)

    def test_is_equiv_of_two_missing_answers(self):
        assert math_reward.is_equiv(None, None)

    def test_compute_score(self):
        assert math_reward.compute_score(r"thus \boxed{\dfrac{1}{2}}.", "0.5") == 1.0
        assert math_reward.compute_score(r"thus \boxed{3}", r"\boxed{3}") == 1.0
        assert math_reward.compute_score(r"thus \boxed{3}", "4") == 0.0
        assert math_reward.compute_score("thus 3", "3") == 0.0


class TestMathVerify:
    def test_symbolic_equivalence(self):  # scripts/test.sh installs the `math` extra: this runs in CI
        from verl.utils.reward_score import math_verify

        assert math_verify.compute_score(r"so $\boxed{\frac{1}{2}}$", "0.5") == 1.0
        assert math_verify.compute_score(r"so $\boxed{x^2+2x+1}$", "(x+1)^2") == 1.0
        assert math_verify.compute_score(r"so $\boxed{3}$", r"\boxed{4}") == 0.0

    def test_missing_package_raises_with_the_install_hint(self, monkeypatch):
        from verl.utils.reward_score import math_verify

        monkeypatch.setitem(sys.modules, "math_verify", None)
        with pytest.raises(ImportError, match=r"verl\[math\]"):
            math_verify.compute_score(r"\boxed{1}", "1")


class TestArithmetic:
    """score = 0.2·starts + 0.4·closeness + 0.4·stop (module docstring); expected values worked by hand."""

    def test_right_bare_answer_scores_one(self):
        assert arithmetic.compute_score("7", "7", {"response_ended": True}) == {
            "score": 1.0,
            "acc": 1.0,
            "stop": 1.0,
            "pred": "7",
        }
        assert arithmetic.compute_score(" 12\n", 12)["score"] == 1.0  # no flag: a bare integer counts as ended

    def test_a_near_miss_earns_closeness(self):
        # 0.2 + 0.4·(1 − |6 − 7|/10) + 0.4·1 = 0.2 + 0.36 + 0.4
        assert arithmetic.compute_score("6", "7", {"response_ended": True})["score"] == pytest.approx(0.96)
        # far off: 0.2 + 0 + 0.4
        assert arithmetic.compute_score("50", "7", {"response_ended": True})["score"] == pytest.approx(0.6)

    def test_only_the_leading_number_counts(self):
        # "7 apples", ended: 0.2 + 0.4·1 + 0.4·0.5 (ended, but not bare)
        result = arithmetic.compute_score("7 apples", "7", {"response_ended": True})
        assert result == {"score": pytest.approx(0.8), "acc": 0.0, "stop": 0.5, "pred": "7"}
        # digits everywhere but cut off: the lead 77777777 is far → only the 0.2 for starting with a number
        assert arithmetic.compute_score("77777777", "7", {"response_ended": False})["score"] == pytest.approx(0.2)
        # no leading number: only an ended response earns anything (0.4·0.5)
        assert arithmetic.compute_score("x7", "7", {"response_ended": True})["score"] == pytest.approx(0.2)
        assert arithmetic.compute_score("x7", "7", {"response_ended": False})["score"] == 0.0
        assert arithmetic.compute_score("", "7", {"response_ended": True})["score"] == pytest.approx(0.2)
        assert arithmetic.compute_score("abc", "7")["score"] == 0.0  # no flag, not bare: not ended

    def test_a_right_number_cut_off_is_accurate_but_not_stopped(self):
        result = arithmetic.compute_score("7", "7", {"response_ended": False})
        assert result == {"score": pytest.approx(0.6), "acc": 1.0, "stop": 0.0, "pred": "7"}

    def test_very_long_numbers_are_not_answers(self):
        result = arithmetic.compute_score("9" * 5000, "7", {"response_ended": False})
        assert result == {"score": pytest.approx(0.2), "acc": 0.0, "stop": 0.0, "pred": ""}


class TestDefaultComputeScore:
    def test_routes_gsm8k(self):
        assert default_compute_score("openai/gsm8k", "#### 5", "5") == 1.0
        assert isinstance(default_compute_score("gsm8k", "#### 5", "6"), float)

    def test_routes_the_demo_task(self):
        result = default_compute_score(arithmetic.DATA_SOURCE, "7", "7", extra_info={"response_ended": True})
        assert result["score"] == 1.0

    @pytest.mark.parametrize("available", [True, False])
    def test_math_uses_math_verify_only_when_installed(self, monkeypatch, available):
        from verl.utils.reward_score import math_verify

        calls = []
        monkeypatch.setattr(reward_score, "math_verify_available", lambda: available)
        monkeypatch.setattr(math_verify, "compute_score", lambda s, t: calls.append("verify") or 1.0)
        monkeypatch.setattr(math_reward, "compute_score", lambda s, t: calls.append("rule") or 1.0)
        assert default_compute_score("lighteval/MATH", r"\boxed{1}", "1") == 1.0
        assert calls == ["verify" if available else "rule"]

    def test_math_end_to_end(self):
        assert default_compute_score("HuggingFaceH4/MATH-500", r"so \boxed{\frac{1}{2}}", "0.5") == 1.0

    def test_unknown_data_source_points_at_custom_reward_function(self):
        with pytest.raises(NotImplementedError, match="custom_reward_function.path"):
            default_compute_score("my/own", "x", "y")

    def test_math_verify_available_is_a_bool(self):
        assert isinstance(reward_score.math_verify_available(), bool)
