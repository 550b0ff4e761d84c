"""veRL's interaction interface: :class:`BaseInteraction`, a simulated user of a multi-turn rollout.

The tool agent loop starts one interaction per conversation (``start_interaction(request_id, **interaction_kwargs)``,
with the sample's ``extra_info.interaction_kwargs``; its ``name`` picks the interaction) and, after each model turn
without tool calls, asks it for the user's reply: ``generate_response(request_id, messages, **interaction_kwargs)``
→ ``(should_terminate_sequence, response_content, turn_score, extra)``. The reply becomes a user turn (masked out of
the loss); the turn scores are kept per sample in ``extra_fields["turn_scores"]``. ``finalize_interaction`` runs when
the conversation ends.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

__all__ = ["BaseInteraction"]


class BaseInteraction:
    """Base class of interactions.

    Args:
        config: the entry's ``config`` mapping, with ``name`` set to the entry's name.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = dict(config or {})
        self.name: str = self.config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        """Start a conversation's state; returns its id."""
        return instance_id or str(uuid4())

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        """The user's reply to the conversation so far: (stop here, reply text, this turn's score, extra data)."""
        return False, "Your current result seems acceptable.", 0.8, {}

    async def calculate_score(self, instance_id: str | None = None, **kwargs: Any) -> float:
        """The conversation's score."""
        return 0.0

    async def finalize_interaction(self, instance_id: str | None = None, **kwargs: Any) -> None:
        """Drop the conversation's state."""
