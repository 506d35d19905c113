"""The separate-hosts fixture (tests/separate_hosts.py) is what it says: a Ray-client driver on the laptop
reaches the head over the hosts' own network, and a task pinned to a node runs with that node's address, only
its cores, and its own home, where the file it writes lands and nowhere else. No engines, only Ray."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from tests.separate_hosts import SeparateCluster

# A plain Ray driver finds the token in ~/.ray/auth_token by itself but sends it only with RAY_AUTH_MODE=token.
DRIVER = """
import json, os, socket, sys
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


@ray.remote(num_cpus=0)
def whereabouts(marker):
    home = Path.home()
    (home / marker).write_text(marker)
    return {"ip": ray.util.get_node_ip_address(), "cores": sorted(os.sched_getaffinity(0)), "home": str(home),
            "hostname": socket.gethostname(), "marker": str(home / marker)}


for attempt in (1, 2, 3):  # as cluster.connect: Ray's client proxy at times loses a session's server as it
    try:                   # forks it (ray-project/ray#63202); a new session then starts
        ray.init(sys.argv[1], logging_level="WARNING")
        break
    except Exception as exc:  # ConnectionAbortedError here; Ray raises other types too
        if "Initialization failure" not in str(exc) or attempt == 3:
            raise
        print(f"Ray client session did not start, trying again: {exc}", file=sys.stderr)
nodes = {node["NodeManagerAddress"]: node["NodeID"] for node in ray.nodes() if node["Alive"]}
found = {}
for ip, node_id in nodes.items():
    pinned = NodeAffinitySchedulingStrategy(node_id, soft=False)
    found[ip] = ray.get(whereabouts.options(scheduling_strategy=pinned).remote(f"marker-{ip}"))
print(json.dumps(found))
"""


def test_tasks_pinned_to_a_node_run_on_that_host_alone(separate_hosts: SeparateCluster):
    hosts = separate_hosts
    done = hosts.laptop.python(DRIVER, hosts.ray.client_address, env={"RAY_AUTH_MODE": "token"}, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(found) == {hosts.head.ip, hosts.worker.ip}  # the laptop is no node of the cluster
    everyone = (hosts.head, hosts.worker, hosts.laptop)
    for host in (hosts.head, hosts.worker):
        seen = found[host.ip]
        assert seen["ip"] == host.ip and seen["hostname"] == host.name
        assert seen["cores"] == sorted(host.cores)
        assert seen["home"] == "/home" and seen["marker"] == f"/home/marker-{host.ip}"
        written = {other.name for other in everyone if (other.home / f"marker-{host.ip}").exists()}
        assert written == {host.name}
        assert host.path_inside(seen["marker"]).read_text() == f"marker-{host.ip}"
    assert hosts.worker.cores == {1} and hosts.head.cores == {0}


def test_each_host_has_its_own_network_tmp_and_cores(separate_hosts: SeparateCluster):
    hosts = separate_hosts
    probe = (
        "import json, os, socket; open('/tmp/probe', 'w').write(socket.gethostname());"
        "print(json.dumps({'cores': sorted(os.sched_getaffinity(0)), 'links': sorted(os.listdir('/sys/class/net')),"
        "'ip': socket.gethostbyname(socket.gethostname())}))"
    )
    for host in (hosts.head, hosts.worker, hosts.laptop):
        done = host.python(probe, timeout=30)
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
        assert seen == {"cores": sorted(host.cores), "links": ["eth0", "lo"], "ip": host.ip}
        assert (host.tmp / "probe").read_text() == host.name  # its /tmp is its own: each wrote its own name


def test_every_process_of_a_node_has_only_its_hosts_cores(separate_hosts: SeparateCluster):
    for host, daemon in ((separate_hosts.head, "gcs_server"), (separate_hosts.worker, "raylet")):
        statuses = [status for pid in host.pids() if (status := proc_status(pid))]
        assert daemon in {status["Name"] for status in statuses}
        allowed = {status["Cpus_allowed_list"] for status in statuses}
        assert allowed == {",".join(map(str, sorted(host.cores)))}, allowed


def proc_status(pid: int) -> dict[str, str]:
    """/proc/<pid>/status as a dict; empty when the process ended meanwhile."""
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        return {name: value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return {}


def test_rayeval_on_the_laptop_reaches_the_head_dashboard_with_its_own_token(separate_hosts: SeparateCluster):
    hosts = separate_hosts
    listed = hosts.laptop.rayeval("jobs", "list", "--address", hosts.ray.dashboard_url, timeout=120)
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert (hosts.laptop.home / ".ray" / "auth_token").read_text() == hosts.ray.token
