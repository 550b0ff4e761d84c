"""``_score_timeout`` (veRL 0.10's SIGALRM guard) and the ``compute_score_timeout`` alias of ``timeout_s``."""

import time

import pytest

from verl.workers.reward_manager.naive import NaiveRewardManager, _score_timeout


def test_score_timeout_cuts_a_slow_block_and_restores_the_handler():
    import signal

    before = signal.getsignal(signal.SIGALRM)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="timed out after 0.2s"):
        with _score_timeout(0.2):
            time.sleep(3)
    assert time.monotonic() - start < 2
    assert signal.getsignal(signal.SIGALRM) is before
    with _score_timeout(0):  # disabled
        time.sleep(0.01)


def test_compute_score_timeout_sets_the_pool_limit():
    manager = NaiveRewardManager(None, 0, compute_score=lambda **_: 1.0, compute_score_timeout=1.5, num_workers=0)
    assert manager.timeout_s == 1.5
    with pytest.raises(TypeError, match="either compute_score_timeout or timeout_s"):
        NaiveRewardManager(None, 0, compute_score_timeout=1.0, timeout_s=2.0)
