"""temp_env_var sets a variable for a block and puts back what was there."""

import os

import pytest

from verl.utils.py_functional import temp_env_var


def test_temp_env_var_restores_previous_value_or_absence(monkeypatch):
    monkeypatch.setenv("VERL_TEST_A", "before")
    monkeypatch.delenv("VERL_TEST_B", raising=False)
    with temp_env_var("VERL_TEST_A", "inside"), temp_env_var("VERL_TEST_B", ""):
        assert os.environ["VERL_TEST_A"] == "inside" and os.environ["VERL_TEST_B"] == ""
    assert os.environ["VERL_TEST_A"] == "before" and "VERL_TEST_B" not in os.environ


def test_temp_env_var_restores_on_exception(monkeypatch):
    monkeypatch.delenv("VERL_TEST_A", raising=False)
    with pytest.raises(RuntimeError), temp_env_var("VERL_TEST_A", "x"):
        raise RuntimeError("boom")
    assert "VERL_TEST_A" not in os.environ
