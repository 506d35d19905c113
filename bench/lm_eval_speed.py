"""rayeval against lm-eval's own vLLM backend on the same lm-eval tasks, model, limit and machine.

    python bench/lm_eval_speed.py                  # lm-eval dp=1, rayeval 1 and 2 replicas, lm-eval dp=2 try
    python bench/lm_eval_speed.py --limit 50 --skip-dp2

Tasks: the local-data lm-eval tasks of tests/lm_eval_local.py (GSM8K generate_until 0-shot, a GSM8K
multiple-choice log-likelihood task, GSM8K solutions as loglikelihood_rolling documents), so nothing is
downloaded. Both sides use the embedded SmolLM2-135M-Instruct in the dtype rayeval resolves `--dtype` to
(default auto: bfloat16 where the CPU computes it natively, else float32; bench/dtypes.py), max_model_len 2048,
max_num_seqs 64, 1 GiB KV cache per engine, compiled (not eager) engines, greedy decoding.

Measured per configuration, each in its own process:
- wall: the whole command, start to exit (`lm_eval ...` vs `rayeval run ...`), what a user waits for;
- engine load: lm-eval's `VLLM(...)` construction (timed in a small driver that then calls simple_evaluate
  as lm_eval's CLI does); rayeval's slowest replica start from summary.json;
- generated tokens of the generate_until task (tokenised from the outputs, identical text → identical count)
  and tokens/s over the evaluation time (wall minus engine load).
lm-eval's data_parallel_size=2 asks Ray for one GPU per replica; on a CPU-only machine it never gets one.
The script gives it --dp2-timeout seconds and records the outcome. `same outputs` compares each configuration's
GSM8K generations with lm-eval dp=1's: in bf16 on CPU, vLLM's results depend on how requests are batched, so
`--batch-sensitivity` adds lm-eval itself at max_num_seqs=32 to show how much its own outputs move.
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.dtypes import dtype_fields, side_dtype  # noqa: E402
from tests.lm_eval_local import LOCAL_TASKS, lm_eval_vllm_env, write_local_tasks  # noqa: E402

OUT = REPO / "bench" / "out"
MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 64

DRIVER = """
import json, sys, time
began = time.perf_counter()
from lm_eval import simple_evaluate
from lm_eval.api.registry import get_model
from lm_eval.tasks import TaskManager
import_s = time.perf_counter() - began
model_args, tasks, include, limit, out, repo = sys.argv[1:7]
chat = sys.argv[7:8] == ["chat"]  # lm_eval --apply_chat_template
if "ifeval" in tasks:  # lm-eval's checkers need NLTK data that cannot be downloaded here: rayeval's offline Punkt
    sys.path.insert(0, repo)
    from evaluators.sentence_splitting import load_ifeval_utils
    load_ifeval_utils()

def prediction(resps):
    first = resps[0]
    if isinstance(first, str):
        return first
    if isinstance(first, list) and first and isinstance(first[0], str):
        return first[0]  # generation: the first of `repeats` draws
    return max(range(len(resps)), key=lambda i: resps[i][0][0])  # multiple choice: the likeliest choice

if __name__ == "__main__":
    began = time.perf_counter()
    lm = get_model("vllm").create_from_arg_string(model_args, {"batch_size": "auto"})
    load_s = time.perf_counter() - began
    began = time.perf_counter()
    results = simple_evaluate(model=lm, tasks=tasks.split(","), task_manager=TaskManager(include_path=include),
                              limit=int(limit), log_samples=True, apply_chat_template=chat)
    eval_s = time.perf_counter() - began
    outputs = {}
    for task, samples in results["samples"].items():
        first_filter = samples[0]["filter"] if samples else None
        by_doc = {s["doc_id"]: prediction(s["resps"]) for s in samples if s["filter"] == first_filter}
        outputs[task] = [by_doc[d] for d in sorted(by_doc)]
    json.dump({"engine_load_s": load_s, "evaluate_s": eval_s, "import_s": import_s, "outputs": outputs,
               "results": results["results"]}, open(out, "w"), default=str)
