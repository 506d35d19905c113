"""RD-Agent's OpenCompass contract, with RD-Agent 1.0.0's own code as the client: its callers' name for
`run_benchmark`, switched to rayeval's by `install()`, benchmarks a peft LoRA adapter of the default model on
GSM8K (a slice of ../shared/data, 2 samples a question, pass@1 and pass@2) on the test run's Ray cluster; then
RD-Agent's own `run_benchmark` reads the folder rayeval wrote (its CSV pivot and `extract_error_samples`).
Every number is checked against one recomputed here from the sample records; a second call runs nothing.
Bad input (fast, no engine): RD-Agent's RuntimeError shape, nothing written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.integrations.rdagent import run_benchmark
from tests.cluster.run.test_lora import make_adapter

REPO = Path(__file__).resolve().parents[3]
RDAGENT_SITE = Path(sys.prefix) / "rdagent"  # the set-up's RD-Agent 1.0.0 (Makefile: RDAGENT_SITE)
SUMMARY = "benchmark_results/validation/rayeval/ft-gsm8k/summary.json"  # rayeval's own, beside OpenCompass's
METRIC = "exact_match,flexible-extract"  # what OpenCompass's GSM8K accuracy is (the last number)
CALL = {"model_name": "", "benchmark_name": "gsm8k", "gpu_count": 0, "test_range": "[-6:]", "num_runs": 2,
        "pass_k": [1, 2], "max_error_samples": 100, "result_subdir": "validation"}  # fmt: skip


def _call(mode: str, tmp_path: Path, call: dict, settings: dict | None = None) -> dict:
    assert (RDAGENT_SITE / "rdagent").is_dir(), (
        f"RD-Agent 1.0.0 is not installed in {RDAGENT_SITE}: run `make setup`"
    )
    cwd = tmp_path / f"cwd-{mode}"  # RD-Agent finds its templates under ./rdagent, and logs into ./log
    cwd.mkdir(exist_ok=True)
    if not (cwd / "rdagent").exists():
        (cwd / "rdagent").symlink_to(RDAGENT_SITE / "rdagent")
    env = {**os.environ, **(settings or {}).pop("_env", {})}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(RDAGENT_SITE)])
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # RD-Agent imports litellm, which would fetch it online
    argv = [sys.executable, str(Path(__file__).with_name("rdagent_calls.py")), mode, json.dumps(call)]
    if settings is not None:
        argv.append(json.dumps(settings))
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def benchmarked(tmp_path_factory, shared_gsm8k):
    """One round of two candidates benchmarked by one call (`run_benchmarks`), each in its own workspace: a
    trained (random) adapter and a fresh (zero) one, on one set of base-model replicas."""
    from cluster.models import ensure_default_model
    from tests.warm_cluster import warm_cluster

    root = tmp_path_factory.mktemp("rdagent")
    workspaces = [root / "candidate-1", root / "candidate-2"]
    adapters = [make_adapter(w / "adapter", random_init=i == 0) for i, w in enumerate(workspaces)]
    shared = warm_cluster()
    settings = {
        "address": shared.head.gcs_address,
        "data_paths": {"gsm8k": str(shared_gsm8k)},
        "config": {"model": {"enforce_eager": True, "max_model_len": 1024}, "sampling": {"max_tokens": 32}},
        "_env": shared.env(),
    }
    calls = [{**CALL, "workspace_path": str(w), "model_path": str(a), "model_name": str(ensure_default_model())}
             for w, a in zip(workspaces, adapters, strict=True)]  # fmt: skip
    results = _call("round", root, calls, dict(settings))
    return root, workspaces[0], calls[0], settings, results[0], workspaces[1]


def _records(workspace: Path) -> list[dict]:
    files = list((workspace / "benchmark_results/validation/rayeval/ft-gsm8k/samples").glob("*/gsm8k.jsonl"))
    assert len(files) == 1
    return [json.loads(line) for line in files[0].read_text().splitlines()]


def test_rayeval_answers_rdagents_call_with_numbers_recomputed_from_its_samples(benchmarked):
    _, workspace, _, _, result, _ = benchmarked
    records = _records(workspace)
    assert sorted({r["doc_id"] for r in records}) == list(range(1313, 1319))  # [-6:] of the 1,319 questions
    assert len(records) == 12 and {r["sample_index"] for r in records} == {0, 1}
    by_question: dict[int, list[float]] = {}
    for record in records:
        by_question.setdefault(record["doc_id"], []).append(record["scores"][METRIC])
    mean = sum(s for scores in by_question.values() for s in scores) / len(records)
    pass2 = sum(max(scores) for scores in by_question.values()) / len(by_question)
    expected = {
        "accuracy": round(100 * mean, 2),
        "pass@1": round(100 * mean, 2),
        "pass@2": round(100 * pass2, 2),
    }
    assert result["accuracy_summary"] == {"gsm8k": expected}
    summary = _summary(workspace)
    assert round(100 * summary["tasks"]["gsm8k"]["metrics"][METRIC]["mean"], 2) == expected["accuracy"]
    wrong = {r["prompt"] for r in records if r["scores"][METRIC] != 1.0}
    assert {e["question"] for e in result["error_samples"]} == wrong
    assert all(e["model_output"] and e["gold"] for e in result["error_samples"])


def test_rdagents_own_code_reads_rayevals_folder_as_rayeval_reported_it(benchmarked):
    root, _, call, _, result, _ = benchmarked
    # RD-Agent's own list of benchmarks lacks gsm8k; the folder it reads does not depend on the name
    read = _call("rdagent", root, {**call, "benchmark_name": "math"})
    assert read["accuracy_summary"] == result["accuracy_summary"]
    assert sorted(map(json.dumps, read["error_samples"])) == sorted(map(json.dumps, result["error_samples"]))
    # once installed, a benchmark rayeval does not run (humaneval) goes to RD-Agent's own function, kept by
    # install(): here it finds the finished folder and reads it, as above; rayeval's never joined a cluster
    delegated = _call("delegated", root, {**call, "benchmark_name": "humaneval"})
    assert delegated.pop("ray_imported") is False
    assert delegated["accuracy_summary"] == read["accuracy_summary"]


def test_a_second_call_finds_the_results_and_runs_nothing(benchmarked):
    root, workspace, call, settings, result, _ = benchmarked
    summary = workspace / SUMMARY
    written = summary.stat().st_mtime_ns
    again = _call("rayeval", root, call, dict(settings))  # RD-Agent's name for it, switched by install()
    assert again["patched"] == ["cluster.integrations.rdagent"] * 2
    assert again["accuracy_summary"] == result["accuracy_summary"] and not again["ray_imported"]
    assert summary.stat().st_mtime_ns == written
    assert len(list((workspace / "benchmark_results/validation").glob("202*_*"))) == 1


def test_the_rounds_candidates_ran_at_once_on_the_same_replicas(benchmarked):
    _, first, _, _, _, second = benchmarked
    runs = [_summary(w)["run"] for w in (first, second)]
    assert [r["engines_source"]["kind"] for r in runs] == ["sweep", "sweep"]
    assert {e["name"] for e in runs[0]["engines"]} == {e["name"] for e in runs[1]["engines"]}
    assert [r["adapter"]["path"] for r in runs] == [str((w / "adapter").resolve()) for w in (first, second)]
    assert runs[0]["timeline"]["first result"] < runs[1]["timeline"]["last result"]


def test_merged_candidates_run_in_turn_on_one_engine_and_answer_as_their_adapters_served(benchmarked):
    """`lora_merge`: the round's two adapters merged into the base model and run one after the other on the
    same replica (started on the first, reloaded in place for the second), float32 and greedy: the trained
    (random) one answers as it does served through vLLM's LoRA layers (one call, on the tests' LoRA pool), and
    each accuracy is the one its own samples give."""
    root, first, call, settings, _, second = benchmarked
    greedy = {**settings, "config": {"model": {"enforce_eager": True, "max_model_len": 1024, "dtype": "float32",
              "cpu_kv_cache_gib": 0.5}, "sampling": {"max_tokens": 32, "temperature": 0.0, "top_p": 1.0}}}  # fmt: skip
    candidates = [
        {**call, "num_runs": 1, "pass_k": [], "model_path": str(w / "adapter")} for w in (first, second)
    ]
    merged = [{**c, "workspace_path": str(root / f"merged-{i}")} for i, c in enumerate(candidates)]
    results = _call("round", root, merged, {**greedy, "lora_merge": True})
    runs = [_summary(Path(c["workspace_path"]))["run"] for c in merged]
    assert [r["engines"][0]["loaded_by"] for r in runs] == ["start", "reload"]
    assert runs[0]["engines"][0]["pid"] == runs[1]["engines"][0]["pid"] and not any(
        r["adapter"] for r in runs
    )
    served = {**candidates[0], "workspace_path": str(root / "served")}
    _call("rayeval", root, served, dict(greedy))
    assert _summary(Path(served["workspace_path"]))["run"]["engines_source"]["kind"] == "warm"
    answers = {r["doc_id"]: r["output"] for r in _records(Path(served["workspace_path"]))}
    assert {r["doc_id"]: r["output"] for r in _records(Path(merged[0]["workspace_path"]))} == answers
    for candidate, result in zip(merged, results, strict=True):
        records = _records(Path(candidate["workspace_path"]))
        mean = sum(r["scores"][METRIC] for r in records) / len(records)
        assert result["accuracy_summary"]["gsm8k"]["accuracy"] == round(100 * mean, 2)


def _summary(workspace: Path) -> dict:
    return json.loads((workspace / SUMMARY).read_text())


@pytest.fixture(scope="module")
def adapter_copy(tmp_path_factory):
    return make_adapter(tmp_path_factory.mktemp("bad") / "adapter", random_init=False)


def _refused(tmp_path: Path, adapter: Path, match: str, **call: object) -> None:
    from cluster.models import ensure_default_model
    from tests.conftest import SHARED

    arguments = {**CALL, "workspace_path": str(tmp_path), "model_path": str(adapter),
                 "model_name": str(ensure_default_model()), **call}  # fmt: skip
    with pytest.raises(RuntimeError, match=r"Benchmark execution failed \(exit_code=2\)\n(.|\n)*" + match):
        run_benchmark(**arguments, data_paths={"gsm8k": str(SHARED / "data" / "gsm8k" / "test.jsonl")})
    assert not (tmp_path / "benchmark_results").exists()


def test_an_unknown_benchmark_is_refused_with_the_supported_names(tmp_path, adapter_copy):
    _refused(tmp_path, adapter_copy, "no benchmark named 'aime25': it runs gsm8k, ifeval, math, mmlu",
             benchmark_name="aime25")  # fmt: skip


def test_a_misspelt_setting_is_refused_not_dropped(tmp_path, adapter_copy):
    _refused(tmp_path, adapter_copy, "no 'adress' \\(did you mean 'address'\\?\\)", adress="auto")
    _refused(tmp_path, adapter_copy, "`cluster.replicaz` is not a setting \\(did you mean `replicas`\\?\\)",
             config={"cluster": {"replicaz": 2}})  # fmt: skip


def test_a_missing_adapter_file_is_refused(tmp_path, adapter_copy):
    broken = tmp_path / "broken"
    shutil.copytree(adapter_copy, broken)
    (broken / "adapter_model.safetensors").unlink()
    _refused(tmp_path, broken, "has no adapter_model.safetensors or adapter_model.bin")


def _with_config(tmp_path: Path, adapter: Path, **changes: object) -> Path:
    """A copy of the adapter whose adapter_config.json has these changes."""
    changed = tmp_path / "changed"
    shutil.copytree(adapter, changed)
    config = json.loads((changed / "adapter_config.json").read_text())
    (changed / "adapter_config.json").write_text(json.dumps({**config, **changes}))
    return changed


def test_an_adapter_for_another_base_model_is_refused(tmp_path, adapter_copy):
    other = _with_config(tmp_path, adapter_copy, target_modules=["c_attn"])
    _refused(tmp_path, other, "target_modules c_attn are not modules of")


def test_an_adapter_with_modules_trained_whole_is_merged_first(tmp_path, adapter_copy):
    """vLLM serves no modules_to_save: the call's run is on the merged model (the merge itself is checked
    against peft's in tests/cluster/models/test_merge.py)."""
    from cluster.integrations.rdagent import benchmark_config
    from cluster.models import ensure_default_model

    saved = _with_config(tmp_path, adapter_copy, modules_to_save=["input_layernorm"])
    config = benchmark_config(str(saved), str(ensure_default_model()), "gsm8k", 0, "[:5]", 1, None,
                              tmp_path / "benchmark_results", {})  # fmt: skip
    merged = Path(config.model.path)
    assert config.model.lora is None and merged.name.startswith(
        f"{ensure_default_model().name}+{saved.name}-"
    )
    assert (merged / "model.safetensors").is_file() and not (tmp_path / "benchmark_results").exists()


