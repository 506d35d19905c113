from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.separate_hosts import SeparateCluster, separate_cluster


@pytest.fixture(scope="module")
def separate_hosts(tmp_path_factory) -> Iterator[SeparateCluster]:
    """A head host, a worker host (core 1) and a laptop, each its own network, home, /tmp and cpuset, with a
    Ray cluster (token auth on) across head and worker: see tests/separate_hosts.py. Fails where the machine
    cannot build them (not root, no `ip`/`unshare`, no cpuset hierarchy, fewer than two cores)."""
    with separate_cluster(tmp_path_factory.mktemp("hosts")) as hosts:
        yield hosts
