"""Judged tasks end to end: real Ray, real vLLM CPU engines of SmolLM2-135M as the model under test and as
the local judge; and an API judge against a loopback OpenAI-compatible stand-in server.

The stand-in (tests/judge_api_standin.py) stands for an external judge API this machine cannot reach; it
exists to inject faults on a schedule (429 with Retry-After, 500, timeouts, HTML and choiceless 200s,
unparseable verdicts, an outage), to timestamp every request it receives, and to be a second judge whose
verdicts depend on the outputs it is shown (for `rayeval compare` over two judges). Everything else runs for
real through the `rayeval` CLI.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from cluster.models import ensure_default_model
from tests import runs
from tests.judge_api_standin import JudgeApiStandin, Outage, Served, standin_answer
from tests.judge_local_data import write_judge_data
from tests.runs import records

pytestmark = pytest.mark.slow

TASKS = ["alpaca_eval", "arena_hard", "healthbench", "writingbench"]
ENGINE_FLAGS = [
    "--enforce-eager",
    "--max-tokens",
    "48",
    "--judge-max-tokens",
    "96",
    "--max-model-len",
    "1024",  # the judges' prompts are at most ~400 tokens (+ 96 answered): the tests' warm pool serves both
]
N = 2
LOCAL_JUDGE_DIR = "local-SmolLM2-135M-Instruct"


def rayeval(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return runs.rayeval(*args, "--no-progress", env=env)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    return write_judge_data(tmp_path_factory.mktemp("judge-data"))


@pytest.fixture(scope="module")
def pipelined_run(tmp_path_factory, data):
    """One full run: generation (N=2, sampled) and judging by the local SmolLM2 judge, pipelined."""
    out = tmp_path_factory.mktemp("runs")
    judge = f"local:{ensure_default_model()}"
    data_flags = [f for task in TASKS for f in ("--data-path", f"{task}={data[task]}")]
    base = ["run", "--tasks", ",".join(TASKS), *data_flags, "--num-samples", str(N), "--temperature", "0.7",
            "--output-dir", str(out), "--run-id", "judged", *ENGINE_FLAGS]  # fmt: skip
    done = rayeval(*base, "--judge", judge, "--judge-replicas", "1")
    assert done.returncode == 0, done.stderr[-4000:]
    return out / "judged", base, done


QUESTIONS = {"alpaca_eval": 4, "arena_hard": 3, "healthbench": 2, "writingbench": 2}


def test_every_sample_is_judged_or_counted_failed_with_its_reason(pipelined_run):
    run_dir, _, _ = pipelined_run
    judge_dir = run_dir / "judges" / LOCAL_JUDGE_DIR
    summary = json.loads((run_dir / "summary.json").read_text())
    per_judge = json.loads((judge_dir / "summary.json").read_text())
    assert set(per_judge["tasks"]) == set(TASKS)
    for task in TASKS:
        generated = records(run_dir / "samples" / "SmolLM2-135M-Instruct" / f"{task}.jsonl")
        judged = records(judge_dir / "samples" / f"{task}.jsonl")
        assert (judge_dir / "samples" / f"{task}.parquet").exists()
        assert len(generated) == len(judged) == QUESTIONS[task] * N
        assert {(r["doc_id"], r["sample_index"]) for r in judged} == {
            (d, i) for d in range(QUESTIONS[task]) for i in range(N)
        }
        body = summary["tasks"][task]
        assert body["judge"] == "local:SmolLM2-135M-Instruct"
        failed = [r for r in judged if r["error"]]
        scored = [r for r in judged if not r["error"]]
        assert body["failed"] == len(failed)
        assert sum(body["failure_reasons"].values()) == len(failed)
        # a 96-token judgment without a verdict is one cut at the limit (JudgeTruncated) or one that ended
        assert set(body["failure_reasons"]) <= {
            "JudgeParseError",
            "JudgeTruncated",
            "JudgeVLLMValidationError",
        }
        for record in scored:
            assert record["scores"] and record["verdicts"] and record["judge"]
        for record in failed:  # the judge's raw answers are kept for every failure it answered
            assert record["error"].startswith("Judge") and "judgment" in record["error"]
        metric = next(iter(body["metrics"].values()))
        assert metric["scored_samples"] == len(scored)


def test_judging_overlaps_generation_and_the_timeline_is_reported(pipelined_run):
    run_dir, _, done = pipelined_run
    judge = json.loads((run_dir / "summary.json").read_text())["run"]["judge"]
    gen_start, gen_end = judge["generation_s"]
    judge_start, judge_end = judge["judging_s"]
    assert judge_start < gen_end, "judging must start before the last output is generated"
    assert judge["overlap_s"] > 0
    assert judge["requests"] == judge["asked"] > 0
    assert "overlapped" in done.stderr


def test_rerun_reuses_outputs_and_judgments_without_starting_an_engine(pipelined_run):
    run_dir, base, first = pipelined_run
    again = rayeval(*base, "--judge", f"local:{ensure_default_model()}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 to generate" in again.stderr
    assert "starting" not in again.stderr  # neither the model's nor the judge's replicas
    judge = json.loads((run_dir / "summary.json").read_text())["run"]["judge"]
    assert judge["asked"] == 0 and judge["reused_from_cache"] == judge["requests"]


def _schedule(key: str, attempt: int) -> str:
    bucket = int(key, 16) % 8
    if bucket == 0:
        return "500"  # fails on every attempt: the sample is counted failed, JudgeAPIError
    if bucket == 1:
        return "429" if attempt == 1 else "ok"
    if bucket == 2:
        return "500" if attempt == 1 else "ok"
    if bucket == 3:
        return "timeout" if attempt == 1 else "ok"
    if bucket == 4:
        return "garbage"  # an answer without a verdict: JudgeParseError
    if bucket == 5:
        return "html" if attempt == 1 else "ok"  # a proxy's error page with status 200
    if bucket == 6:
        return "no_choices" if attempt == 1 else "ok"
    return "ok"


FAILING = ("429", "500", "timeout", "html", "no_choices")  # what the schedule and the outage fail with


def retries_seen(served: list[Served], attempts: int) -> int:
    """Retries the judges must have made. A pass of a request ends after `attempts` failures or at an
    answer, so of a request's f failed attempts, f // attempts ended a failed pass; the rest were retried."""
    failed: dict[str, int] = {}
    for s in served:
        failed[s.key] = failed.get(s.key, 0) + (s.action in FAILING)
    return sum(f - f // attempts for f in failed.values())


def test_judge_only_with_a_faulty_api_judge_rate_limited_across_two_actors(pipelined_run):
    run_dir, _, _ = pipelined_run
    rps, attempts = 12.0, 3
    # The first 48 requests all fail: with at most 8 requests in the two actors at once, at least
    # (48 - 8 * 2) / 3 judgments fail every attempt of their first pass in it; a second pass recovers them.
    outage = Outage(requests=48, then=_schedule)
    with JudgeApiStandin(standin_answer, outage, retry_after_s=0.3, timeout_sleep_s=3.0) as api:
        done = rayeval(
            "run", "--judge-only", "--output-dir", str(run_dir.parent), "--run-id", run_dir.name,
            "--judge", "openai:standin-judge", "--judge-base-url", api.base_url, "--judge-replicas", "2",
            "--judge-rps", str(rps), "--judge-max-concurrency", "4", "--judge-timeout", "1",
            "--judge-max-attempts", str(attempts), "--judge-api-key-env", "STANDIN_KEY",
            "--judge-second-pass-pause", "1",  # the outage ends by a count of requests, not by time
            env={"STANDIN_KEY": "sk-test-standin"},
        )  # fmt: skip
        served = api.log()
    assert done.returncode == 0, done.stderr[-4000:]
    assert "to generate" in done.stderr and "starting 1 engine" not in done.stderr  # no generation at all
    assert "sk-test-standin" not in done.stderr + done.stdout

    assert {s.replica for s in served} == {"api-judge-0", "api-judge-1"}
    judge_dir = run_dir / "judges" / "openai-standin-judge"
    assert (run_dir / "judges" / LOCAL_JUDGE_DIR / "summary.json").exists()  # the two judges side by side
    summary = json.loads((judge_dir / "summary.json").read_text())
    always_500 = {s.key for s in served if int(s.key, 16) % 8 == 0}
    check_second_passes(served, always_500, attempts, done.stderr)
    check_judged_records(judge_dir, summary, attempts)

    # Retries counted: every failed attempt that was not a request's last one was retried.
    backend = summary["run"]["judge"]["backend"]
    assert backend["retries"] == retries_seen(served, attempts)
    for action, reason in (("429", "429"), ("html", "not_json"), ("no_choices", "no_choices")):
        # only ever a first attempt, so always retried
        assert backend["retries_by_reason"].get(reason, 0) == sum(1 for s in served if s.action == action)
    assert backend["failures_by_reason"]["5xx"] >= 2 * len(always_500)
    # Task statistics with a judge that answers: the LC win rate and the bootstrap CI are numbers.
    stats = summary["tasks"]["alpaca_eval"]["statistics"]
    assert 0.0 <= stats["length_controlled_win_rate,none"]["value"] <= 1.0
    assert "rounds" in stats["length_controlled_win_rate,none"]["method"]
    arena = summary["tasks"]["arena_hard"]["statistics"]["score,none"]
    assert arena["ci95"][0] <= arena["value"] <= arena["ci95"][1]

    # The limit held across both actors (one limiter for the cluster, not one per actor, which would let 2 x rps
    # through). The limiter spaces its grants 1/rps apart; the server sees each request a varying moment after
    # its grant (the actor's Ray call, the HTTP send), so a 1-second window of arrivals may hold a few more
    # than rps + 1 when the machine is busy: the mean rate is checked to 10 %, the busiest second to 1.5 x rps.
    times = sorted(s.arrival for s in served)
    busiest = max(sum(1 for t in times if start <= t < start + 1.0) for start in times)
    assert busiest <= 1.5 * rps, busiest
    assert (len(times) - 1) / (times[-1] - times[0]) <= 1.1 * rps


def check_second_passes(served: list[Served], always_500: set[str], attempts: int, stderr: str) -> None:
    """Judgments that failed every attempt got one more pass: the outage's recovered, the always-500 not."""
    asked = {s.key: sum(1 for t in served if t.key == s.key) for s in served}
    assert all(asked[key] == 2 * attempts for key in always_500)  # every attempt of both passes
    second_passes = {key for key, count in asked.items() if count > attempts}
    assert second_passes - always_500, "the outage failed no judgment that a second pass could recover"
    assert all(served_last(served, key).action in ("ok", "garbage") for key in second_passes - always_500)
    assert "second pass: asking the judge again" in stderr


def check_judged_records(judge_dir: Path, summary: dict, attempts: int) -> None:
    """Every sample is scored, or failed by its judge: an API that failed twice, or a verdict-less answer."""
    for task in TASKS:
        judged = records(judge_dir / "samples" / f"{task}.jsonl")
        assert len(judged) == QUESTIONS[task] * N
        body = summary["tasks"][task]
        assert body["judge"] == "openai:standin-judge"
        assert set(body["failure_reasons"]) <= {"JudgeAPIError", "JudgeParseError"}
        for record in judged:
            if record["error"] is None:
                assert record["scores"]
            elif record["error"].startswith("JudgeAPIError"):
                assert f"after {attempts} attempts (and again on a second pass" in record["error"]
            else:
                assert record["error"].startswith("JudgeParseError")
                assert "I think both are fine." in record["judge_outputs"].values()
    failures = {reason for task in TASKS for reason in summary["tasks"][task]["failure_reasons"]}
    assert failures == {"JudgeAPIError", "JudgeParseError"}


def served_last(served: list[Served], key: str) -> Served:
    return max((s for s in served if s.key == key), key=lambda s: s.attempt)


def test_inference_only_generates_and_leaves_judged_tasks_unjudged(pipelined_run):
    run_dir, base, _ = pipelined_run
    done = rayeval(*base, "--inference-only")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "judging starts" not in done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    for task in TASKS:
        body = summary["tasks"][task]
        assert body["metrics"] == {} and "--inference-only" in body["judge"]
        assert body["num_samples"] == QUESTIONS[task] * N


def varied_answer(messages: list[dict]) -> str:
    """A stand-in judge whose well-formed verdict depends on what it is shown (a hash of the judge prompt), so
    two runs' different outputs get different verdicts."""
    system, shown = messages[0]["content"], messages[-1]["content"]
    pick = int(hashlib.sha256(shown.encode()).hexdigest(), 16)
    if "criteria_met" in system:
        return json.dumps({"explanation": "Checked.", "criteria_met": pick % 2 == 0})
    if "[[A>>B]]" in system:
        return "My answer: ...\n" + ("[[A>>B]]", "[[A>B]]", "[[A=B]]", "[[B>A]]", "[[B>>A]]")[pick % 5]
    if "Rating: [[X]]" in system:
        return f"Rating: [[{1 + pick % 10}]]"
    return "[[A]]" if pick % 2 else "[[B]]"


def judged_means(folder: Path, task: str, key: str) -> dict[int, tuple[float, float]]:
    """Per question, from a judge's scored samples: (mean of score x weight, mean weight) over its scored
    samples."""
    per_question: dict[int, list[tuple[float, float]]] = {}
    for r in records(folder / "samples" / f"{task}.jsonl"):
        if r["error"] is None and key in r["scores"]:
            weight = r["weights"][key]
            per_question.setdefault(r["doc_id"], []).append((r["scores"][key] * weight, weight))
    return {
        q: (float(np.mean([v for v, _ in s])), float(np.mean([w for _, w in s])))
        for q, s in per_question.items()
    }


def test_compare_pairs_one_named_judges_verdicts_on_every_judged_task(pipelined_run, tmp_path):
    """Run A (judged by the local judge) is judged again by a second judge; run B, a second draw of the same
    questions, by that judge only. A has two judges, so compare asks which; with --judge, each row is the
    paired difference of that judge's verdicts, computed here from its scored samples."""
    run_a, base, _ = pipelined_run
    judge = ["--judge", "openai:varied-judge", "--judge-base-url", "", "--judge-api-key-env", "STANDIN_KEY",
             "--judge-rps", "50"]  # fmt: skip
    env = {"STANDIN_KEY": "sk-test-standin"}
    b_args = [
        *base[: base.index("--output-dir")],
        "--output-dir",
        str(tmp_path),
        "--run-id",
        "b",
        "--seed",
        "77",
    ]
    with JudgeApiStandin(varied_answer) as api:
        judge[3] = api.base_url
        again = rayeval("run", "--judge-only", "--output-dir", str(run_a.parent), "--run-id", run_a.name, *judge,
                        env=env)  # fmt: skip
        assert again.returncode == 0, again.stderr[-3000:]
        second = rayeval(*b_args, *ENGINE_FLAGS, *judge, env=env)
        assert second.returncode == 0, second.stderr[-3000:]
    run_b = tmp_path / "b"
    ambiguous = runs.rayeval("compare", str(run_a), str(run_b))
    assert ambiguous.returncode == 2 and "--judge NAME" in ambiguous.stderr
    assert f"local:{runs.MODEL_DIR}" in ambiguous.stderr and "openai:varied-judge" in ambiguous.stderr

    out = tmp_path / "cmp.json"
    done = runs.rayeval(
        "compare", str(run_a), str(run_b), "--judge", "openai:varied-judge", "--output", str(out)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["metrics"]
    assert {row["task"] for row in rows} == set(TASKS)
    moved = 0
    for row in rows:
        assert row["judge_a"] == row["judge_b"] == "openai:varied-judge"
        a, b = (
            judged_means(r / "judges" / "openai-varied-judge", row["task"], row["metric"])
            for r in (run_a, run_b)
        )
        shared = sorted(a.keys() & b.keys())
        ya, xa, yb, xb = (np.array([side[q][i] for q in shared]) for side in (a, b) for i in (0, 1))
        mean_a, mean_b = ya.sum() / xa.sum(), yb.sum() / xb.sum()
        assert row["questions"] == len(shared) == QUESTIONS[row["task"]]
        assert row["mean_a"] == pytest.approx(mean_a, rel=1e-12) and row["mean_b"] == pytest.approx(
            mean_b, rel=1e-12
        )
        assert row["difference"] == pytest.approx(mean_b - mean_a, rel=1e-12, abs=1e-12)
        z = (yb - mean_b * xb) / xb.mean() - (ya - mean_a * xa) / xa.mean()
        assert row["sem"] == pytest.approx(float(stats.sem(z)), rel=1e-9, abs=1e-12)
        moved += row["difference"] != 0
    assert moved, "the second draw's verdicts should differ somewhere"
    local = runs.rayeval("compare", str(run_a), str(run_b), "--judge", f"local:{runs.MODEL_DIR}")
    assert local.returncode == 2 and f"has no verdicts of judge local:{runs.MODEL_DIR}" in local.stderr


def test_the_report_page_shows_each_judgment_and_filters_the_failed(pipelined_run, tmp_path):
    """`rayeval view` on the judged run, in headless Chromium: a pairwise task's sample shows the judge's
    verdict and rationale for each order, and "failed only" shows exactly the records that failed."""
    import shutil

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from tests.browser import chromium, css, open_page, screenshot

    run_dir = tmp_path / "judged"
    shutil.copytree(pipelined_run[0], run_dir)
    # other tests of this module may have judged the run again with other judges: the local judge's verdicts
    done = runs.rayeval("view", str(run_dir), "--judge", LOCAL_JUDGE_DIR)
    assert done.returncode == 0, done.stderr[-3000:]
    judged = records(run_dir / "judges" / LOCAL_JUDGE_DIR / "samples" / "arena_hard.jsonl")
    with chromium() as browser:
        open_page(browser, Path(done.stdout.strip().splitlines()[-1]))
        Select(browser.find_element(By.ID, "task-select")).select_by_value("arena_hard")
        count = browser.find_element(By.ID, "match-count")
        assert count.text == f"{len(judged)} match"
        browser.find_element(By.ID, "failed-only").click()
        failed = {(r["doc_id"], r["sample_index"]) for r in judged if r["error"]}
        assert count.text == f"{len(failed)} match"
        assert {
            (int(s.get_attribute("data-doc")), int(s.get_attribute("data-index")))
            for s in css(browser, ".sample")
        } == failed
        browser.find_element(By.ID, "failed-only").click()
        # the first judged sample of any task (the small local judge may fail every judgment of one task)
        task, first = next(
            (task, r)
            for task in TASKS
            for r in sorted(
                records(run_dir / "judges" / LOCAL_JUDGE_DIR / "samples" / f"{task}.jsonl"),
                key=lambda r: (r["doc_id"], r["sample_index"]),
            )
            if r["verdicts"] and not r["error"]
        )
        Select(browser.find_element(By.ID, "task-select")).select_by_value(task)
        row = browser.find_element(
            By.CSS_SELECTOR, f'.sample[data-doc="{first["doc_id"]}"][data-index="{first["sample_index"]}"]'
        )
        row.find_element(By.CSS_SELECTOR, ".summary").click()
        # textContent: the text as the page holds it (Selenium's .text is the rendered, whitespace-normalised one)
        rationales = [
            p.get_attribute("textContent") for p in row.find_elements(By.CSS_SELECTOR, "pre.rationale")
        ]
        assert rationales == [first["judge_outputs"].get(order, "") for order in first["verdicts"]]
        if task in ("alpaca_eval", "arena_hard"):
            assert len(first["verdicts"]) == 2  # a pairwise task is judged in both orders
        verdicts = [p.get_attribute("textContent") for p in row.find_elements(By.CSS_SELECTOR, "pre.verdict")]
        assert verdicts == [str(v) for v in first["verdicts"].values()]
        browser.execute_script("arguments[0].scrollIntoView()", row)
        screenshot(browser, "judged-sample")
