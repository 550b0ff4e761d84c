"""An OpenAI-compatible gateway on the rollout servers: train an existing agent unchanged, with token-exact
trajectories.

- :mod:`.server` — the HTTP server (Chat Completions, Completions, models), one per agent-loop worker process;
- :mod:`.session` — one sample's session: requests served through the request API, sampling and length rules;
- :mod:`.capture` — the token-exact record of a conversation (prefix matching, masks, log-probs, weight versions);
- :mod:`.agent_loop` — ``gateway_agent``, the loop that runs a user's agent (a function or a program) per sample.

See ``docs/agent_gateway.md``.
"""

from verl.experimental.agent_gateway.agent_loop import AgentCrashed, GatewayAgentLoop, load_agent
from verl.experimental.agent_gateway.capture import ConversationCapture, Trajectory, normalize_messages
from verl.experimental.agent_gateway.server import AgentGateway, shared_gateway
from verl.experimental.agent_gateway.session import GatewaySession, RequestError

__all__ = [
    "AgentCrashed",
    "AgentGateway",
    "ConversationCapture",
    "GatewayAgentLoop",
    "GatewaySession",
    "RequestError",
    "Trajectory",
    "load_agent",
    "normalize_messages",
    "shared_gateway",
]
