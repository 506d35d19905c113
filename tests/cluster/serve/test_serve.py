"""`rayeval serve` on a real `ray start --head` cluster: Ray Serve's LLM application over a real vLLM engine
of the default model, reached with the `openai` client, with `rayeval run --model openai:...` (as the model
and as the judge), and with lm-eval's own `local-chat-completions` model; a LoRA adapter staged on object
storage (a real S3-compatible server) and downloaded by the replica; and a served replica killed in the
middle of a run.

The server is deployed as a user would deploy it safely: listening on 127.0.0.1 (the default) and requiring
the key of `--api-key-env`, from a deploying process pinned to one core, so that the replica's engine threads
show whose cores they were bound to."""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import openai
import psutil
import pytest

from cluster.models import default_model_dir
from cluster.serve.adapters import adapter_digest
from cluster.storage import RemoteFolder
from tests.cluster.run.test_lora import make_adapter
from tests.judge_local_data import write_judge_data
from tests.object_store import BUCKET
from tests.ports import free_port
from tests.ray_head import HeadNode, start_head
from tests.runs import BASE_IFEVAL_ARGS, MODEL_DIR, rayeval, records, start_in_background, wait_for_records
from tests.warm_cluster import warm_cluster

pytestmark = pytest.mark.slow

SERVED_NAME = "smol"
ADAPTER = "tuned"  # a LoRA adapter served beside the base model under its own name
ENGINE = ["--dtype", "float32", "--max-model-len", "1024"]  # float32: outputs equal to the local replicas'
RUN = ["--tasks", "ifeval", "--max-tokens", "48", "--no-progress", "--enforce-eager"]
KEY_ENV = (
    "RAYEVAL_TEST_SERVE_KEY"  # the variable `--api-key-env` names, set only for the commands that use it
)


@dataclass
class Served:
    head: HeadNode
    address: str
    url: str
    port: int
    key: str
    deployer_cores: set[int]  # the cores the deploying `rayeval serve` process was pinned to
    deploy_output: str
    adapter: Path  # the LoRA adapter's local folder (served from its copy on the object store)

    @property
    def env(self) -> dict[str, str]:
        return self.head.client_env()

    @property
    def key_env(self) -> dict[str, str]:
        return {KEY_ENV: self.key}


@pytest.fixture(scope="module")
def served(tmp_path_factory, s3) -> Iterator[Served]:
    # a randomly initialised adapter: it answers differently from the base model. It is staged on the object
    # store (--lora-store) and the replica downloads it from there with its node's own credentials (the
    # head's environment), into its node's staging folder
    adapter = make_adapter(tmp_path_factory.mktemp("lora") / ADAPTER, random_init=True)
    node_staging = tmp_path_factory.mktemp("replica-node")
    head = start_head(num_cpus=2, env={**s3.env(), "RAYEVAL_STAGING_DIR": str(node_staging)})
    address = f"127.0.0.1:{head.gcs_port}"
    port = free_port()
    key = f"sk-serve-{secrets.token_hex(24)}"
    deployer_cores = {min(os.sched_getaffinity(0))}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "cluster.cli", "serve", "--address", address, *ENGINE, "--port", str(port),
             "--served-model-name", SERVED_NAME, "--lora", f"{ADAPTER}={adapter}", "--api-key-env", KEY_ENV,
             "--lora-store", s3.uri("adapters")],
            env={**head.client_env(), **s3.env(), KEY_ENV: key}, capture_output=True, text=True, timeout=600,
            preexec_fn=lambda: os.sched_setaffinity(0, deployer_cores),
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        url = f"http://127.0.0.1:{port}/v1"
        assert f"serving {SERVED_NAME} " in done.stdout and f"at {url} " in done.stdout, done.stdout
        staged = f"{s3.uri('adapters')}/{ADAPTER}-{adapter_digest(adapter)}"
        assert (
            f"LoRA adapter {ADAPTER}: OPENAI_MODEL={ADAPTER} (each replica reads it from {staged})"
            in done.stdout
        )
        on_store = s3.read(staged.removeprefix(f"s3://{BUCKET}/"))
        assert on_store["adapter_model.safetensors"] == (adapter / "adapter_model.safetensors").read_bytes()
        with pytest.MonkeyPatch.context() as node:  # the replica's node's staging folder for this store
            for name, value in {**s3.env(), "RAYEVAL_STAGING_DIR": str(node_staging)}.items():
                node.setenv(name, value)
            downloaded = RemoteFolder.parse(staged).staging
        assert (downloaded / "adapter_config.json").is_file()  # the replica read the store's copy
        assert f"requests need Authorization: Bearer ${KEY_ENV}" in done.stdout
        assert "note: the API listens on 127.0.0.1 of the cluster's nodes" in done.stdout
        yield Served(head, address, url, port, key, deployer_cores, done.stdout + done.stderr, adapter)
    finally:
        rayeval("serve", "--shutdown", "--address", address, env=head.client_env(), timeout=120)
        head.stop()