"""


def run_lm_eval(
    model: str,
    tasks_dir: Path,
    limit: int,
    dp: int,
    work: Path,
    timeout: float,
    max_num_seqs: int = MAX_NUM_SEQS,
    tasks: tuple[str, ...] = LOCAL_TASKS,
    engine_args: str = "",
    chat: bool = False,
) -> dict:
    """`lm_eval --model vllm` as its CLI runs it, in its own process; `outputs`: per task, each document's
    prediction (generated text, or the index of the likeliest choice)."""
    args = f"pretrained={model},max_model_len={MAX_MODEL_LEN},max_num_seqs={max_num_seqs}{engine_args}"
    name = f"lm-eval vllm dp={dp}" + ("" if max_num_seqs == MAX_NUM_SEQS else f" max_num_seqs={max_num_seqs}")
    if dp > 1:
        args += f",data_parallel_size={dp}"
    out = work / f"lm_eval_dp{dp}_seqs{max_num_seqs}.json"
    out.unlink(missing_ok=True)
    driver = work / "driver.py"
    driver.write_text(DRIVER)
    command = [
        sys.executable,
        str(driver),
        args,
        ",".join(tasks),
        str(tasks_dir),
        str(limit),
        str(out),
        str(REPO),
        *(["chat"] if chat else []),
    ]
    began = time.perf_counter()
    # Its own process group, so a timeout also ends the Ray cluster and engines the driver started.
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=lm_eval_vllm_env(work / "stand_in"), start_new_session=True)  # fmt: skip
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        return {"config": name, "error": f"no result within {timeout:g} s", "log_tail": stderr[-1500:]}
    wall = time.perf_counter() - began
    # vLLM's teardown at interpreter exit sometimes aborts (exit -6) after everything was written; the
    # driver writes its result file last, so its presence is what says the run completed.
    if not out.exists():
        return {"config": name, "error": f"exit {proc.returncode}", "log_tail": stderr[-2000:]}
    data = json.loads(out.read_text())
    return {"config": name, "exit_code": proc.returncode, "wall_s": wall, "engine_load_s": data["engine_load_s"],
            "evaluate_s": data["evaluate_s"], "outputs": data["outputs"], "results": data["results"]}  # fmt: skip


def rayeval_predictions(run_dir: Path, tasks: tuple[str, ...]) -> dict[str, list]:
    """Per task, each document's prediction from rayeval's sample records, as the lm-eval driver gives it."""
    summary = json.loads((run_dir / "summary.json").read_text())
    outputs = {}
    for task in tasks:
        path = run_dir / "samples" / summary["run"]["model"] / f"{task}.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        first = {r["doc_id"]: r["output"] for r in sorted(records, key=lambda r: -r.get("sample_index", 0))}
        texts = [first[d] for d in sorted(first)]
        if texts and texts[0].startswith(
            "[["
        ):  # log-likelihood answers: [[logprob, is_greedy], ...] per choice
            texts = [max(range(len(c)), key=lambda i, c=c: c[i][0]) for c in map(json.loads, texts)]
        outputs[task] = texts
    return outputs


def run_rayeval(
    tasks_dir: Path, limit: int, replicas: int, work: Path, tasks: tuple[str, ...] = LOCAL_TASKS, extra=()
) -> dict:
    run_id = f"r{replicas}-{time.time_ns()}"
    command = [
        sys.executable, "-m", "cluster.cli", "run", "--tasks", ",".join(tasks), "--include-path", str(tasks_dir),
        "--limit", str(limit), "--replicas", str(replicas), "--max-model-len", str(MAX_MODEL_LEN),
        "--max-num-seqs", str(MAX_NUM_SEQS), "--output-dir", str(work / "runs"), "--run-id", run_id,
        "--no-progress", *extra,
    ]  # fmt: skip
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=REPO)
    wall = time.perf_counter() - began
    name = f"rayeval {replicas} replica(s)"
    if done.returncode != 0:
        return {"config": name, "error": f"exit {done.returncode}", "log_tail": done.stderr[-2000:]}
    run_dir = work / "runs" / run_id
    run = json.loads((run_dir / "summary.json").read_text())["run"]
    engine_load = max(e["start_s"] for e in run["engines"])
    return {"config": name, "wall_s": wall, "engine_load_s": engine_load, "evaluate_s": wall - engine_load,
            "generation_s": run["generation_s"], "outputs": rayeval_predictions(run_dir, tasks),
            "results": json.loads((run_dir / "results.json").read_text())["results"]}  # fmt: skip


def count_tokens(model: str, texts: list[str]) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    return sum(len(tokenizer(t, add_special_tokens=False).input_ids) for t in texts)


def measure(args: argparse.Namespace, model: str, tasks_dir: Path, work: Path) -> list[dict]:
    """Every configuration's row, lm-eval dp=1 first; both sides in the dtype rayeval resolves `--dtype` to."""
    lm_eval_dtype = f",dtype={side_dtype(args.dtype, 'cpu')}"
    rayeval_dtype = ("--dtype", args.dtype)
    rows = [
        run_lm_eval(model, tasks_dir, args.limit, 1, work, timeout=3600, engine_args=lm_eval_dtype),
        run_rayeval(tasks_dir, args.limit, 1, work, extra=rayeval_dtype),
        run_rayeval(tasks_dir, args.limit, 2, work, extra=rayeval_dtype),
    ]
    if args.batch_sensitivity:
        rows.append(run_lm_eval(model, tasks_dir, args.limit, 1, work, timeout=3600, max_num_seqs=32,
                                engine_args=lm_eval_dtype))  # fmt: skip
    if not args.skip_dp2:
        rows.append(run_lm_eval(model, tasks_dir, args.limit, 2, work, timeout=args.dp2_timeout,
                                engine_args=lm_eval_dtype))  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--skip-dp2", action="store_true", help="do not try lm-eval's data_parallel_size=2")
    parser.add_argument("--dp2-timeout", type=float, default=150.0)
    parser.add_argument(
        "--batch-sensitivity",
        action="store_true",
        help="also run lm-eval with max_num_seqs=32: how much its own outputs move with the batch size",
    )
    parser.add_argument(
        "--dtype", default="auto", help="rayeval's --dtype; both sides run in what it resolves to"
    )
    args = parser.parse_args()

    from cluster.models import ensure_default_model
    from tests.conftest import SHARED

    model = str(ensure_default_model())
    work = Path(tempfile.mkdtemp(prefix="rayeval-bench-"))
    tasks_dir = write_local_tasks(
        work / "tasks", SHARED / "data" / "gsm8k" / "test.jsonl", rows=max(args.limit, 200)
    )
    rows = measure(args, model, tasks_dir, work)
    reference = rows[0]
    reference_outputs = reference.get("outputs", {}).get("gsm8k_local")
    for row in rows:
        if "outputs" in row:
            outputs = row.pop("outputs")["gsm8k_local"]
            row["generated_tokens"] = count_tokens(model, outputs)
            row["tokens_per_s"] = row["generated_tokens"] / row["evaluate_s"]
            row["same_outputs_as_lm_eval"] = outputs == reference_outputs
            row["ratio_to_lm_eval_wall"] = (
                row["wall_s"] / reference["wall_s"] if "wall_s" in reference else None
            )
    OUT.mkdir(parents=True, exist_ok=True)
    record = {"limit": args.limit, "tasks": LOCAL_TASKS, "cpus": os.cpu_count(), **dtype_fields(args.dtype, "cpu"),
              "rows": rows}  # fmt: skip
    (OUT / "lm_eval_speed.json").write_text(json.dumps(record, indent=2, default=str))
    print(
        "| config | wall s | engine load s | eval s | gen tokens | tok/s | wall vs lm-eval | same outputs |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for row in rows:
        if "error" in row:
            print(f"| {row['config']} | {row['error']} | | | | | | |")
            continue
        print(
            f"| {row['config']} | {row['wall_s']:.1f} | {row['engine_load_s']:.1f} | {row['evaluate_s']:.1f} | "
            f"{row['generated_tokens']} | {row['tokens_per_s']:.0f} | {row['ratio_to_lm_eval_wall']:.3f} | "
            f"{row['same_outputs_as_lm_eval']} |"
        )
    print(f"(full record in {OUT / 'lm_eval_speed.json'})")


if __name__ == "__main__":
    main()
