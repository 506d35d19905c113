"""`rayeval view RUN_DIR` on a real run (the shared base IFEval run), opened from file:// in headless Chromium:
the visible table equals summary.json, each filter shows exactly the samples a recount of the run's JSONL
finds, a sample opens its prompt and output, and the page holds no network reference. The judged run's page
is tested in tests/cluster/judging/test_judging.py, the sweep's and a comparison's in
tests/cluster/sweep/test_lora_sweep.py (their fixtures' folders)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.browser import chromium, css, open_page, screenshot
from tests.runs import MODEL_DIR, rayeval, records


def view(*folders: Path) -> Path:
    done = rayeval("view", *map(str, folders))
    assert done.returncode == 0, done.stderr[-3000:]
    page = Path(done.stdout.strip().splitlines()[-1])
    assert page.is_file()
    return page


def test_a_run_page_shows_summary_values_and_filters_samples_as_the_records_say(base_ifeval_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(base_ifeval_run, run)  # the shared run's folder stays as other tests expect it
    page = view(run)
    assert page == run / "report" / "index.html"
    html = page.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing fetched from anywhere
    summary = json.loads((run / "summary.json").read_text())["tasks"]
    rows = records(run / "samples" / MODEL_DIR / "ifeval.jsonl")
    first_metric = next(iter(summary["ifeval"]["metrics"]))
    with chromium() as browser:
        open_page(browser, page)
        for key, metric in summary["ifeval"]["metrics"].items():
            row = browser.find_element(
                By.CSS_SELECTOR, f'#results tr[data-task="ifeval"][data-metric="{key}"]'
            )
            cell = {
                c.get_attribute("data-col"): c.text
                for c in row.find_elements(By.CSS_SELECTOR, "td[data-col]")
            }
            assert cell["mean"] == f"{metric['mean']:.4f}" and cell["sem"] == f"{metric['sem']:.4f}"
            assert cell["n"] == str(metric["n"]) and cell["questions"] == str(metric["questions"])
            assert row.find_element(By.CSS_SELECTOR, "td.metric").get_attribute("title")  # its definition
        count = browser.find_element(By.ID, "match-count")
        assert count.text == f"{len(rows)} match"

        browser.find_element(By.ID, "max-score").send_keys("0")
        browser.find_element(By.ID, "sort").click()  # leaves the field: its change applies the filter
        zero = [r for r in rows if not r["error"] and r["scores"][first_metric] <= 0]
        assert count.text == f"{len(zero)} match"
        shown = {
            (int(s.get_attribute("data-doc")), int(s.get_attribute("data-index")))
            for s in css(browser, ".sample")
        }
        assert shown == {(r["doc_id"], r["sample_index"]) for r in zero}
        browser.find_element(By.ID, "max-score").clear()
        browser.find_element(By.ID, "sort").click()

        browser.find_element(By.ID, "failed-only").click()
        assert count.text == f"{sum(1 for r in rows if r['error'])} match"
        browser.find_element(By.ID, "failed-only").click()

        word = max(rows[0]["output"].split(), key=len)
        browser.find_element(By.ID, "search").send_keys(word)
        expected = [r for r in rows if word.lower() in f"{r['prompt']}\n{r['output']}\n{r['target']}".lower()]
        browser.implicitly_wait(0)
        for _ in range(50):  # the search waits 150 ms after typing
            if count.text == f"{len(expected)} match":
                break
            browser.execute_script("return new Promise(r => setTimeout(r, 100))")
        assert count.text == f"{len(expected)} match"

        css(browser, ".sample .summary")[0].click()
        details = browser.find_element(By.CSS_SELECTOR, ".sample .details")
        assert (
            details.find_element(By.CSS_SELECTOR, "pre.output").get_attribute("textContent")
            == expected[0]["output"]
        )
        assert browser.find_element(By.CSS_SELECTOR, "#config pre").text.startswith("model:")
        assert css(browser, "#engines tbody tr")
        browser.execute_script("window.scrollTo(0, 0)")
        screenshot(browser, "run")


def test_ten_thousand_samples_page_and_filter_without_freezing(base_ifeval_run, tmp_path):
    """A run folder whose sample file repeats the real run's records to 12,000 (this test's own folder: the
    page's size is its subject): each filter change redraws within a second."""
    run = tmp_path / "big"
    shutil.copytree(base_ifeval_run, run, ignore=shutil.ignore_patterns("*.parquet", "report"))
    source = run / "samples" / MODEL_DIR / "ifeval.jsonl"
    rows = records(source)
    copies = [{**r, "doc_id": i * len(rows) + r["doc_id"]} for i in range(12_000 // len(rows)) for r in rows]
    source.write_text("".join(json.dumps(r) + "\n" for r in copies))
    page = view(run)
    with chromium() as browser:
        open_page(browser, page)
        ready_ms = int(browser.find_element(By.TAG_NAME, "body").get_attribute("data-ready-ms"))
        print(f"12,000-sample page interactive {ready_ms} ms after navigation began")
        assert ready_ms < 6000  # the goal is 3 s; a loaded CI machine gets slack
        assert browser.find_element(By.ID, "match-count").text == f"{len(copies)} match"
        assert len(css(browser, ".sample")) == 50  # one page drawn
        took = browser.execute_script(
            "const t = performance.now(); const box = document.getElementById('failed-only');"
            "box.click(); box.click(); document.getElementById('next-page').click();"
            "return performance.now() - t;"
        )
        assert took < 1000
        assert "page 2 of" in browser.find_element(By.CSS_SELECTOR, ".page-info").text
        Select(browser.find_element(By.ID, "sort")).select_by_value("score-desc")
        assert len(css(browser, ".sample")) == 50


def test_view_refuses_what_is_not_a_run(tmp_path):
    done = rayeval("view", str(tmp_path))
    assert done.returncode == 2 and "has no readable summary.json" in done.stderr
    done = rayeval("view", str(tmp_path), str(tmp_path), str(tmp_path))
    assert done.returncode == 2 and "one folder, or two run folders" in done.stderr
    (tmp_path / "summary.json").write_text(json.dumps({"run": {}, "tasks": {}}))
    done = rayeval("view", str(tmp_path))
    assert done.returncode == 2 and "holds no sample records" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]  # the folder untouched