def client(served: Served, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url, api_key=key or served.key, max_retries=0, timeout=120)


def test_the_openai_client_lists_chats_streams_and_gets_openai_errors(served: Served) -> None:
    api = client(served)
    assert [m.id for m in api.models.list().data] == [SERVED_NAME, ADAPTER]
    messages = [{"role": "user", "content": "Name three colours."}]
    whole = api.chat.completions.create(model=SERVED_NAME, messages=messages, max_tokens=24, temperature=0)
    text = whole.choices[0].message.content
    assert text and whole.usage.completion_tokens > 0
    stream = api.chat.completions.create(
        model=SERVED_NAME, messages=messages, max_tokens=24, temperature=0, stream=True
    )
    chunks = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len(chunks) > 3 and "".join(chunks) == text  # greedy: the stream spells the same answer
    for other in (
        "no-such-model",
        f"{SERVED_NAME}:latest",
    ):  # NAME:SUFFIX too: Ray's ingress took it for an adapter
        with pytest.raises(openai.NotFoundError) as unknown:
            api.chat.completions.create(model=other, messages=messages, max_tokens=4)
        assert unknown.value.status_code == 404 and other in str(unknown.value.body)
    with pytest.raises(openai.BadRequestError) as too_long:
        api.chat.completions.create(
            model=SERVED_NAME, messages=[{"role": "user", "content": "word " * 1500}], max_tokens=4
        )
    assert too_long.value.status_code == 400
    assert "maximum context length" in json.dumps(too_long.value.body)


def http_call(url: str, key: str | None, body: dict | None = None) -> tuple[int, dict]:
    """A plain HTTP request to the API (GET without a body, else a JSON POST): its status and JSON answer."""
    headers = {"content-type": "application/json"} | ({"authorization": f"Bearer {key}"} if key else {})
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=120) as answer:  # noqa: S310
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def test_the_api_listens_on_127_0_0_1_only_by_default(served: Served) -> None:
    listening = [
        c.laddr.ip
        for c in psutil.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == served.port
    ]
    assert listening and all(ipaddress.ip_address(ip).is_loopback for ip in listening), listening
    outward = [
        a.address
        for addresses in psutil.net_if_addrs().values()
        for a in addresses
        if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback
    ]
    for address in outward:  # the machine's own network addresses: nothing answers there
        with socket.socket() as sock:
            sock.settimeout(5)
            assert sock.connect_ex((address, served.port)) == errno.ECONNREFUSED, address


def test_requests_without_the_key_get_a_401_and_requests_with_it_an_answer(served: Served) -> None:
    chat = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    calls = [
        ("/models", None),
        ("/chat/completions", chat),
        ("/chat/completions", {**chat, "model": ADAPTER}),
    ]
    for key in (None, "wrong", served.key[:-1], served.key.upper()):
        for path, body in calls:
            status, answer = http_call(served.url + path, key, body)
            assert status == 401 and answer["error"]["code"] == "invalid_api_key", (path, status, answer)
            assert "Authorization: Bearer KEY" in answer["error"]["message"]
    for path, body in calls:
        status, answer = http_call(served.url + path, served.key, body)
        assert status == 200, (path, answer)
    with pytest.raises(openai.AuthenticationError) as rejected:
        client(served, key="sk-not-the-key").chat.completions.create(
            model=SERVED_NAME, messages=chat["messages"], max_tokens=2
        )
    assert rejected.value.status_code == 401