def test_bad_ranges_are_refused(tmp_path, adapter_copy):
    _refused(tmp_path, adapter_copy, "getpid\\(\\)\" is not a form a range may use",
             test_range="[:__import__('os').getpid()]")  # fmt: skip


def test_a_benchmark_whose_task_could_not_run_fails_the_call_and_leaves_no_finished_folder(tmp_path):
    """lm-eval failing to load or score a task ends the run with `task_errors` and no numbers for it; the
    call must fail as RD-Agent's own does, and the layout's timestamped folder (RD-Agent's "done") must go,
    or every later call would read its empty summary. The run result here is the dataclass rayeval returns,
    built with such an error (causing one needs a broken lm-eval task on a live engine)."""
    from cluster.config import RunConfig
    from cluster.errors import ClusterError
    from cluster.integrations.rdagent import _check_every_task_ran
    from cluster.run.result import RunResult

    done = tmp_path / "benchmark_results" / "20261207_001500"
    (done / "summary").mkdir(parents=True)
    config = RunConfig(work_dir=str(tmp_path / "benchmark_results"), output_layout="opencompass")

    def result(task_errors: dict[str, str]) -> RunResult:
        return RunResult(Path("RUN"), [], "", 0.0, 0.0, 0, 0, 0, 0, 0, task_errors=task_errors)

    _check_every_task_ran(config, result({}))  # a run that ran its tasks: nothing happens
    assert done.exists()
    with pytest.raises(ClusterError, match="mmlu could not run: lm-eval could not load it"):
        _check_every_task_ran(config, result({"mmlu": "lm-eval could not load it"}))
    assert not done.exists()


