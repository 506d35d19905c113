"""The three ways into a cluster, on hosts that really are separate (tests/separate_hosts.py: a head with no
CPU for engines, a worker on core 1, a laptop outside the cluster; each its own network, home, /tmp and
cores). Each test states where the run's files go and where its keys come from, as the README says:

- a Ray-client run from the laptop is coordinated on the head, writes its folder there, binds its engine to
  the worker's own core, takes the judge's key from the laptop's environment, survives its client, and is
  resumed there by a rerun from another client;
- a job submitted from the laptop writes on the head and carries its key sealed, never in the job's record;
- a run started on a node writes where it runs and uses that node's environment;
- an engine on the worker gets the LoRA adapters that only the head holds copied to it (and ignores other
  files at an adapter's path there); when it dies it reports its root error read on the worker, and where its
  log is there;
- the worker, set up without the embedded default model, builds its own copy for its engine.

The judge is the loopback stand-in API (tests/judge_api_standin.py), run as a process on the head host and
accepting only the key; a judgment answered means the key got there. After the runs, every file on every
host (Ray's session logs included), Ray's state API (actors, tasks, jobs) and the job's record are searched
for the key.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.judge_local_data import write_judge_data
from tests.object_store import WRITER, ObjectStore, object_store
from tests.runs import ENGINE_FLAGS, MODEL_DIR, records
from tests.separate_hosts import PYTHON, Host, SeparateCluster, kill_group

pytestmark = pytest.mark.slow

KEY_ENV = "OPENAI_API_KEY"
RUNS = "/home/runs"  # on whichever host writes them
RUN_ID = "apart"
JUDGED = ["--judge-rps", "20", "--judge-base-url"]


@pytest.fixture(scope="module")
def key() -> str:
    return f"sk-test-APART-{secrets.token_hex(16)}"


@pytest.fixture(scope="module")
def judge_url(separate_hosts: SeparateCluster, key: str) -> Iterator[str]:
    """The stand-in judge API on the head host's own address, accepting only `key`."""
    head = separate_hosts.head
    server = head.popen([PYTHON, "-m", "tests.judge_api_standin", head.ip, "18080"],
                        env={"STANDIN_API_KEY": key}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    url = server.stdout.readline().strip() if server.stdout else ""
    assert url.startswith("http://"), server.stderr.read() if server.stderr else url
    yield url
    kill_group(server)


@pytest.fixture(scope="module")
def judge_data(separate_hosts: SeparateCluster) -> str:
    """healthbench's two local questions, in the head's home: the data of a client run is the head's."""
    write_judge_data(separate_hosts.head.home / "data")
    return "/home/data/healthbench.jsonl"


def client_run_argv(hosts: SeparateCluster, judge_url: str, judge_data: str) -> list[str]:
    return ["run", "--address", hosts.ray.client_address, "--tasks", "ifeval,healthbench", "--limit", "4",
            "--data-path", f"healthbench={judge_data}", *ENGINE_FLAGS, "--max-num-seqs", "1",
            "--judge", "openai:standin", *JUDGED, judge_url, "--output-dir", RUNS, "--run-id", RUN_ID,
            "--keep-warm", "off"]  # the worker's one CPU is wanted by a later test's engine  # fmt: skip


def wait_for_lines(path: Path, count: int, process: subprocess.Popen[str], timeout_s: float = 600) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline and (not path.exists() or len(path.read_text().splitlines()) < count):
        assert process.poll() is None, process.communicate()[1][-3000:]
        time.sleep(0.3)
    assert path.exists() and len(path.read_text().splitlines()) >= count, f"{path} never had {count} lines"


def is_engine_core(pid: int) -> bool:
    """vLLM's engine core: by its title, or by where it comes from (the engine actor's forkserver forks
    nothing else), for a core seen before it took its title."""
    if Path(f"/proc/{pid}/comm").read_text().strip() == "VLLM::EngineCor":
        return True
    parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
    own = Path(f"/proc/{pid}/cmdline").read_bytes()
    return (
        b"multiprocessing.forkserver" in Path(f"/proc/{parent}/cmdline").read_bytes()
        and b"forkserver" not in own
    )


def engine_core_threads(host: Host) -> dict[int, str]:
    """Cpus_allowed_list of every thread of the vLLM engine core(s) running in `host`, by thread id."""
    found = {}
    for pid in host.pids():
        try:
            if not is_engine_core(pid):
                continue
            for task in Path(f"/proc/{pid}/task").iterdir():
                status = dict(line.split(":\t", 1) for line in (task / "status").read_text().splitlines())
                found[int(task.name)] = status["Cpus_allowed_list"].strip()
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def test_a_client_run_is_coordinated_and_written_on_the_head_and_resumed_there(
    separate_hosts: SeparateCluster, judge_url: str, judge_data: str, key: str
):
    hosts = separate_hosts
    head, worker, laptop = hosts.head, hosts.worker, hosts.laptop
    argv = client_run_argv(hosts, judge_url, judge_data)
    client = laptop.popen([PYTHON, "-m", "cluster.cli", *argv], env={KEY_ENV: key},
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    store = head.home / "runs" / RUN_ID / "cache" / "completions.jsonl"
    # the engine runs on the worker, bound to the worker's core: looked for while it generates (from its start:
    # after the first answers, the rest of a run this small can end before a look)
    threads, deadline = {}, time.time() + 600
    while not threads and time.time() < deadline:
        assert client.poll() is None, client.communicate()[1][-3000:]
        threads = engine_core_threads(worker) or time.sleep(0.3) or {}
    assert threads and set(threads.values()) == {"1"}, threads
    assert engine_core_threads(head) == {}
    wait_for_lines(store, 2, client)
    kill_group(client)  # the laptop goes away mid-run: the run goes on inside the cluster
    client.communicate()

    attached = laptop.rayeval("attach", RUN_ID, "--address", hosts.ray.client_address, "--no-progress")
    assert attached.returncode == 0, attached.stderr[-3000:]
    assert f"results in {RUNS}/{RUN_ID}" in attached.stdout
    run_dir = head.home / "runs" / RUN_ID
    assert not (worker.home / "runs").exists() and not (laptop.home / "runs").exists()
    summary = json.loads((run_dir / "summary.json").read_text())
    (engine,) = summary["run"]["engines"]
    assert engine["node_ip"] == worker.ip and engine["cpu_binding"] == "1"
    # the worker was set up without the default model (tests/separate_hosts.py): its engine built the node's
    # own copy in the worker's home
    assert (worker.home / ".cache" / "rayeval" / "models" / MODEL_DIR / "config.json").is_file()
    rows = records(run_dir / "samples" / MODEL_DIR / "ifeval.jsonl")
    assert sorted(r["doc_id"] for r in rows) == list(range(4)) and all(r["error"] is None for r in rows)
    judged = records(run_dir / "judges" / "openai-standin" / "samples" / "healthbench.jsonl")
    assert len(judged) == 2 and all(r["error"] is None and r["scores"] for r in judged)  # the key got there

    # A rerun of the same command from the laptop lands on the head again and generates nothing.
    again = laptop.rayeval(*argv, "--no-progress", env={KEY_ENV: key})
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"on node {head.ip}, which writes its folder {RUNS}/{RUN_ID}" in again.stderr
    assert "(6 of 6 requests reused, 0 failed" in again.stdout
    coordinators = state_listing(hosts, "actors", f"rayeval-run-{RUN_ID}")
    assert {a["node_id"] for a in coordinators} == {node_id(hosts, head)}


def test_an_abandoned_coordinator_exits_after_its_idle_time_and_its_files_stay(
    separate_hosts: SeparateCluster, judge_url: str, judge_data: str, key: str
):
    """The previous test's run, again from the laptop (nothing to generate), whose client leaves as soon
    as the run is under way and never fetches the result."""
    hosts = separate_hosts
    argv = [*client_run_argv(hosts, judge_url, judge_data), "--coordinator-idle-timeout", "3"]
    client = hosts.laptop.popen([PYTHON, "-m", "cluster.cli", *argv], env={KEY_ENV: key},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    said = ""
    while client.stderr is not None and "is coordinated inside the cluster" not in said:
        line = client.stderr.readline()
        assert line, f"the client ended before its run started: {said[-3000:]}"
        said += line
    kill_group(client)  # gone before the run ends: nobody fetches its result
    client.communicate()
    deadline = time.time() + 90
    while time.time() < deadline and state_listing(hosts, "actors", f"rayeval-run-{RUN_ID}", alive=True):
        time.sleep(2)
    assert state_listing(hosts, "actors", f"rayeval-run-{RUN_ID}", alive=True) == []
    gone = hosts.laptop.rayeval("attach", RUN_ID, "--address", hosts.ray.client_address)
    assert gone.returncode == 1 and f"No run '{RUN_ID}' is running in this cluster" in gone.stderr
    assert (hosts.head.home / "runs" / RUN_ID / "summary.json").is_file()


def test_a_job_from_the_laptop_writes_on_the_head_with_its_key_sealed(
    separate_hosts: SeparateCluster, judge_url: str, key: str
):
    """A --judge-only re-judge of the client run's outputs as a Ray Job: no engine; the key is the laptop's."""
    hosts = separate_hosts
    done = hosts.laptop.rayeval(
        "submit", "--address", hosts.ray.dashboard_url, "--job-id", "rejudge", "--",
        "run", "--judge-only", "--run-id", RUN_ID, "--output-dir", RUNS, "--judge", "openai:by-job",
        *JUDGED, judge_url, env={KEY_ENV: key},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    assert "job rejudge SUCCEEDED" in done.stderr
    judged = records(
        hosts.head.home / "runs" / RUN_ID / "judges" / "openai-by-job" / "samples" / "healthbench.jsonl"
    )
    assert len(judged) == 2 and all(r["error"] is None and r["scores"] for r in judged)
    info = hosts.laptop.python(JOB_INFO, hosts.ray.dashboard_url, "rejudge", env={"RAY_AUTH_MODE": "token"})
    assert info.returncode == 0, info.stderr[-3000:]
    assert "RAYEVAL_SEALED_ENV" in info.stdout and key not in info.stdout and key[-32:] not in info.stdout


def test_a_run_on_a_node_writes_where_it_runs_with_that_nodes_key(
    separate_hosts: SeparateCluster, judge_url: str, key: str
):
    """`--address auto` on the head, a relative --output-dir taken from where the command runs, the key from
    the head's own environment."""
    hosts = separate_hosts
    done = hosts.head.rayeval(
        "run", "--address", "auto", "--judge-only", "--run-id", RUN_ID, "--output-dir", "runs",
        "--judge", "openai:on-node", *JUDGED, judge_url, env={KEY_ENV: key}, cwd="/home",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    judged = records(
        hosts.head.home / "runs" / RUN_ID / "judges" / "openai-on-node" / "samples" / "healthbench.jsonl"
    )
    assert len(judged) == 2 and all(r["error"] is None and r["scores"] for r in judged)


def test_a_client_run_on_the_node_it_names_writes_there(
    separate_hosts: SeparateCluster, judge_url: str, key: str
):
    """--coordinator-node WORKER: the coordinator runs on the worker and every path is the worker's (here a
    copy of the run folder and of the task's data, which re-judging reads, as on storage mounted at the same
    path there)."""
    hosts = separate_hosts
    for folder in ("runs", "data"):
        shutil.copytree(hosts.head.home / folder, hosts.worker.home / folder)
    done = hosts.laptop.rayeval(
        "run", "--address", hosts.ray.client_address, "--coordinator-node", hosts.worker.ip, "--judge-only",
        "--run-id", RUN_ID, "--output-dir", RUNS, "--judge", "openai:on-worker", *JUDGED, judge_url,
        "--no-progress", env={KEY_ENV: key},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"on node {hosts.worker.ip}, which writes its folder {RUNS}/{RUN_ID}" in done.stderr
    judges = "runs/apart/judges/openai-on-worker/samples/healthbench.jsonl"
    assert len(records(hosts.worker.home / judges)) == 2 and not (hosts.head.home / judges).exists()
    wrong = hosts.laptop.rayeval("run", "--address", hosts.ray.client_address, "--coordinator-node", "10.9.9.9",
                                 "--output-dir", RUNS, "--run-id", "nowhere")  # fmt: skip
    assert (
        wrong.returncode == 2 and "--coordinator-node 10.9.9.9: no live node of this cluster" in wrong.stderr
    )
    assert hosts.head.ip in wrong.stderr and hosts.worker.ip in wrong.stderr


@pytest.fixture(scope="module")
def host_store(separate_hosts: SeparateCluster) -> Iterator[ObjectStore]:
    """The cluster's object storage: SeaweedFS inside the head host, on its own address."""
    with object_store(separate_hosts.head.home / "s3", host=separate_hosts.head) as store:
        yield store


def test_a_client_run_on_object_storage_resumes_on_another_host_from_the_store(
    separate_hosts: SeparateCluster, judge_url: str, judge_data: str, key: str, host_store: ObjectStore
):
    """A Ray-client run writes its folder to the store from the head (the model is the stand-in API: no
    engine); the same run with more questions, coordinated on the worker, where nothing of it is on disk,
    reads the folder back from the store and asks only the new questions; a --judge-only re-judge on the head
    reads the worker's outputs from the store. The store's credentials go from the laptop to the coordinator
    by --env, in a call; the task's data is at the same path on both nodes."""
    hosts = separate_hosts
    shutil.copytree(hosts.head.home / "data", hosts.worker.home / "data", dirs_exist_ok=True)
    common = ["--address", hosts.ray.client_address, "--output-dir", host_store.uri("apart"), "--run-id", "stored",
              "--no-progress", *(arg for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL",
                                                  "AWS_REGION") for arg in ("--env", name))]  # fmt: skip
    argv = ["run", *common, "--model", "openai:standin", "--base-url", judge_url, "--inference-only",
            "--tasks", "ifeval,healthbench", "--data-path", f"healthbench={judge_data}"]  # fmt: skip
    env = {KEY_ENV: key, **host_store.env()}
    first = hosts.laptop.rayeval(*argv, "--limit", "3", env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert (
        f"on node {hosts.head.ip}, which writes its folder {host_store.uri('apart')}/stored" in first.stderr
    )
    resumed = hosts.laptop.rayeval(*argv, "--limit", "6", "--coordinator-node", hosts.worker.ip, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # ifeval's 3 new questions asked; its first 3 and healthbench's 2 read back from the store
    assert f"results in {host_store.uri('apart')}/stored (5 of 8 requests reused" in resumed.stdout
    stored = host_store.read("apart/stored")
    [samples_file] = [
        name for name in stored if name.startswith("samples/") and name.endswith("/ifeval.jsonl")
    ]
    samples = [json.loads(line) for line in stored[samples_file].splitlines()]
    assert sorted(row["doc_id"] for row in samples) == list(range(6))
    assert len(stored["cache/completions.jsonl"].splitlines()) == 8
    staged = "endpoint-*/rayeval-test/apart/stored/summary.json"  # in a folder of its own per store
    for host in (hosts.worker, hosts.head):
        assert len(list((host.home / ".cache/rayeval/storage/s3").glob(staged))) == 1

    judged = hosts.laptop.rayeval("run", *common, "--judge-only", "--judge", "openai:standin", *JUDGED, judge_url,
                                  env=env)  # fmt: skip
    assert judged.returncode == 0, judged.stderr[-3000:]
    verdicts = host_store.read("apart/stored/judges/openai-standin/samples")
    assert [
        len(data.splitlines()) for name, data in verdicts.items() if name.endswith("healthbench.jsonl")
    ] == [2]


def test_the_key_is_in_no_file_state_listing_or_job_record_on_any_host(
    separate_hosts: SeparateCluster, key: str
):
    hosts = separate_hosts
    needles = (key, key[-32:], WRITER[1])  # the judge's key, and the store's secret (--env to a client run)
    store_server = hosts.head.home / "s3"  # the S3 server's own folder: its key file holds the secret
    leaked = [
        str(path)
        for host in hosts.hosts.values()
        for path in host.root.rglob("*")
        if path.is_file()
        and not path.is_relative_to(store_server)
        and any(n.encode() in path.read_bytes() for n in needles)
    ]
    assert leaked == []
    listing = json.dumps([state_listing(hosts, kind) for kind in ("actors", "tasks", "jobs")])
    assert "rayeval-run-" in listing and not any(n in listing for n in needles)


WORKER_ENGINE = """
import asyncio, dataclasses, json, sys
from pathlib import Path
import ray
from cluster.config import ClusterOptions, ModelOptions, RunConfig
from cluster.engines import EngineLog, LogPlace, ReplicaPool, engine_settings, read_on_node
from cluster.models import load_adapter, merged_checkpoint
from cluster.plan import build_model_plan
from cluster.session import connect
from sharding.dispatcher import ReplicaDead
from sharding.requests import SamplingSpec, build_group, make_request

connect("auto")
config = RunConfig(model=ModelOptions(max_model_len=512, max_num_batched_tokens=64, enforce_eager=True,
                                      dtype="float32"), cluster=ClusterOptions(replicas=1, device="cpu"))
plan = build_model_plan(config, device="cpu")
settings = dataclasses.replace(engine_settings(config.model, plan.model.path, "cpu"), chunked_prefill=True,
                               max_loras=2, max_lora_rank=config.model.max_lora_rank)
pool = ReplicaPool(settings, plan.replica, 1, 1, verbose=False)
pool.start(120)
(replica,) = pool.replicas()
# The adapters are in the head's home only (the worker holds other files at the zero adapter's path): the
# pool copies each to the worker, as a run does once its engines are up
adapters = {name: load_adapter(f"/home/adapters/{name}", Path(plan.model.path), None) for name in ("zero", "random")}
for adapter in adapters.values():
    pool.stage_adapter(adapter)
greedy = SamplingSpec(temperature=0.0, max_tokens=12)
question = "Name three colours."  # one prefill chunk: greedy, so no seeded generator either
outputs = {}
def answer(name, adapter=None):
    request = make_request(plan.model.path, question, greedy, seed=0, sample_index=0, adapter=adapter)
    (done,) = asyncio.run(replica.generate(build_group(question, [request])))
    outputs[name] = done.text if done.error is None else f"error: {done.error}"
for name, adapter in [("base", None), *adapters.items()]:
    answer(name, adapter)
# The random adapter merged into the base model here, on the head: the worker lacks the merged folder and
# merges its own copy from the adapter (copied to it) and its own base model
merged = merged_checkpoint(Path("/home/adapters/random"), Path(plan.model.path), adapters["random"].digest)
(moved,) = pool.load_checkpoint(str(merged))  # the folder says how it was made
answer("merged")
prompt = "Tell me a long story about the sea and its sailors. " * 12  # prefilled in chunks: a seeded crash
spec = SamplingSpec(temperature=0.8, max_tokens=8)
group = build_group(prompt, [make_request(plan.model.path, prompt, spec, seed=7 + i, sample_index=i) for i in range(2)])
try:
    asyncio.run(replica.generate(group))
    died = "no death"
except ReplicaDead as exc:
    died = str(exc)
info = pool.infos[0]
pool.shutdown()
# an actor whose process died: its log, on the worker, read by a task placed there
log = EngineLog((LogPlace(sys.argv[1]),), info.node_id, info.node_ip)
print(json.dumps({"died": died, "node_ip": info.node_ip, "read_there": asyncio.run(read_on_node(log)),
                  "outputs": outputs, "digests": {name: a.digest for name, a in adapters.items()},
                  "merged": str(merged), "moved": [moved.model, moved.loaded_by]}))
"""


@pytest.fixture(scope="module")
def worker_engine(separate_hosts: SeparateCluster) -> dict:
    """One LoRA-enabled engine on the worker, driven from the head: it answers a plain request and one with
    each of two adapters that only the head holds, then gets a request that kills it (a seeded one under
    chunked prefill: vLLM's CPU sampler fails). What the head's script saw, as JSON."""
    from safetensors.torch import load_file, save_file

    from tests.cluster.run.test_lora import make_adapter

    hosts = separate_hosts
    for name in ("zero", "random"):
        made = make_adapter(hosts.head.home / "adapters" / name, random_init=name == "random")
        config = (
            made / "adapter_config.json"
        )  # named by the model's name: the head's folder is not this one's
        config.write_text(json.dumps(json.loads(config.read_text()) | {"base_model_name_or_path": MODEL_DIR}))
    weights = hosts.head.home / "adapters" / "random" / "adapter_model.safetensors"
    strong = {k: v * 20 if "lora_B" in k else v for k, v in load_file(weights).items()}
    save_file(strong, weights)  # a random adapter that surely changes a short greedy answer
    # other files at the zero adapter's path on the worker: the run's own adapter must be used all the same
    shutil.copytree(hosts.head.home / "adapters" / "random", hosts.worker.home / "adapters" / "zero")
    written = hosts.worker.tmp / "dead-actor.err"  # on the worker's own /tmp: the head cannot read it
    written.write_text(
        "(pid=1) Traceback (most recent call last):\n(pid=1) MemoryError: killed on the worker\n"
    )
    done = hosts.head.python(WORKER_ENGINE, "/tmp/dead-actor.err", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_adapters_only_the_head_holds_reach_the_workers_engine_as_served_and_as_a_merged_checkpoint(
    separate_hosts: SeparateCluster, worker_engine: dict
):
    hosts, outputs = separate_hosts, worker_engine["outputs"]
    assert all(text and not text.startswith("error:") for text in outputs.values()), outputs
    # a zero-initialised adapter changes nothing (float32): the worker's other files at its path went unused
    assert outputs["zero"] == outputs["base"] and outputs["random"] != outputs["base"], outputs
    for name, digest in worker_engine["digests"].items():
        copy = hosts.worker.home / ".cache" / "rayeval" / "adapters" / f"{name}-{digest}"
        for file in ("adapter_config.json", "adapter_model.safetensors"):
            assert (copy / file).read_bytes() == (hosts.head.home / "adapters" / name / file).read_bytes()
    assert not (
        hosts.head.home / ".cache" / "rayeval" / "adapters"
    ).exists()  # the head had them at their path
    # the merged checkpoint, made on the head: the worker merged its own copy, of the very same weights
    merged = Path(
        worker_engine["merged"]
    )  # in the head's home (the worker's copy is at that path in its own)
    assert worker_engine["moved"][0] == str(merged) and outputs["merged"] != outputs["base"], worker_engine
    on_worker, on_head = hosts.worker.path_inside(merged), hosts.head.path_inside(merged)
    assert on_worker != on_head and (on_worker / "model.safetensors").is_file()
    assert (on_worker / "model.safetensors").read_bytes() == (on_head / "model.safetensors").read_bytes()
    untouched = hosts.worker.home / "adapters" / "zero" / "adapter_model.safetensors"
    assert (
        untouched.read_bytes()
        == (hosts.head.home / "adapters" / "random" / "adapter_model.safetensors").read_bytes()
    )


def test_each_hosts_cache_is_listed_and_pruned_there(separate_hosts: SeparateCluster, worker_engine: dict):
    """`rayeval cache` from the laptop, over Ray client: the adapter copies are in the worker's home only, so
    only the worker lists them, and a prune removes them there (a task on each host reads its own cache)."""
    hosts, digests = separate_hosts, worker_engine["digests"]
    address = ("--address", hosts.ray.client_address)
    listed = hosts.laptop.rayeval("cache", "list", "--kind", "adapters", *address)
    assert listed.returncode == 0, listed.stderr[-3000:]
    rows = [line.split("\t") for line in listed.stdout.splitlines()[1:-1]]
    assert sorted((row[0], Path(row[4]).name) for row in rows) == sorted(
        (hosts.worker.ip, f"{name}-{digest}") for name, digest in digests.items()
    )
    assert (
        listed.stdout.splitlines()[-1].endswith("on 2 nodes") and f"{len(digests)} entries" in listed.stdout
    )
    pruned = hosts.laptop.rayeval("cache", "prune", "--kind", "adapters", "--unused-for", "0", *address)
    assert pruned.returncode == 0, pruned.stderr[-3000:]
    assert pruned.stdout.splitlines()[-1].startswith(f"removed {len(digests)} entries")
    assert list((hosts.worker.home / ".cache" / "rayeval" / "adapters").iterdir()) == []


def test_an_engine_that_dies_on_the_worker_reports_its_root_error_read_there(
    separate_hosts: SeparateCluster, worker_engine: dict
):
    hosts, seen = separate_hosts, worker_engine
    assert seen["node_ip"] == hosts.worker.ip and seen["read_there"] == "MemoryError: killed on the worker"
    message = seen["died"]
    assert message.startswith("RuntimeError: CPU Generator does not use offset; the engine's full log: ")
    where, node = message.split("the engine's full log: ")[1].split(" on node ")
    assert node == hosts.worker.ip
    for path in where.split(" and "):
        assert hosts.worker.path_inside(path).is_file() and not hosts.head.path_inside(path).exists()
    assert not (hosts.head.tmp / "dead-actor.err").exists()


JOB_INFO = """
import json, sys
from ray.job_submission import JobSubmissionClient
info = JobSubmissionClient(sys.argv[1]).get_job_info(sys.argv[2])
print(json.dumps(info.model_dump() if hasattr(info, "model_dump") else info.dict(), default=str))
"""

STATE = """
import json, sys
from ray.util import state
address, kind, name, alive = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
found = getattr(state, f"list_{kind}")(address=address, detail=True, limit=10000)
plain = lambda r: r if isinstance(r, dict) else getattr(r, "asdict", getattr(r, "model_dump", None))()
rows = [plain(r) for r in found]
rows = [r for r in rows if (not name or r.get("name") == name) and (not alive or r.get("state") == "ALIVE")]
print(json.dumps(rows, default=str))
"""


def state_listing(hosts: SeparateCluster, kind: str, name: str = "", alive: bool = False) -> list[dict]:
    """Ray's state API on the head (`ray.util.state.list_<kind>(detail=True)` from its dashboard, no driver
    joining the cluster), filtered by name and state."""
    done = hosts.head.python(
        STATE, hosts.ray.dashboard_url, kind, name, "1" if alive else "0", env={"RAY_AUTH_MODE": "token"},
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def node_id(hosts: SeparateCluster, host: Host) -> str:
    (node,) = [n for n in state_listing(hosts, "nodes") if n["node_ip"] == host.ip]
    return node["node_id"]
