"""Where `rayeval serve`'s API is: the address Serve's HTTP proxy listens on, the URL users reach it at, and
what to say when a cluster's running Serve listens elsewhere than the command asked.

Serve's HTTP options are the cluster's: set when Serve starts, kept until it shuts down, and a later deploy's
options are ignored. So the URL comes from the options in effect, never from the flags; a deploy that asks
for another host is refused (deploying onto a Serve open to the network, asked for 127.0.0.1, would expose
the model unasked), one that asks for another port is told the port it got.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from evaluators.errors import EvalInputError


@dataclass(frozen=True)
class HttpPlace:
    """Where Serve's proxy listens: an address of the node (or 0.0.0.0 / :: for all of them) and a port."""

    host: str
    port: int

    @property
    def everywhere(self) -> bool:
        """Whether the proxy listens on every interface: the API is open to the network."""
        ip = _ip(self.host)
        return ip is not None and ip.is_unspecified

    @property
    def loopback(self) -> bool:
        """Whether only the node itself reaches the proxy."""
        ip = _ip(self.host)
        return self.host == "localhost" if ip is None else ip.is_loopback


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def api_url(place: HttpPlace, node_host: str) -> str:
    """The API's base URL: the address the proxy listens on, or `node_host` (the node's IP or the host users
    reach the head at) where it listens on every interface."""
    host = node_host if place.everywhere else place.host
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{place.port}/v1"


def check_running_host(asked: HttpPlace, running: HttpPlace) -> None:
    """Refuse a deploy whose --host differs from that of the Serve already running on the cluster."""
    if asked.host == running.host:
        return
    exposure = "open to the network" if running.everywhere else f"reached on {running.host} only"
    raise EvalInputError(
        f"--host {asked.host}: Serve already runs on this cluster and listens on {running.host}:{running.port} "
        f"({exposure}); its HTTP options stay until Serve shuts down. Pass --host {running.host} to deploy onto "
        "it as it is, or shut its applications down (`rayeval serve --shutdown --app-name NAME` for each; "
        "Serve stops with the last) and deploy again."
    )


def placement_notes(
    asked: HttpPlace, running: HttpPlace, *, on_cluster: bool, keyed: bool
) -> tuple[str, ...]:
    """What the user should know about where the API is beyond its URL."""
    notes = []
    if asked.port != running.port:
        notes.append(
            f"--port {asked.port} was not applied: Serve already ran on this cluster on port {running.port}, "
            "which it keeps until it shuts down"
        )
    if on_cluster and running.loopback:
        notes.append(
            f"the API listens on {running.host} of the cluster's nodes (the head node's proxy); from another "
            f"machine reach it through an SSH tunnel: ssh -N -L {running.port}:127.0.0.1:{running.port} HEAD"
        )
    if running.everywhere:
        who = (
            "to requests with the key" if keyed else "to anyone who reaches it, without a key (--api-key-env)"
        )
        notes.append(f"the API listens on {running.host}: port {running.port} is open to the network, {who}")
    return tuple(notes)
