"""verl: a single-controller, hybrid-engine RL post-training library for LLMs."""

import logging

from verl.version import __version__

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = ["DataProto", "__version__"]


def __getattr__(name: str):
    # DataProto pulls in torch and tensordict; import it on first use so `import verl` stays light.
    if name == "DataProto":
        from verl.protocol import DataProto

        return DataProto
    raise AttributeError(f"module 'verl' has no attribute {name!r}")
