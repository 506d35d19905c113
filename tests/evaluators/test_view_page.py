"""The report page's file: whatever a sample holds (markup, a closing script tag, the page's own markers) stays
data, read back exactly from the page; nothing is fetched from anywhere."""

from __future__ import annotations

import json
import re

from evaluators.view import render_page

HOSTILE = '</script><script>alert(1)</script><!-- __DATA__ __JS__ "quoted" & <b>bold</b>'


def _embedded(page: str) -> dict:
    found = re.search(r'<script id="report-data" type="application/json">(.*?)</script>', page, flags=re.S)
    assert found is not None
    return json.loads(found.group(1))


def test_sample_text_stays_data_and_reads_back_exactly():
    data = {"kind": "run", "title": HOSTILE, "samples": {"t": [{"output": HOSTILE, "prompt": "p"}]}}
    page = render_page(data)
    assert _embedded(page) == data
    assert page.count("</script>") == 2  # the data's own and the script's, none from the sample
    assert "<title>&lt;/script&gt;" in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)


def _judged_run(folder, judges: dict[str, float], latest: str):
    """A run folder whose task `t` was judged by each of `judges` (slug -> its win rate); summary.json holds the
    latest judge's numbers, as a `--judge-only` run leaves it."""
    from evaluators.records import SampleRecord

    def metrics(rate: float) -> dict:
        return {"win_rate,none": {"mean": rate, "sem": 0.1, "ci95": [0.0, 1.0], "n": 2, "questions": 2}}

    def write(path, rate: float, judge: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [
            SampleRecord(
                "t", doc, 0, f"r{doc}", "q", "a", "", {"win_rate": rate}, judge=judge, verdicts={"ab": judge}
            )
            for doc in range(2)
        ]
        path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in rows))

    write(folder / "samples" / "m" / "t.jsonl", 0.0, "")
    for slug, rate in judges.items():
        write(folder / "judges" / slug / "samples" / "t.jsonl", rate, f"openai:{slug}")
        body = {"tasks": {"t": {"judge": f"openai:{slug}", "metrics": metrics(rate)}}}
        (folder / "judges" / slug / "summary.json").write_text(json.dumps(body))
    summary = {
        "run": {"run_id": folder.name},
        "tasks": {"t": {"judge": f"openai:{latest}", "metrics": metrics(judges[latest])}},
    }
    (folder / "summary.json").write_text(json.dumps(summary))


def test_a_run_judged_twice_shows_the_latest_judge_or_the_one_asked_for(tmp_path):
    from evaluators.view.data import run_page_data

    _judged_run(tmp_path / "run", {"first": 0.25, "second": 0.75}, latest="second")
    latest = run_page_data(tmp_path / "run")
    assert latest["tasks"][0]["judge"] == "openai:second"
    assert latest["tasks"][0]["metrics"][0]["mean"] == 0.75
    assert {s["judge"] for s in latest["samples"]["t"]} == {"openai:second"}
    asked = run_page_data(tmp_path / "run", judge="first")  # by folder name, as `--judge` takes it
    assert asked["tasks"][0]["judge"] == "openai:first"
    assert asked["tasks"][0]["metrics"][0]["mean"] == 0.25
    assert {s["verdicts"]["ab"] for s in asked["samples"]["t"]} == {"openai:first"}


def test_the_page_shows_every_number_the_results_table_shows(tmp_path):
    # lm-eval's non-mean aggregates, a judged task's bootstrap statistic and a withheld number, from the
    # summary.json rayeval writes (evaluators.report), beside the mean metrics
    from evaluators.judging.base import TaskStatistic
    from evaluators.report import TaskSummary, render_table, summary_json
    from evaluators.view.data import run_page_data

    wiki = TaskSummary("wiki", "2", 0, 62, 62, 62, 1, 0, {}, source="lm-eval")
    wiki.aggregate_only = {"word_perplexity,none": (21.3, None)}
    group = TaskSummary("group", "", 0, 100, 100, 100, 1, 3, {}, source="lm-eval")
    group.withheld = {"acc,none": "lm-eval counted the 3 failed sample(s) of its subtasks as answers"}
    judged = TaskSummary("alpaca_eval", "2", 0, 10, 10, 20, 2, 0, {})
    judged.statistics = [TaskStatistic("length_controlled_win_rate,none", 0.41, 0.05, 0.3, 0.5, "LC", True)]
    (tmp_path / "samples" / "m").mkdir(parents=True)
    (tmp_path / "samples" / "m" / "wiki.jsonl").write_text("")
    (tmp_path / "summary.json").write_text(json.dumps(summary_json([wiki, group, judged], {"run_id": "r"})))
    shown = {t["name"]: {m["key"]: m for m in t["metrics"]} for t in run_page_data(tmp_path)["tasks"]}
    assert shown["wiki"]["word_perplexity,none"]["mean"] == 21.3
    assert shown["group"]["acc,none (withheld)"]["mean"] is None
    assert "3 failed" in shown["group"]["acc,none (withheld)"]["definition"]
    lc = shown["alpaca_eval"]["length_controlled_win_rate,none (bootstrap)"]
    assert (lc["mean"], lc["sem"], lc["ci95"]) == (0.41, 0.05, [0.3, 0.5])
    table = render_table([wiki, group, judged])
    assert "21.3" in table and "withheld" in table and "0.4100" in table