def test_health_answers_200_without_the_key_while_the_engine_is_up(served: Served) -> None:
    """vLLM's GET /health, open as vLLM's is (a probe carries no key): 200 and no body once the engine passes
    its health check; the server's other paths still want the key (the test above)."""
    with urllib.request.urlopen(served.url.removesuffix("/v1") + "/health", timeout=60) as answer:  # noqa: S310
        assert (answer.status, answer.read()) == (200, b"")


def test_health_answers_503_naming_the_model_whose_engine_fails_its_check() -> None:
    """A dead engine, injected: a stand-in for the model server's handle whose health check raises, as
    LLMServer.check_health does for a dead engine (a real one dies and is restarted between two probes)."""
    import asyncio
    from types import SimpleNamespace

    from cluster.serve.ingress import ServeIngress

    async def failing() -> None:
        raise RuntimeError("EngineDeadError: the engine process died")

    dead = SimpleNamespace(check_health=SimpleNamespace(remote=failing))
    answer = asyncio.run(ServeIngress.health(SimpleNamespace(_servers={SERVED_NAME: dead})))
    assert answer.status_code == 503
    message = json.loads(answer.body)["error"]["message"]  # the kind of failure; its text to the log only
    assert message == f"{SERVED_NAME}: its engine failed its health check (RuntimeError)"


