"""The one dtype table: every dtype key of the configs and engines reads `verl.utils.torch_dtypes`."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from verl.checkpoint_engine import get_checkpoint_engine
from verl.utils.torch_dtypes import DTYPE_NAMES, PrecisionType, canonical_dtype_name, to_torch_dtype
from verl.workers.config.engine import FSDPEngineConfig
from verl.workers.config.rollout import RolloutConfig


@pytest.mark.parametrize(
    ("spelling", "dtype"),
    [("fp32", torch.float32), ("float32", torch.float32), (32, torch.float32), ("bf16", torch.bfloat16),
     ("bfloat16", torch.bfloat16), (torch.bfloat16, torch.bfloat16), ("fp16", torch.float16), ("16", torch.float16)],
)  # fmt: skip
def test_veRL_spellings(spelling, dtype):
    assert to_torch_dtype(spelling) is dtype and PrecisionType.to_dtype(spelling) is dtype
    assert PrecisionType.supported_type(spelling)


def test_helpers_and_errors():
    assert PrecisionType.to_str("bfloat16") == "bf16" and PrecisionType.is_bf16(torch.bfloat16)
    assert PrecisionType.is_fp32("fp32") and PrecisionType.is_fp16(16) and not PrecisionType.is_fp16("int8")
    for bad in ("int8", torch.int64, "float64"):
        assert not PrecisionType.supported_type(bad)
        with pytest.raises(ValueError, match="unknown dtype"):
            canonical_dtype_name(bad)


def test_every_dtype_key_accepts_the_same_names():
    """The engine, the rollout and the checkpoint engine accept exactly the table's names (one table, not four)."""
    for name in DTYPE_NAMES:
        FSDPEngineConfig(dtype=name, model_dtype=name)
        RolloutConfig(dtype=name)
        assert get_checkpoint_engine({}, dtype=name).dtype is to_torch_dtype(name)
    with pytest.raises(ValueError, match="use one of"):
        RolloutConfig(dtype="half")


def test_importing_the_table_does_not_load_torch():
    code = "import sys, verl.utils.torch_dtypes as t; assert t.canonical_dtype_name('bf16') == 'bfloat16'; "
    code += "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
