"""Network helpers for process-group rendezvous: this node's IP and a free TCP port (imports neither torch nor
anything heavy, so a Ray task that only asks for an address starts fast)."""

from __future__ import annotations

import socket

__all__ = ["get_free_port", "get_node_ip", "node_ip_and_free_port"]


def get_node_ip() -> str:
    """This node's IP address as Ray sees it (loopback when Ray is not running)."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - fall back to a local answer outside Ray
        pass
    return "127.0.0.1"


def get_free_port() -> int:
    """A TCP port that is free on this node right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def node_ip_and_free_port() -> tuple[str, int]:
    """``(get_node_ip(), get_free_port())``: where rank 0 of a new worker group listens."""
    return get_node_ip(), get_free_port()