def test_a_lora_adapter_answers_under_its_own_name_streamed_too(served: Served) -> None:
    api = client(served)
    messages = [{"role": "user", "content": "Name three colours."}]
    base = api.chat.completions.create(model=SERVED_NAME, messages=messages, max_tokens=24, temperature=0)
    tuned = api.chat.completions.create(model=ADAPTER, messages=messages, max_tokens=24, temperature=0)
    text = tuned.choices[0].message.content
    assert text and tuned.model == ADAPTER
    assert text != base.choices[0].message.content  # the adapter's weights took part
    stream = api.chat.completions.create(
        model=ADAPTER, messages=messages, max_tokens=24, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text


def test_the_staged_adapters_greedy_answers_equal_a_run_with_the_local_adapter(
    served: Served, tmp_path: Path
) -> None:
    """The adapter served from its copy on the object store answers as `rayeval run --lora` with the local
    folder does (float32 both sides, three IFEval questions)."""
    with ThreadPoolExecutor(2) as both:  # side by side: each on engines of its own
        running = both.submit(rayeval, "run", *BASE_IFEVAL_ARGS, "--limit", "3", "--lora", str(served.adapter),
                              "--output-dir", str(tmp_path), "--run-id", "local")  # fmt: skip
        endpoint = rayeval("run", "--model", f"openai:{ADAPTER}", "--base-url", served.url, "--api-key-env",
                           KEY_ENV, "--limit", "3", *RUN, "--output-dir", str(tmp_path), "--run-id", "served",
                           env=served.key_env)  # fmt: skip
        local = running.result()
    assert local.returncode == 0, local.stderr[-3000:]
    assert endpoint.returncode == 0, endpoint.stderr[-3000:]
    [by_lora] = (tmp_path / "local" / "samples").glob(f"{MODEL_DIR}+*/ifeval.jsonl")
    by_endpoint = records(tmp_path / "served" / "samples" / ADAPTER / "ifeval.jsonl")
    assert [r["output"] for r in by_endpoint] == [r["output"] for r in records(by_lora)]
    assert len(by_endpoint) == 3 and all(r["error"] is None for r in by_endpoint)


COMPLETION = {"model": SERVED_NAME, "prompt": "The capital of France is", "max_tokens": 1}


def test_a_lora_server_refuses_prompt_logprobs_and_so_do_log_likelihood_runs_against_it(
    served: Served, local_lm_eval_tasks: Path
) -> None:
    """vLLM's LoRA logits layer fails on prompt positions and kills the engine: the LoRA-enabled server
    answers such a request with a 400 instead, and a run's probe turns that into a refusal before it starts."""
    asks = [  # vLLM computes prompt logprobs for each: lm-eval's local-completions sends the echo form
        lambda api: api.completions.create(**COMPLETION, extra_body={"prompt_logprobs": 1}),
        lambda api: api.completions.create(**COMPLETION, extra_body={"prompt_logprobs": 0}),
        lambda api: api.completions.create(**COMPLETION, echo=True, logprobs=1),
        lambda api: api.chat.completions.create(
            model=SERVED_NAME,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=1,
            extra_body={"echo": True},
        ),
    ]
    for ask in asks:
        with pytest.raises(openai.BadRequestError) as refused:
            ask(client(served))
        assert refused.value.status_code == 400 and "LoRA adapters enabled" in str(refused.value.body)
    tasks = local_lm_eval_tasks
    done = rayeval(
        "run", "--model", f"openai:{SERVED_NAME}", "--base-url", served.url, "--tokenizer", str(default_model_dir()),
        "--tasks", "gsm8k_mc_local", "--include-path", str(tasks), "--dry-run", "--api-key-env", KEY_ENV,
        env=served.key_env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "gsm8k_mc_local score answers by log-likelihood" in done.stderr
    assert "HTTP 400: prompt_logprobs cannot be computed here" in done.stderr
    # the engine lived through both: the served model still answers
    answer = client(served).completions.create(model=SERVED_NAME, prompt="Hello", max_tokens=2, temperature=0)
    assert answer.usage.completion_tokens == 2


def test_status_names_the_application_and_its_running_replica(served: Served) -> None:
    done = rayeval("serve", "--status", "--address", served.address, env=served.env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "application rayeval: RUNNING" in done.stdout
    assert f"LLMServer:{SERVED_NAME}: HEALTHY; replicas: 1 RUNNING" in done.stdout, done.stdout


def test_the_replica_binds_its_engine_threads_to_its_own_cores_not_the_deployers(served: Served) -> None:
    """The deploying `rayeval serve` ran pinned to one core; the replica's engine worker binds its threads to
    the cores the replica's own process may use, each of them used, and bound (not left to the OS)."""
    [replica] = [psutil.Process(pid) for pid in _served_replica_pids()]
    allowed = os.sched_getaffinity(replica.pid)
    workers = [p for p in replica.children(recursive=True) if p.name() == "VLLM::Worker"]
    threads = {}
    for worker in workers:
        for thread in worker.threads():
            try:
                threads[thread.id] = os.sched_getaffinity(thread.id)
            except ProcessLookupError:  # a thread that ended meanwhile
                continue
    assert workers and threads, [p.name() for p in replica.children(recursive=True)]
    assert all(cores <= allowed for cores in threads.values()), (allowed, threads)
    assert set().union(*threads.values()) == allowed
    if len(allowed) > 1:
        assert allowed != served.deployer_cores
        assert any(cores < allowed for cores in threads.values())  # pinned, not left to the OS


def test_a_deploy_asking_for_another_host_than_the_running_serve_is_refused(served: Served) -> None:
    done = rayeval(
        "serve", "--address", served.address, "--host", "0.0.0.0", "--port", str(served.port), "--app-name", "open",
        env=served.env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert (
        f"--host 0.0.0.0: Serve already runs on this cluster and listens on 127.0.0.1:{served.port}"
        in done.stderr
    )
    assert "Pass --host 127.0.0.1 to deploy onto it" in done.stderr and "Traceback" not in done.stderr
    status = rayeval("serve", "--status", "--app-name", "open", "--address", served.address, env=served.env)
    assert "no Serve application 'open' on this cluster (running: rayeval)" in status.stdout, status.stdout


def test_a_run_against_the_endpoint_equals_a_run_on_local_replicas_and_resumes_asking_nothing(
    served: Served, base_ifeval_records: list[dict], tmp_path: Path
) -> None:
    # the local side: a run of the same settings on a local replica (tests.runs.BASE_IFEVAL_ARGS)
    endpoint = [
        "--model",
        f"openai:{SERVED_NAME}",
        "--base-url",
        served.url,
        "--api-key-env",
        KEY_ENV,
        "--limit",
        "6",
        *RUN,
    ]
    first = rayeval(
        "run", *endpoint, "--output-dir", str(tmp_path), "--run-id", "endpoint", env=served.key_env
    )
    assert first.returncode == 0, first.stderr[-3000:]
    by_endpoint = records(tmp_path / "endpoint" / "samples" / SERVED_NAME / "ifeval.jsonl")
    by_local = base_ifeval_records
    assert len(by_endpoint) == len(by_local) == 6
    for mine, theirs in zip(by_endpoint, by_local, strict=True):
        assert mine["doc_id"] == theirs["doc_id"] and mine["error"] is None
        assert mine["output"] == theirs["output"] and mine["scores"] == theirs["scores"]
        assert mine["replica"] == "endpoint-0"
    summary = json.loads((tmp_path / "endpoint" / "summary.json").read_text())
    assert summary["run"]["endpoint"]["calls"]["requests"] == 6
    assert summary["run"]["endpoint"]["calls"]["failures"] == 0

    again = rayeval(
        "run", *endpoint, "--output-dir", str(tmp_path), "--run-id", "endpoint", env=served.key_env
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "6 of 6 requests reused" in again.stdout
    resumed = json.loads((tmp_path / "endpoint" / "summary.json").read_text())["run"]
    assert resumed["requests_generated"] == 0 and resumed["endpoint"]["calls"] is None  # no client started


def test_lm_evals_local_chat_completions_model_scores_a_task_through_the_served_model(
    served: Served, tmp_path: Path, local_lm_eval_tasks: Path
) -> None:
    tasks = local_lm_eval_tasks
    command = [
        sys.executable, "-m", "lm_eval", "--model", "local-chat-completions",
        "--model_args", f"model={SERVED_NAME},base_url={served.url}/chat/completions,num_concurrent=2,"
        "max_retries=2,tokenized_requests=False,tokenizer_backend=None",
        "--tasks", "gsm8k_local", "--include_path", str(tasks), "--apply_chat_template", "--limit", "3",
        "--gen_kwargs", "max_gen_toks=32", "--output_path", str(tmp_path / "out"), "--log_samples",
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=600, env={**os.environ, "OPENAI_API_KEY": served.key}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    logged = [p for p in (tmp_path / "out").rglob("samples_gsm8k_local_*.jsonl")]
    assert len(logged) == 1
    samples = records(logged[0])
    assert {s["doc_id"] for s in samples} == {0, 1, 2}  # one row per question and filter
    assert all(s["resps"][0][0].strip() for s in samples)
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())
    assert "exact_match,strict-match" in results["results"]["gsm8k_local"]


def test_a_run_judged_by_the_served_model_sends_the_key_as_model_client_and_as_judge(
    served: Served, tmp_path: Path
) -> None:
    data = write_judge_data(tmp_path / "data")
    done = rayeval(
        "run", "--model", f"openai:{SERVED_NAME}", "--base-url", served.url, "--api-key-env", KEY_ENV,
        "--tasks", "alpaca_eval", "--data-path", f"alpaca_eval={data['alpaca_eval']}", "--limit", "1",
        "--max-tokens", "16", "--no-progress", "--judge", f"openai:{SERVED_NAME}", "--judge-base-url", served.url,
        "--judge-api-key-env", KEY_ENV, "--judge-max-tokens", "8", "--output-dir", str(tmp_path), "--run-id", "judged",
        env=served.key_env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    calls = json.loads((tmp_path / "judged" / "summary.json").read_text())["run"]["endpoint"]["calls"]
    assert calls["requests"] == 1 and calls["failures"] == 0, calls
    judge_dir = tmp_path / "judged" / "judges" / f"openai-{SERVED_NAME}"
    backend = json.loads((judge_dir / "summary.json").read_text())["run"]["judge"]["backend"]
    assert backend["requests"] >= 1 and backend["failures"] == 0, backend  # no 401: the key went along
    assert served.key not in done.stdout + done.stderr


def test_the_key_is_in_no_file_of_the_cluster_no_state_listing_and_no_output(served: Served) -> None:
    """Only the key's digest reached the cluster: no file under the cluster's temporary folder (its session's
    logs, the runtime environments' agent log), no actor or task in Ray's state API, and not the deploy's
    output, holds the key."""
    needle = served.key.encode()
    files = [p for p in served.head.temp_dir.rglob("*") if p.is_file()]
    assert any(p.name.startswith("worker-") for p in files)  # the replicas' logs are among them
    assert [str(p) for p in files if needle in p.read_bytes()] == []
    script = (
        "import dataclasses, json, sys\n"
        "from ray.util.state import list_actors, list_tasks\n"
        "rows = [*list_actors(address=sys.argv[1], detail=True, limit=10000),\n"
        "        *list_tasks(address=sys.argv[1], detail=True, limit=10000)]\n"
        "print(json.dumps([dataclasses.asdict(row) for row in rows], default=str))\n"
    )
    listed = subprocess.run(
        [sys.executable, "-c", script, served.head.dashboard], capture_output=True, text=True, timeout=120,
        env={**served.env, "RAY_AUTH_MODE": "token"},
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert (
        "ServeReplica:rayeval:LLMServer" in listed.stdout
        and "ServeReplica:rayeval:ServeIngress" in listed.stdout
    )
    assert served.key not in listed.stdout
    assert served.key not in served.deploy_output


def test_a_served_replica_killed_mid_run_is_restarted_and_every_sample_is_scored_once(
    served: Served, tmp_path: Path
) -> None:
    shared = (
        warm_cluster()
    )  # the run's coordinator and clients on the tests' cluster, not a cluster of its own
    argv = [
        "run", "--model", f"openai:{SERVED_NAME}", "--base-url", served.url, "--api-key-env", KEY_ENV, "--limit", "12",
        "--max-concurrency", "4", "--endpoint-max-attempts", "12", *RUN,
        "--output-dir", str(tmp_path), "--run-id", "killed", *shared.run_args(),
    ]  # fmt: skip
    proc = start_in_background(argv, env={**shared.env(), KEY_ENV: served.key})
    wait_for_records(proc, tmp_path / "killed" / "cache" / "completions.jsonl", 4)
    killed = _kill_served_replica()
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-3000:]
    assert killed, "no Serve replica process of the model was found to kill"
    samples = records(tmp_path / "killed" / "samples" / SERVED_NAME / "ifeval.jsonl")
    assert sorted(s["doc_id"] for s in samples) == list(range(12))  # each question once
    assert all(s["error"] is None and s["output"] for s in samples)
    calls = json.loads((tmp_path / "killed" / "summary.json").read_text())["run"]["endpoint"]["calls"]
    assert calls["failures"] == 0 and calls["retries"] >= 1, calls  # the requests the kill cut were retried
    done = rayeval("serve", "--status", "--address", served.address, env=served.env, timeout=120)
    assert "replicas: 1 RUNNING" in done.stdout, done.stdout  # Serve put a new replica in its place


def _served_replica_pids() -> list[int]:
    found = subprocess.run(
        ["pgrep", "-f", f"ServeReplica:rayeval:LLMServer:{SERVED_NAME}"], capture_output=True, text=True
    ).stdout.split()
    return [int(pid) for pid in found]


def _kill_served_replica() -> list[int]:
    found = _served_replica_pids()
    for pid in found:
        os.kill(pid, signal.SIGKILL)
    time.sleep(1)
    return found


def test_shutdown_deletes_the_application_and_the_endpoint_stops_answering(served: Served) -> None:
    # the module's last test: it takes down what the others used (the fixture's own shutdown then finds nothing)
    done = rayeval("serve", "--shutdown", "--address", served.address, env=served.env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the Serve application 'rayeval' is shut down" in done.stdout
    with pytest.raises(openai.APIConnectionError):
        client(served).models.list()
    again = rayeval("serve", "--shutdown", "--address", served.address, env=served.env, timeout=120)
    assert again.returncode == 1 and "no Serve application 'rayeval' to shut down" in again.stdout
