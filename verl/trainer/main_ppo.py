"""``python -m verl.trainer.main_ppo [hydra overrides]``: the PPO/GRPO training entry point.

The trainer (config schema, driver, workers) is not built yet; until it is, this command keeps its command line and
stops with a clear message instead of pretending to train.
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger(__name__)

NOT_BUILT_MESSAGE = (
    "verl.trainer.main_ppo: the trainer is not built yet in this version of verl "
    "(DataProto and the Ray single controller are; the PPO driver, workers and config come next). "
    "Overrides received: {overrides}"
)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status (2: not available yet)."""
    overrides = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logger.error(NOT_BUILT_MESSAGE.format(overrides=overrides or "none"))
    return 2


if __name__ == "__main__":
    sys.exit(main())
