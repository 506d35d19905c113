"""Free loopback ports for the servers the tests start (Ray heads, SeaweedFS, MLflow, vLLM's server).

A port the kernel hands out for `bind(0)` comes from its ephemeral range, the same range every outgoing
connection and every Ray worker's own listener draws from: between our close and the server's bind another
process can take it (CI lost a SeaweedFS start that way). These ports come from below the ephemeral range and
above Ray's worker ports (10002-19999 by default), where only servers told a port by a test listen."""

from __future__ import annotations

import random
import socket
from pathlib import Path

RAY_WORKER_PORTS_END = 19999  # `ray start --max-worker-port`'s default


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """`count` distinct ports nothing listens on, outside the ephemeral and Ray worker ranges."""
    low, high = RAY_WORKER_PORTS_END + 1, _ephemeral_start() - 1
    chosen: list[int] = []
    for port in random.sample(range(low, high + 1), k=min(high - low + 1, 50 * count)):
        if _bindable(port):
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise RuntimeError(f"found only {len(chosen)} of {count} free ports in {low}-{high}")


def free_port() -> int:
    return free_ports(1)[0]