def test_the_base_model_is_found_where_rdagent_keeps_it_also_for_an_adapter_trained_in_its_container(
    tmp_path, adapter_copy, monkeypatch
):
    """RD-Agent outside its container keeps models under its file_path (FT_FILE_PATH, else
    git_ignore_folder/finetune_files where it runs); an adapter trained inside names /assets/models/NAME."""
    from cluster.integrations.rdagent import _model_and_adapter
    from cluster.models import ensure_default_model

    monkeypatch.delenv("FT_FILE_PATH", raising=False)
    monkeypatch.chdir(tmp_path)
    models = tmp_path / "git_ignore_folder" / "finetune_files" / "models"
    models.mkdir(parents=True)
    (models / "Qwen3-1.7B").symlink_to(ensure_default_model())
    docker = _with_config(tmp_path, adapter_copy, base_model_name_or_path="/assets/models/Qwen3-1.7B")
    assert _model_and_adapter(docker, "Qwen/Qwen3-1.7B") == (str(models / "Qwen3-1.7B"), str(docker))
    assert _model_and_adapter(docker, "Qwen3-1.7B")[0] == str(models / "Qwen3-1.7B")
    monkeypatch.setenv("FT_FILE_PATH", str(tmp_path / "elsewhere"))  # RD-Agent's setting moves it
    assert _model_and_adapter(docker, "Qwen/Qwen3-1.7B")[0] == "Qwen/Qwen3-1.7B"  # a hub id: not found here


