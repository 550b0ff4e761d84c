"""veRL's ``verl.experimental.agent_loop.utils``: finding an agent-loop config file, and the gpt-oss tool-response
text that its chat template cannot render (the template needs the tool-call messages to format tool responses)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import verl

__all__ = [
    "add_generation_prompt_for_gpt_oss",
    "build_gpt_oss_tool_response_text",
    "format_gpt_oss_tool_response_manually",
    "resolve_config_path",
]


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def resolve_config_path(config_path: str) -> str:
    """The absolute path of ``config_path``: as given when absolute, else the first existing one of the working
    directory, the project root (the folder holding the ``verl`` package) and the ``verl`` package itself. A relative
    path that climbs out of its base (``../x``) is not looked up there.

    Raises:
        FileNotFoundError: found in none of them.
    """
    if os.path.isabs(config_path):
        return config_path
    package = Path(verl.__file__).resolve().parent
    for base in (Path.cwd().resolve(), package.parent, package):
        candidate = Path(os.path.abspath(base / config_path))
        if _inside(candidate, base) and candidate.exists():
            return str(candidate)
    raise FileNotFoundError(
        f"Agent loop configuration file not found: {config_path} (looked in the working directory {Path.cwd()}, "
        f"the project root {package.parent} and the verl package {package})"
    )


def format_gpt_oss_tool_response_manually(tool_response: str, tool_call_name: str) -> str:
    """One tool response in gpt-oss's harmony format, addressed from ``functions.<tool_call_name>``."""
    return f"<|start|>functions.{tool_call_name} to=assistant<|channel|>commentary<|message|>{tool_response}<|end|>"


def add_generation_prompt_for_gpt_oss(message_content: str) -> str:
    """``message_content`` followed by the assistant's turn opener."""
    return f"{message_content}<|start|>assistant"


def build_gpt_oss_tool_response_text(messages: list[dict[str, Any]], tool_call_names: list[str]) -> str:
    """The tool messages (``content`` each), formatted with their tools' names, then the generation prompt.

    Raises:
        ValueError: ``messages`` and ``tool_call_names`` differ in length.
    """
    if len(messages) != len(tool_call_names):
        raise ValueError(f"{len(messages)} tool messages but {len(tool_call_names)} tool names; they must pair up")
    parts = [format_gpt_oss_tool_response_manually(m["content"], n) for m, n in zip(messages, tool_call_names)]
    return add_generation_prompt_for_gpt_oss("".join(parts))
