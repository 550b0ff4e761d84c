"""update_model_config applies nested overrides to a config object."""

from types import SimpleNamespace

from omegaconf import OmegaConf

from verl.utils.model import update_model_config


def test_update_model_config_recurses_merges_and_adds():
    config = SimpleNamespace(
        hidden_size=8,
        text_config=SimpleNamespace(vocab_size=100, layers=2),
        rope_scaling={"type": "linear", "factor": 2.0},
        quantization=None,
    )
    overrides = OmegaConf.create(
        {
            "hidden_size": 16,
            "text_config": {"vocab_size": 50},  # a config object: recursed into, layers kept
            "rope_scaling": {"factor": 4.0},  # a dict: merged, type kept
            "quantization": {"bits": 4},  # None: replaced by a plain dict
            "new_flag": True,
        }
    )
    update_model_config(config, overrides)
    assert config.hidden_size == 16 and config.new_flag is True
    assert (config.text_config.vocab_size, config.text_config.layers) == (50, 2)
    assert config.rope_scaling == {"type": "linear", "factor": 4.0}
    assert config.quantization == {"bits": 4} and type(config.quantization) is dict
