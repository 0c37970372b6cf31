"""Readiness probes: a shard's gRPC `Health` over its unix socket, the router's HTTP /health.

The launcher shares no code with the shard, so the gRPC call is made with raw bytes: the
empty `HealthRequest` message serializes to b"".
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

SHARD_HEALTH_METHOD = "/textgen.shard.v1.TextGenerationShard/Health"


def shard_is_healthy(socket_path: Path, timeout: float = 2.0) -> bool:
    import grpc

    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        health = channel.unary_unary(SHARD_HEALTH_METHOD)
        try:
            health(b"", timeout=timeout)
        except grpc.RpcError:
            return False
    return True


def probe_host(hostname: str) -> str:
    """Where to reach a server bound to `hostname` from this machine."""
    if hostname in ("0.0.0.0", ""):
        return "127.0.0.1"
    if hostname == "::":
        return "[::1]"
    if ":" in hostname and not hostname.startswith("["):
        return f"[{hostname}]"
    return hostname


def health_url(hostname: str, port: int) -> str:
    return f"http://{probe_host(hostname)}:{port}/health"


# The router is local: an http_proxy in the environment must not intercept the probe.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def router_is_healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        with _DIRECT.open(url, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False