def test_rdagents_sampling_for_each_base_model_comes_from_its_own_models_yaml(tmp_path):
    """RD-Agent's get_model_inference_config (exact name, then longest prefix, over its `default`) decides a
    call's sampling: greedy for Qwen2.5-7B-Instruct, top_k 20 and 38,912 tokens for Qwen3-1.7B; as task
    options, lm-eval's tasks take them too. It decides the engines' context (its max_seq_len, 32,768 and
    40,960; the embedded model's 8,192 would cut it, which VLLM_ALLOW_LONG_MAX_MODEL_LEN lifts as in vLLM) and
    whether outputs are scored after their thinking (Qwen3's enable_thinking: OpenCompass's
    extract-non-reasoning-content, which RD-Agent adds)."""
    from cluster.models import ensure_default_model

    names = ["Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen3-1.7B"]
    cwd = tmp_path / "cwd-sampling"
    cwd.mkdir()
    (cwd / "rdagent").symlink_to(RDAGENT_SITE / "rdagent")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(RDAGENT_SITE)]),
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("rdagent_calls.py")), "sampling",
         str(ensure_default_model()), json.dumps(names)],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    entries = json.loads(done.stdout.strip().splitlines()[-1])
    sampling = {name: {k: entries[name].get(k) for k in ("temperature", "top_p", "top_k", "max_tokens")}
                for name in names}  # fmt: skip
    assert sampling == {
        "Qwen/Qwen2.5-7B-Instruct": {"temperature": 0.0, "top_p": 1.0, "top_k": 1, "max_tokens": 8192},
        "Qwen/Qwen3-1.7B": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 38912},
    }
    engines = {name: (entries[name]["max_model_len"], entries[name]["think_end_token"]) for name in names}
    assert engines == {"Qwen/Qwen2.5-7B-Instruct": (32768, None), "Qwen/Qwen3-1.7B": (40960, "</think>")}
    # repetition_penalty is 1.0, vLLM's none, in each entry: left out, as where no penalty is set
    assert not any("repetition_penalty" in entries[name] for name in names)


