"""``should_save_ckpt_esi``: save when the capacity block expires before another step plus a save would finish."""

from __future__ import annotations

import logging
import time

import pytest

from verl.utils.checkpoint.checkpoint_manager import (
    ESI_EXPIRATION_ENV_AWS,
    ESI_EXPIRATION_ENV_MLP,
    should_save_ckpt_esi,
)


@pytest.fixture(autouse=True)
def no_expiration(monkeypatch):
    monkeypatch.delenv(ESI_EXPIRATION_ENV_MLP, raising=False)
    monkeypatch.delenv(ESI_EXPIRATION_ENV_AWS, raising=False)


def expires_in(monkeypatch, name: str, seconds: float) -> None:
    monkeypatch.setenv(name, str(time.time() + seconds))


def test_without_an_expiration_never_saves():
    assert should_save_ckpt_esi(10_000, save_ckpt_duration=10_000) is False


def test_mlp_saves_only_inside_the_window_before_expiry(monkeypatch):
    # budget = 60 (save) + 100 (step) + 20 (margin) = 180 s
    expires_in(monkeypatch, ESI_EXPIRATION_ENV_MLP, 170)
    assert should_save_ckpt_esi(100, redundant_time=20) is True
    expires_in(monkeypatch, ESI_EXPIRATION_ENV_MLP, 190)  # one more step and a save still fit
    assert should_save_ckpt_esi(100, redundant_time=20) is False
    assert should_save_ckpt_esi(100, save_ckpt_duration=71, redundant_time=20) is True  # 191 s budget
    expires_in(monkeypatch, ESI_EXPIRATION_ENV_MLP, -5)  # already expired: too late to save
    assert should_save_ckpt_esi(100) is False
    expires_in(monkeypatch, ESI_EXPIRATION_ENV_MLP, 10)
    assert should_save_ckpt_esi(0) is False  # no step timed yet


def test_mlp_is_read_before_sagemaker(monkeypatch):
    expires_in(monkeypatch, ESI_EXPIRATION_ENV_MLP, 10_000)
    expires_in(monkeypatch, ESI_EXPIRATION_ENV_AWS, 10)
    assert should_save_ckpt_esi(100) is False


def test_sagemaker_saves_inside_the_window_and_after_expiry(monkeypatch):
    expires_in(monkeypatch, ESI_EXPIRATION_ENV_AWS, 150)
    assert should_save_ckpt_esi(100) is True  # 150 < 160
    expires_in(monkeypatch, ESI_EXPIRATION_ENV_AWS, 170)
    assert should_save_ckpt_esi(100) is False
    expires_in(monkeypatch, ESI_EXPIRATION_ENV_AWS, -5)
    assert should_save_ckpt_esi(100) is True  # veRL's rule: any time past the threshold


def test_a_malformed_timestamp_does_not_save_and_warns(monkeypatch, caplog):
    monkeypatch.setenv(ESI_EXPIRATION_ENV_AWS, "tomorrow")
    with caplog.at_level(logging.WARNING):
        assert should_save_ckpt_esi(100) is False
    assert ESI_EXPIRATION_ENV_AWS in caplog.text and "tomorrow" in caplog.text
