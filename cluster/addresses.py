"""A cluster address the user gave: does anything answer there? Ray itself retries a GCS or Ray-client
address for a minute or more before it fails, so every command that joins a cluster asks first, for seconds.
Plain sockets, no Ray: preflight and the dry run use it as well."""

from __future__ import annotations

import socket

from evaluators.errors import EvalInputError

REACH_TIMEOUT_S = 5.0


def check_address_reachable(address: str | None, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """A host:port (or ray://host:port) given as --address answers within seconds. `auto` and `local` are
    Ray's to resolve; an address without a port is left to Ray (its error says what it wanted)."""
    if not address or address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise EvalInputError(
            f"--address {address}: nothing answers at {host}:{port} ({reason}). Check the address (the head's "
            "GCS port, 6379 by default, or ray://host:10001 for Ray client) and that `ray start --head` runs "
            "there; leave --address out to start a local cluster."
        ) from None
