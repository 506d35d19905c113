"""A cluster address the user gave: does anything answer there? Ray itself retries a GCS or Ray-client
address for a minute or more before it fails, so every command that joins a cluster asks first, for seconds.
Plain sockets, no Ray: preflight and the dry run use it as well."""

from __future__ import annotations

import os
import socket

from evaluators.errors import EvalInputError

REACH_TIMEOUT_S = 5.0


def check_address_reachable(
    address: str | None, timeout_s: float = REACH_TIMEOUT_S, starts_local: bool = False
) -> None:
    """A host:port (or ray://host:port) to join answers within seconds. `auto` is checked where it means
    $RAY_ADDRESS (as Ray reads it); else, and `local`, it is Ray's to resolve. An address without a port is left
    to Ray (its error says what it wanted). `starts_local`: the command starts a local cluster without one
    (`rayeval run`), which the message offers."""
    from_environment = os.environ.get("RAY_ADDRESS", "")
    if address == "auto" and from_environment not in ("", "auto"):
        address = from_environment
    given = "$RAY_ADDRESS" if address and address == from_environment else "--address"
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
        local = (
            "; leave --address out to start a local cluster" if starts_local and given == "--address" else ""
        )
        raise EvalInputError(
            f"{given} {address}: nothing answers at {host}:{port} ({reason}). Check the address (the head's GCS "
            f"port, 6379 by default, or ray://host:10001 for Ray client) and that `ray start --head` runs there"
            f"{local}."
        ) from None