def test_rdagents_context_is_cut_to_what_the_model_declares_and_replies_fit_in_it(tmp_path, monkeypatch):
    """Without RD-Agent imported its `default` holds: max_seq_len 32,768 on the embedded model, which declares
    8,192, runs at 8,192 (RD-Agent's vLLM would refuse to start); its 8,192-token replies would fill that and
    leave lm-eval's tasks no prompt, so they get half. A caller's sampling reaches the task, lm-eval's too, and
    a repetition_penalty RD-Agent sets."""
    from cluster.integrations.rdagent import RDAGENT_DEFAULT_INFERENCE, benchmark_config, rdagent_sampling
    from cluster.models import ensure_default_model

    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    monkeypatch.delenv("FT_FORCE_THINK_TOKEN", raising=False)
    model = str(ensure_default_model())
    config = benchmark_config(model, "any/base", "math", 0, "[:4]", 1, None, tmp_path, {})
    engine = (config.model.max_model_len, config.tasks[0].max_tokens, config.model.think_end_token)
    assert engine == (8192, 4096, None)
    chosen = {"config": {"sampling": {"max_tokens": 1024, "seed": 3}}}
    config = benchmark_config(model, "any/base", "math", 0, "[:4]", 1, None, tmp_path, chosen)
    assert (config.tasks[0].name, config.tasks[0].max_tokens, config.sampling.seed) == (
        "minerva_math",
        1024,
        3,
    )
    shorter = {"config": {"model": {"max_model_len": 4096}}}  # the caller's context bounds RD-Agent's replies
    config = benchmark_config(model, "any/base", "math", 0, "[:4]", 1, None, tmp_path, shorter)
    assert (config.model.max_model_len, config.tasks[0].max_tokens) == (4096, 2048)
    monkeypatch.setenv("FT_FORCE_THINK_TOKEN", "true")  # RD-Agent's setting: its CoT postprocessor applies
    config = benchmark_config(model, "any/base", "gsm8k", 0, "[:4]", 1, None, tmp_path, {})
    assert config.model.think_end_token == "</think>"
    penalised = RDAGENT_DEFAULT_INFERENCE | {"repetition_penalty": 1.05}  # a models.yaml entry that sets one
    assert rdagent_sampling(penalised, 8192)["repetition_penalty"] == 1.05
