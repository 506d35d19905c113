"""`rayeval sweep` over LoRA adapters made here with peft for the embedded default model: every good adapter
is scored on the same base-model engines (one engine per replica for the whole sweep), one above the engines'
LoRA rank and a broken one are skipped with their reasons, a zero-initialised one reproduces the base model's
greedy outputs exactly, and the same command again, from another node's empty staging folder, generates
nothing: that sweep's folder is on object storage (a real S3-compatible server). With --lora-merge the same
adapters run merged into the base weights: the rank limit no longer applies, and each random adapter merged
gives the greedy outputs it gave served through vLLM's LoRA layers (float32)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cluster.models import ensure_default_model
from tests.cluster.run.test_lora import make_adapter
from tests.runs import BASE_IFEVAL_ARGS, MODEL_DIR, rayeval, records
from tests.warm_cluster import warm_cluster


def patterned_adapter(folder: Path, rank: int, **options: object) -> Path:
    """A random adapter on q_proj and v_proj (the other adapters' modules, so merged steps reload in place)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(rank)
    model = AutoModelForCausalLM.from_pretrained(ensure_default_model(), dtype=torch.float32)
    config = LoraConfig(
        r=rank, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False, **options
    )
    get_peft_model(model, config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> Path:
    """A training run's folder: step_100 zero-initialised, checkpoint-200 random, step_300 random of rank 32
    (above the engines' max_lora_rank 16), step_400 random with rank_pattern and alpha_pattern, step_500
    broken (its config's rank 64 is not its weights' 4)."""
    run = tmp_path_factory.mktemp("lora-run")
    make_adapter(run / "step_100", random_init=False)
    make_adapter(run / "checkpoint-200", random_init=True)
    patterned_adapter(run / "step_300", 32)
    patterned_adapter(
        run / "step_400", 8, rank_pattern={"v_proj": 2}, alpha_pattern={"layers.3.self_attn.q_proj": 2}
    )
    broken = run / "step_500"
    shutil.copytree(run / "step_100", broken)
    config = json.loads((broken / "adapter_config.json").read_text()) | {"r": 64}
    (broken / "adapter_config.json").write_text(json.dumps(config))
    return run


# the base model's settings (float32, whose CPU kernels are batch-invariant, so the zero adapter's outputs
# cannot depend on sharing its batches with the other adapter's requests)
COMMON = [*BASE_IFEVAL_ARGS, "--limit", "3"]


@pytest.fixture(scope="module")
def base_outputs(base_ifeval_records) -> list[str]:
    return [r["output"] for r in base_ifeval_records[:3]]


@pytest.fixture(scope="module")
def served(lora_run, tmp_path_factory, s3) -> tuple[Path, list[str]]:
    """The sweep of the adapters served through vLLM's LoRA layers, two replicas, its folder on object storage
    (the S3-compatible server of tests/object_store.py): the folder as downloaded from the store, and the
    arguments."""
    node = tmp_path_factory.mktemp("served-node")
    args = ["sweep", str(lora_run), *COMMON, "--output-dir", s3.uri("sweeps"), "--run-id", "sweep",
            "--replicas", "2"]  # fmt: skip
    done = rayeval(*args, env={**s3.env(), "RAYEVAL_STAGING_DIR": str(node)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 300" in done.stdout and "skipped" in done.stdout
    assert f"sweep in {s3.uri('sweeps/sweep')} (" in done.stdout
    return s3.download("sweeps/sweep", tmp_path_factory.mktemp("served")), args


def outputs(root: Path, step: str, name: str) -> list[str]:
    rows = records(root / step / "samples" / f"{MODEL_DIR}+{name}" / "ifeval.jsonl")
    assert len(rows) == 3
    return [r["output"] for r in rows]


def test_a_lora_sweep_scores_every_good_adapter_on_one_engine_per_replica(served, base_outputs, s3):
    root, args = served
    sweep = json.loads((root / "sweep.json").read_text())
    by_step = {s["step"]: s for s in sweep["steps"]}
    assert [by_step[s]["status"] for s in (100, 200, 300, 400, 500)] == [
        "done",
        "done",
        "skipped",
        "done",
        "skipped",
    ]
    assert "rank 32 is above the engine's max_lora_rank 16" in by_step[300]["reason"]
    assert "rank 64 is above the engine's max_lora_rank 16" in by_step[500]["reason"]
    # one pool of two engines served every adapter: the same two engine processes in every step
    assert sweep["engine_starts"] == 1
    assert (
        sorted(by_step[100]["engine_pids"])
        == sorted(by_step[200]["engine_pids"])
        == sorted(by_step[400]["engine_pids"])
    )
    assert len(set(by_step[100]["engine_pids"])) == 2

    assert outputs(root, "step_100", "step_100") == base_outputs
    assert outputs(root, "step_200", "checkpoint-200") != base_outputs

    summary = (root / "sweep_summary.csv").read_text().splitlines()
    assert summary[0].startswith("series,step,task,metric")
    assert {line.split(",")[1] for line in summary[1:]} == {"100", "200", "400"}
    assert (root / "ifeval.png").stat().st_size > 0

    # the same sweep from another node, nothing staged there: every step resumes from the store
    other = {**s3.env(), "RAYEVAL_STAGING_DIR": str(root.parent / "other-node")}
    again = rayeval(*args, env=other)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(s3.read("sweeps/sweep")["sweep.json"])["engine_starts"] == 0
    assert "0 of 3 requests generated" in again.stdout
    # one step only, from a third node: the curves it uploads keep the steps other sweeps finished
    third = {**s3.env(), "RAYEVAL_STAGING_DIR": str(root.parent / "third-node")}
    one = rayeval(*args, "--steps", "400", env=third)
    assert one.returncode == 0, one.stderr[-3000:]
    uploaded = s3.read("sweeps/sweep")["sweep_summary.csv"].decode().splitlines()
    assert {line.split(",")[1] for line in uploaded[1:]} == {"100", "200", "400"}


def test_merged_adapters_run_as_checkpoints_and_answer_as_served(lora_run, served, base_outputs, tmp_path):
    shared = warm_cluster()  # the tests' cluster, where its merged checkpoints start engines of their own
    done = rayeval("sweep", str(lora_run), *COMMON, "--output-dir", str(tmp_path), "--lora-merge",
                   *shared.run_args(), env=shared.env())  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    root = tmp_path / f"sweep-{lora_run.name}"
    by_step = {s["step"]: s for s in json.loads((root / "sweep.json").read_text())["steps"]}
    assert [by_step[s]["status"] for s in (100, 200, 300, 400, 500)] == ["done"] * 4 + ["skipped"]
    assert "rank 4, but adapter_config.json gives it rank 64" in by_step[500]["reason"]
    assert [by_step[s]["loaded_by"] for s in (100, 200, 300, 400)] == [
        ["start"],
        ["reload"],
        ["reload"],
        ["reload"],
    ]
    assert by_step[100]["engine_pids"] == by_step[400]["engine_pids"]
    assert (
        outputs(root, "step_100", "step_100") == base_outputs
    )  # B = 0: the merged weights are the base weights
    served_root, _ = served
    for folder, name in (("step_200", "checkpoint-200"), ("step_400", "step_400")):
        assert outputs(root, folder, name) == outputs(served_root, folder, name), name
    assert outputs(root, "step_300", "step_300") != base_outputs  # rank 32: merged, not served


def test_the_sweeps_page_draws_each_curve_and_compares_two_steps(served, tmp_path):
    """`rayeval view` on the sweep's folder and on two of its steps, in headless Chromium: a curve per task and
    metric with a point per finished step whose values are sweep_summary.csv's, a point opens its step's page;
    the comparison's numbers are `rayeval compare`'s, and it lists exactly the questions whose answers differ."""
    import csv

    from selenium.webdriver.common.by import By

    from tests.browser import chromium, css, open_page, screenshot

    root = tmp_path / "sweep"
    shutil.copytree(served[0], root)
    done = rayeval("view", str(root))
    assert done.returncode == 0, done.stderr[-3000:]
    page = Path(done.stdout.strip().splitlines()[-1])
    assert page == root / "report" / "index.html"
    with (root / "sweep_summary.csv").open() as handle:
        table = list(csv.DictReader(handle))
    curves = {f"{r['task']} / {r['metric']}" for r in table}
    with chromium() as browser:
        open_page(browser, page)
        drawn = {svg.get_attribute("data-curve"): svg for svg in css(browser, "svg.curve")}
        assert set(drawn) == curves
        for row in table:
            cell = browser.find_element(By.CSS_SELECTOR, f'#steps-table tr[data-step="{row["step"]}"]')
            assert f"{float(row['mean']):.4f}" in cell.text
        screenshot(browser, "sweep")
        points = drawn[sorted(curves)[0]].find_elements(By.CSS_SELECTOR, "a.point")
        assert sorted(int(p.get_attribute("data-step")) for p in points) == [100, 200, 400]
        browser.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))",
                               next(p for p in points if p.get_attribute("data-step") == "200"))  # fmt: skip
        assert browser.current_url.endswith("/step_200/report/index.html")
        assert "step_200" in browser.find_element(By.ID, "title").text

    compared = rayeval(
        "compare", str(root / "step_100"), str(root / "step_200"), "--output", str(tmp_path / "c.json")
    )
    assert compared.returncode == 0, compared.stderr[-3000:]
    numbers = json.loads((tmp_path / "c.json").read_text())["metrics"]
    done = rayeval("view", str(root / "step_100"), str(root / "step_200"))
    assert done.returncode == 0, done.stderr[-3000:]
    first = {
        r["doc_id"]: r
        for r in records(root / "step_100" / "samples" / f"{MODEL_DIR}+step_100" / "ifeval.jsonl")
    }
    second = {
        r["doc_id"]: r
        for r in records(root / "step_200" / "samples" / f"{MODEL_DIR}+checkpoint-200" / "ifeval.jsonl")
    }
    differing = {
        d
        for d in first
        if (first[d]["output"], first[d]["scores"]) != (second[d]["output"], second[d]["scores"])
    }
    with chromium() as browser:
        open_page(browser, Path(done.stdout.strip().splitlines()[-1]))
        for metric in numbers:
            row = browser.find_element(By.CSS_SELECTOR, f'#results tr[data-metric="{metric["metric"]}"]')
            cells = {
                c.get_attribute("data-col"): c.text
                for c in row.find_elements(By.CSS_SELECTOR, "td[data-col]")
            }
            assert cells["difference"] == f"{metric['difference']:.4f}"
            assert cells["p_adjusted"] == (
                f"{metric['p_adjusted']:.4f}" if metric["p_adjusted"] is not None else "n/a"
            )
            assert cells["sem"] == (f"{metric['sem']:.4f}" if metric["sem"] is not None else "n/a")
            assert cells["questions"].split()[0] == str(metric["questions"])
        assert {int(p.get_attribute("data-doc")) for p in css(browser, ".pair")} == differing
        screenshot(browser, "comparison")


def test_a_sweep_logs_each_step_to_mlflow_at_its_step(lora_run, served, tmp_path):
    """The finished sweep run again with --log-to (every step read back from its store, no engine): one
    MLflow run named after the sweep's folder holds each metric at steps 100, 200 and 400, as
    sweep_summary.csv has them."""
    import csv

    import mlflow

    from tests.mlflow_server import mlflow_server

    shutil.copytree(served[0], tmp_path / "sweep")
    with mlflow_server(tmp_path / "mlflow") as uri:  # stopped after the test (its ~0.5 GB back)
        shared = warm_cluster()
        done = rayeval("sweep", str(lora_run), *COMMON, "--output-dir", str(tmp_path), "--run-id", "sweep",
                       "--log-to", f"mlflow:{uri}", *shared.run_args(), env=shared.env())  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        client = mlflow.MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name("rayeval")
        runs = client.search_runs([experiment.experiment_id], filter_string="tags.`rayeval.name` = 'sweep'")
        assert len(runs) == 1
        with (tmp_path / "sweep" / "sweep_summary.csv").open() as handle:
            table = list(csv.DictReader(handle))
        for row in table:
            history = client.get_metric_history(
                runs[0].info.run_id, f"{row['task']}/{row['metric'].partition(',')[0]}"
            )
            by_step = {m.step: m.value for m in history}
            assert by_step[int(row["step"])] == pytest.approx(float(row["mean"]), abs=1e-9)
        assert sorted({m.step for m in history}) == [100, 200, 400]
        # the same sweep again: every step reused, none logged a second time (MLflow would hold it twice)
        again = rayeval("sweep", str(lora_run), *COMMON, "--output-dir", str(tmp_path), "--run-id", "sweep",
                        "--log-to", f"mlflow:{uri}", *shared.run_args(), env=shared.env())  # fmt: skip
        assert again.returncode == 0, again.stderr[-3000:]
        history = client.get_metric_history(runs[0].info.run_id, "ifeval/prompt_level_strict_acc")
        assert sorted(m.step for m in history) == [100, 200, 400]


def test_the_pages_of_a_sweep_on_object_storage_go_beside_its_files(served, s3, tmp_path):
    """`rayeval view s3://...` (the sweep as it is on the store, read from another node's empty staging): the
    sweep's page and each step's are written up beside the folders they show, and the page's URI is printed."""
    done = rayeval(
        "view", s3.uri("sweeps/sweep"), env={**s3.env(), "RAYEVAL_STAGING_DIR": str(tmp_path / "node")}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == f"{s3.uri('sweeps/sweep')}/report/index.html"
    stored = s3.read("sweeps/sweep")
    local = Path(done.stdout.strip().splitlines()[0])
    assert stored["report/index.html"] == local.read_bytes()
    assert {f"step_{s}/report/index.html" for s in (100, 200, 400)} <= set(stored)
