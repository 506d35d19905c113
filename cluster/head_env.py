"""What the environment of a head node's `ray start` needs for rayeval's users (plain Python: no Ray import, so
test helpers, the cluster-launcher check and bench scripts read it for free).

Ray's client server starts each Ray client session's own server as a forked subprocess while its gRPC
threads are busy. gRPC core's fork support, on by default in grpcio's Linux wheels, then restarts gRPC's
threads in the child before it execs the server, and now and then the child dies there (Ray reports
"Initialization failure from server" about 40 s later) or hangs there for good (`ray.init` never returns):
ray-project/ray#63202. With it off the child execs at once. The variable reaches every process `ray start`
starts on the head; fork support matters only to a process that forks without exec and then uses gRPC in the
child, which neither Ray's head processes nor rayeval's do (a user's task on the head that did would lose
gRPC's reset in its child). Measured by bench/ray_client_fork.py (docs/BENCHMARKS.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

CLIENT_SERVER_HEAD_ENV: Mapping[str, str] = MappingProxyType({"GRPC_ENABLE_FORK_SUPPORT": "false"})


def head_env_assignments() -> str:
    """The variables as a shell writes them before a command: `NAME=value ...`."""
    return " ".join(f"{name}={value}" for name, value in CLIENT_SERVER_HEAD_ENV.items())
