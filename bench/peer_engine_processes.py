"""The peers' vLLM engines that the test suite starts, with vLLM's processes as they are and with
VLLM_ENABLE_V1_MULTIPROCESSING=0 (`in-process`).

By default a vLLM `LLM` spawns its engine core, and on CPU the core spawns its one worker: each process imports
vLLM and torch again. With the switch off, `LLM` keeps both in its own process, and `vllm serve` keeps its
worker inside the engine core's process (its front end still spawns the core): rayeval's CPU engines run their
worker that way too. Two workloads, each turn a fresh process, sides alternating:

- `lm-eval-reference`: tests/cluster/lm_eval/test_lm_eval.py's two reference runs (`python -m
  tests.lm_eval_reference`: lm-eval's `vllm` backend and evaluator, the module's tasks, limits and engine);
  `wall_s` is that process's, and `same_as_first` says whether every run's responses and filtered responses
  (log-likelihoods included; per document and filter) equal the first turn's (None in the first turn);
- `vllm-serve`: tests/cluster/endpoints/test_endpoint_lm_eval.py's `vllm serve` command; `up_s` from its
  start to its first answer of /v1/models, then eight greedy completions, whose texts `same_as_first` compares.

    python bench/peer_engine_processes.py --out bench/results/peer-engine-processes-native-bf16.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.rows import commit_of, write_row  # noqa: E402
from tests.runs import ENGINE_IN_ONE_PROCESS  # noqa: E402

SIDES = {"default": {}, "in-process": ENGINE_IN_ONE_PROCESS}
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k" / "test.jsonl"
PROMPTS = [f"Question: What is {a} plus {a + 7}?\nAnswer:" for a in range(8)]


def reference_turn(work: Path, side: str) -> dict:
    """The lm-eval module's reference runs in one process; each sample's responses per run, task, document
    and filter (lm-eval logs a document once per filter), for the comparison."""
    from tests.cluster.lm_eval import test_lm_eval as module
    from tests.lm_eval_local import lm_eval_vllm_env, write_local_tasks

    tasks = work / "tasks"
    if not tasks.exists():
        write_local_tasks(tasks, GSM8K, max_gen_toks=64)
    out = Path(tempfile.mkdtemp(dir=work))
    model_args = ",".join([f"pretrained={module.default_model_path()}",
                           *(f"{k}={v}" for k, v in module.ENGINE.items())])  # fmt: skip
    runs = [{"tasks": list(module.PLAIN_TASKS), "limit": int(module.LIMIT),
             "options": {"fewshot_as_multiturn": False}, "out": str(out / "plain")},
            {"tasks": list(module.CHAT_GROUP), "limit": int(module.CHAT_LIMIT),
             "options": module.CHAT_ARGUMENTS, "out": str(out / "chat")}]  # fmt: skip
    spec = out / "spec.json"
    spec.write_text(json.dumps({"model_args": model_args, "include_path": str(tasks), "runs": runs}))
    env = {**lm_eval_vllm_env(out / "stand_in"), **SIDES[side]}
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tests.lm_eval_reference", str(spec)], env=env, cwd=ROOT,
                          capture_output=True, timeout=900, check=False)  # fmt: skip
    wall = time.perf_counter() - began
    samples = {}
    for run in runs:
        for path in sorted(Path(run["out"]).rglob("samples_*.jsonl")):
            task = path.name.removeprefix("samples_").rsplit("_", 1)[0]
            for line in path.read_text().splitlines():
                entry = json.loads(line)
                key = f"{Path(run['out']).name}/{task}/{entry['doc_id']}/{entry['filter']}"
                samples[key] = [entry["resps"], entry["filtered_resps"]]
    return {
        "wall_s": round(wall, 2),
        "returncode": done.returncode,
        "samples": len(samples),
        "answers": samples,
    }


def serve_turn(port: int, side: str) -> dict:
    """`vllm serve` as the endpoint module starts it: seconds to its first answer, and eight greedy texts."""
    from tests.cluster.endpoints.test_endpoint_lm_eval import SERVER, default_model_dir
    from tests.runs import every_core_binding, wait_until_answering

    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(default_model_dir()),
               "--served-model-name", "smol", "--port", str(port), *SERVER]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **every_core_binding(), **SIDES[side]}
    began = time.perf_counter()
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)  # fmt: skip
    try:
        try:
            wait_until_answering(f"http://127.0.0.1:{port}/v1/models", server, poll_s=0.25)
        except RuntimeError as error:
            sys.exit(str(error))
        up = time.perf_counter() - began
        body = {"model": "smol", "prompt": PROMPTS, "max_tokens": 32, "temperature": 0}
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})  # fmt: skip
        choices = json.loads(urllib.request.urlopen(request, timeout=120).read())["choices"]  # noqa: S310
        processes = len(_group(server.pid))
    finally:
        _stop_group(server)
    texts = {str(c["index"]): c["text"] for c in choices}
    return {"up_s": round(up, 2), "processes": processes, "answers": texts}


def _group(pid: int) -> list[str]:
    return subprocess.run(["pgrep", "-s", str(pid)], capture_output=True, text=True).stdout.split()


def _stop_group(server: subprocess.Popen) -> None:
    """SIGTERM to the server's session, SIGKILL after 60 s; returns once none of its processes is left, so
    that the next turn starts on idle cores."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + 60
        # poll() reaps the server once it exits: unreaped, it would stay in its session as a zombie
        while (server.poll() is None or _group(server.pid)) and time.time() < deadline:
            time.sleep(0.25)
        if server.poll() is not None and not _group(server.pid):
            return


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="JSONL file the rows are appended to")
    parser.add_argument("--workloads", default="lm-eval-reference,vllm-serve")
    parser.add_argument("--repeats", type=int, default=2, help="turns per side")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="peer-engines-") as work:
        for workload in args.workloads.split(","):
            first: dict | None = None
            for turn in range(args.repeats):
                for side in list(SIDES) if turn % 2 == 0 else list(SIDES)[::-1]:
                    if workload == "lm-eval-reference":
                        row = reference_turn(Path(work), side)
                    else:
                        row = serve_turn(18800 + turn, side)
                    answers = row.pop("answers")
                    # the first turn is what the others are compared with: None there
                    same = None if first is None else (answers == first and bool(answers))
                    first = first if first is not None else answers
                    write_row(args.out, {"bench": "peer-engine-processes", "workload": workload, "side": side,
                                         "turn": turn, "dtype": "float32", **row, "same_as_first": same,
                                         "commit": commit_of()})  # fmt: skip


if __name__ == "__main__":
    main()
