"""Free loopback ports for the servers the tests start (Ray heads, SeaweedFS, MLflow, vLLM's server).

A port the kernel hands out for `bind(0)` comes from its ephemeral range, the same range every outgoing
connection and every Ray worker's own listener draws from: between our close and the server's bind another
process can take it (CI lost a SeaweedFS start that way). These ports come from below the ephemeral range and
above Ray's worker ports (10002-19999 by default), where only servers told a port by a test listen; on a
machine whose ephemeral range leaves too little room there, from above that range, and failing that, from the
kernel's pick."""

from __future__ import annotations

import random
import socket
from pathlib import Path

RAY_WORKER_PORTS_END = 19999  # `ray start --max-worker-port`'s default
MIN_BAND = 1000  # fewer free ports than this in a band, and two servers choosing at once could meet


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2])
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _band() -> range:
    """The ports to choose from (empty: leave it to the kernel)."""
    start, end = _ephemeral_range()
    for band in (range(RAY_WORKER_PORTS_END + 1, start), range(end + 1, 65536)):
        if len(band) >= MIN_BAND:
            return band
    return range(0)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kernels_pick() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_ports(count: int) -> list[int]:
    """`count` distinct ports nothing listens on now."""
    band = _band()
    if not band:
        picked: set[int] = set()
        while len(picked) < count:
            picked.add(_kernels_pick())
        return list(picked)
    chosen: list[int] = []
    for port in random.sample(band, k=min(len(band), 50 * count)):
        if _bindable(port):
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise RuntimeError(f"found only {len(chosen)} of {count} free ports in {band.start}-{band.stop - 1}")


def free_port() -> int:
    return free_ports(1)[0]
