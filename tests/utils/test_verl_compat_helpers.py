"""veRL's small helper modules that forks import: ``verl.utils.attention_utils`` (flash-attn's padding helpers),
``verl.utils.debug`` (the profiler's names) and ``verl.experimental.agent_loop.utils``."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from verl.experimental.agent_loop import utils as agent_utils
from verl.utils import attention_utils, debug, profiler
from verl.utils.debug import performance


def test_unpad_index_and_pad_round_trip_like_flash_attn():
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 1]])
    ids = torch.arange(12).reshape(3, 4)
    hidden, indices, cu_seqlens, max_seqlen, seqused = attention_utils.unpad_input(ids.unsqueeze(-1), mask)
    assert hidden.squeeze(-1).tolist() == [1, 2, 4, 5, 6, 7, 11]
    assert indices.tolist() == [1, 2, 4, 5, 6, 7, 11]
    assert cu_seqlens.tolist() == [0, 2, 6, 7] and cu_seqlens.dtype == torch.int32
    assert max_seqlen == 4 and seqused.tolist() == [2, 4, 1]
    flat = attention_utils.rearrange(ids.unsqueeze(-1), "b s ... -> (b s) ...")
    assert torch.equal(attention_utils.index_first_axis(flat, indices), hidden)
    padded = attention_utils.pad_input(hidden, indices, 3, 4).squeeze(-1)
    assert torch.equal(padded, ids * mask)
    assert torch.equal(attention_utils.rearrange(flat, "(b s) ... -> b s ...", b=3), ids.unsqueeze(-1))
    # an unused (kept but not attended) token counts in cu_seqlens, not in seqused
    unused = torch.tensor([[0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0]])
    _, indices, cu_seqlens, _, seqused = attention_utils.unpad_input(ids.unsqueeze(-1), mask, unused)
    assert indices.tolist()[:3] == [1, 2, 3] and cu_seqlens.tolist() == [0, 3, 7, 8]
    assert seqused.tolist() == [2, 4, 1]


def test_unpad_input_rejects_a_mask_of_another_shape():
    with pytest.raises(ValueError, match="must start with the mask's shape"):
        attention_utils.unpad_input(torch.zeros(2, 3, 1), torch.ones(2, 4))


@pytest.mark.skipif(importlib.util.find_spec("einops") is not None, reason="einops handles every pattern")
def test_rearrange_without_einops_names_it_for_other_patterns():
    with pytest.raises(ImportError, match="needs einops"):
        attention_utils.rearrange(torch.zeros(2, 3), "b s -> s b")


def test_debug_re_exports_the_profilers_names():
    for name in debug.__all__:
        assert getattr(debug, name) is getattr(profiler, name), name
    assert performance.reduce_timing is profiler.reduce_timing and performance.simple_timer is profiler.simple_timer


def test_resolve_config_path_searches_cwd_then_the_project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "loops.yaml").write_text("[]")
    assert agent_utils.resolve_config_path("loops.yaml") == str(tmp_path / "loops.yaml")
    assert agent_utils.resolve_config_path("/abs/anything.yaml") == "/abs/anything.yaml"
    in_project = agent_utils.resolve_config_path("verl/trainer/config/ppo_trainer.yaml")
    assert os.path.isfile(in_project)
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        agent_utils.resolve_config_path("missing.yaml")
    (tmp_path.parent / "outside.yaml").write_text("[]")
    with pytest.raises(FileNotFoundError):  # a path climbing out of the working directory is not followed
        agent_utils.resolve_config_path("../outside.yaml")


def test_gpt_oss_tool_responses():
    text = agent_utils.build_gpt_oss_tool_response_text([{"content": "42"}, {"content": "ok"}], ["calc", "search"])
    assert text == (
        "<|start|>functions.calc to=assistant<|channel|>commentary<|message|>42<|end|>"
        "<|start|>functions.search to=assistant<|channel|>commentary<|message|>ok<|end|><|start|>assistant"
    )
    with pytest.raises(ValueError, match="2 tool messages but 1 tool names"):
        agent_utils.build_gpt_oss_tool_response_text([{"content": "a"}, {"content": "b"}], ["x"])
