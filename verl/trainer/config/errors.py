"""`ConfigError`: what config validation raises (every problem at once)."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """The config has problems; the message lists every one of them."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} problem(s) in the config:\n{lines}")
