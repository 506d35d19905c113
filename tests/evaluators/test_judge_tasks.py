"""Judged tasks offline: verdict parsers on hand-written judge answers, scoring, statistics, packaged data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from evaluators.errors import DataError
from evaluators.judging.alpaca_eval import AlpacaEval
from evaluators.judging.arena_hard import VERDICTS, ArenaHard
from evaluators.judging.base import JudgedItem, JudgedSample, JudgeParseError, JudgeTask
from evaluators.judging.healthbench import HealthBench
from evaluators.judging.parsing import bracket_verdict, extract_json_object, integer_rating, template_digest
from evaluators.judging.statistics import length_controlled_win_rate, ratio_statistic
from evaluators.judging.tasks import JUDGE_TASKS
from evaluators.judging.writingbench import WritingBench
from evaluators.tasks.base import MetricValue, Sample

AB = ("A", "B")


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


# --- parsers -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "allowed", "expected"),
    [
        ("[[A]]", AB, "A"),
        ("Output A misses the second part of the question, B covers both.\n\n[[B]]", AB, "B"),
        ("Verdict: [[ A ]]", AB, "A"),
        ("**[[B]]**", AB, "B"),
        ("I prefer B. [[B]]\nFinal: [[B]]", AB, "B"),  # the same label repeated is fine
        ("My own answer: ...\nComparison: ...\nMy final verdict is [[B>>A]]", VERDICTS, "B>>A"),
        ("Final verdict: [[ A > B ]]", VERDICTS, "A>B"),
        ("[[A = B]]", VERDICTS, "A=B"),
        ("Use `if [[ -f config ]]; then` in bash.\n[[A>B]]", VERDICTS, "A>B"),  # code is not a verdict
    ],
)
def test_bracket_verdict_reads_the_label(answer, allowed, expected):
    assert bracket_verdict(answer, allowed, "k") == expected


@pytest.mark.parametrize(
    ("answer", "allowed", "found"),
    [
        ("A is better at first sight [[A]], but on reflection [[B]]", AB, "conflicting"),
        ("Output A is clearly better.", AB, "no \\[\\[...\\]\\] verdict"),
        ("[[C]]", AB, "only the unknown label"),
        ("[[A>>>B]]", VERDICTS, "only the unknown label"),
        ("[[A<<B]]", VERDICTS, "only the unknown label"),
        ("[[A>B]] ... no wait, [[B>A]]", VERDICTS, "conflicting"),
        ("", AB, "no"),
    ],
)
def test_bracket_verdict_rejects_unreadable_answers(answer, allowed, found):
    with pytest.raises(JudgeParseError, match=rf"judgment 'model_first': expected .*\[\[A.*found {found}"):
        bracket_verdict(answer, allowed, "model_first")


def test_parse_error_quotes_a_truncated_answer():
    with pytest.raises(JudgeParseError) as error:
        bracket_verdict("x" * 1000 + " The end.", AB, "reference_first")
    message = str(error.value)
    assert "reference_first" in message and "The end." in message
    assert len(message) < 400


@pytest.mark.parametrize(
    "answer",
    [
        '{"explanation": "It advises an ER visit.", "criteria_met": true}',
        '```json\n{"explanation": "It advises an ER visit.", "criteria_met": true}\n```',
        'Here is my grading:\n{"explanation": "x {with braces}", "criteria_met": true}\nThanks.',
        '{"criteria_met": true, "explanation": "nested", "detail": {"a": 1}}',
    ],
)
def test_extract_json_object_tolerates_fences_and_prose(answer):
    assert extract_json_object(answer, "rubric-003", "criteria_met")["criteria_met"] is True


@pytest.mark.parametrize(
    "answer",
    [
        '{"explanation": "The response recommends',  # truncated
        '{"explanation": "no verdict field"}',
        "criteria_met: true",
        '{"explanation": "python literal", "criteria_met": True}',
        '{"criteria_met": true} and on second thought {"criteria_met": false}',
    ],
)
def test_extract_json_object_rejects(answer):
    with pytest.raises(JudgeParseError, match=r"judgment 'rubric-003': expected a JSON object"):
        extract_json_object(answer, "rubric-003", "criteria_met")


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("The piece follows the structure closely.\nRating: [[7]]", 7),
        ("Rating: [[ 10 ]]", 10),
        ("Rating: [[1]]", 1),
        ("Rating: [[8]] (as said: Rating: [[8]])", 8),
        ('```json\n{"score": 6}\n```', 6),
        ('{"reason": "solid", "score": 9}', 9),
        ("The table's [[2]] stays as it is.\nRating: [[8]]", 8),  # the asked-for form outranks a quoted [[2]]
        ('{"score": 6}\n[[6]]', 6),  # two forms that agree
    ],
)
def test_integer_rating_reads_the_score(answer, expected):
    assert integer_rating(answer, "criterion-2") == expected


@pytest.mark.parametrize(
    ("answer", "found"),
    [
        ("Rating: [[0]]", "out-of-range rating 0"),
        ("Rating: [[11]]", "out-of-range rating 11"),
        ("Rating: [[7.5]]", "non-integer rating"),
        ('{"score": 7.5}', "non-integer rating"),
        ('{"score": "7"}', "non-integer rating"),
        ("A good essay overall; I would give it a seven.", "no rating"),
        ("Rating: seven", "no rating"),
        ("Rating: [[6]] ... Rating: [[8]]", "conflicting ratings"),
        # a bracketed number quoted from the text beside another form's rating: neither is picked
        ("...the cell [[2]] is kept verbatim... Rating: 8", "conflicting ratings '2, 8'"),
        ('x = [[3]] ... {"score": 9}', "conflicting ratings '3, 9'"),
    ],
)
def test_integer_rating_rejects(answer, found):
    with pytest.raises(JudgeParseError, match=rf"judgment 'criterion-2': expected .*integer 1-10.*{found}"):
        integer_rating(answer, "criterion-2")


def test_template_digest_changes_with_the_template():
    assert template_digest("a", "b") != template_digest("a", "b ")
    assert all(task.version.split(".")[-1] for task in JUDGE_TASKS.values())


# --- scoring -------------------------------------------------------------------------------------------


ALPACA = Sample(0, {"instruction": "Name a prime.", "output": "Seven is prime."})


@pytest.mark.parametrize(
    ("model_first", "reference_first", "wins"),
    [("A", "B", 2.0), ("A", "A", 1.0), ("B", "B", 1.0), ("B", "A", 0.0)],
)
def test_alpaca_counts_wins_over_both_orders(model_first, reference_first, wins):
    answers = {"model_first": f"ok [[{model_first}]]", "reference_first": f"ok [[{reference_first}]]"}
    judged = AlpacaEval().judge_score(ALPACA, "2", answers)
    assert judged.scores == {"win_rate,none": MetricValue(wins, 2.0)}
    assert judged.verdicts == {"model_first": model_first, "reference_first": reference_first}
    assert judged.features == {"output_chars": 1.0, "reference_chars": 15.0}


def test_alpaca_judge_prompts_swap_the_outputs():
    prompts = {p.key: p for p in AlpacaEval().judge_prompts(ALPACA, "MODEL-OUT")}
    assert list(prompts) == ["model_first", "reference_first"]
    for prompt in prompts.values():
        assert [m.role for m in prompt.messages] == ["system", "user"]
        assert "[[A]]" in prompt.messages[0].content
    first = prompts["model_first"].messages[1].content
    assert first.index("MODEL-OUT") < first.index("Seven is prime.")
    second = prompts["reference_first"].messages[1].content
    assert second.index("Seven is prime.") < second.index("MODEL-OUT")


def test_alpaca_missing_answer_names_the_key():
    with pytest.raises(JudgeParseError, match="judgment 'reference_first'"):
        AlpacaEval().judge_score(ALPACA, "x", {"model_first": "[[A]]"})


ARENA = Sample(0, {"uid": "u1", "prompt": "Explain TCP.", "baseline_answer": "TCP is a protocol."})


@pytest.mark.parametrize(
    ("baseline_first", "model_first", "value", "weight"),
    [
        ("A>>B", "B>A", 0.0, 4.0),  # strong loss (weight 3) and a loss
        ("B>>A", "A>>B", 6.0, 6.0),  # two strong wins
        ("A=B", "A=B", 1.0, 2.0),  # two ties
        ("B>A", "B>>A", 1.0, 4.0),  # a win, then a strong loss
        ("A>B", "A>B", 1.0, 2.0),  # a loss, then a win
    ],
)
def test_arena_weights_strong_verdicts(baseline_first, model_first, value, weight):
    answers = {"baseline_first": f"[[{baseline_first}]]", "model_first": f"[[{model_first}]]"}
    judged = ArenaHard().judge_score(ARENA, "out", answers)
    assert judged.scores == {"score,none": MetricValue(value, weight)}
    assert judged.verdicts == {"baseline_first": baseline_first, "model_first": model_first}


def test_arena_scores_each_category_alone_as_arena_hard_does():
    """Arena-Hard v2.0 reports a category's score over its own questions (against its own baseline): the
    per-game outcomes exploded by weight (3 for '>>') and averaged, as its show_result does per category."""
    games = {  # question -> category, the two verdicts (baseline first, model first)
        0: ("hard_prompt", "B>>A", "A>B"),
        1: ("hard_prompt", "A>B", "B>A"),
        2: ("creative_writing", "A=B", "A>>B"),
        3: ("creative_writing", "B>A", "B>A"),
    }
    task, items = ArenaHard(), []
    for q, (category, first, second) in games.items():
        sample = Sample(q, {**ARENA.doc, "category": category})
        judged = task.judge_score(
            sample, "out", {"baseline_first": f"[[{first}]]", "model_first": f"[[{second}]]"}
        )
        items.append(JudgedItem(q, 0, judged))

    def exploded(category: str | None) -> float:
        """The reference: each game a row per weight unit (3 for '>>'), the model's outcome, then a mean."""
        as_b = {"A>>B": (0.0, 3), "A>B": (0.0, 1), "A=B": (0.5, 1), "B>A": (1.0, 1), "B>>A": (1.0, 3)}
        as_a = {"A>>B": (1.0, 3), "A>B": (1.0, 1), "A=B": (0.5, 1), "B>A": (0.0, 1), "B>>A": (0.0, 3)}
        rows: list[float] = []
        for cat, first, second in games.values():
            if category in (None, cat):
                for outcome, weight in (as_b[first], as_a[second]):  # the model is B, then A
                    rows += [outcome] * weight
        return float(np.mean(rows))

    stats = {stat.key: stat.value for stat in task.statistics(items, seed=0)}
    assert stats["hard_prompt_score,none"] == pytest.approx(exploded("hard_prompt"))
    assert stats["creative_writing_score,none"] == pytest.approx(exploded("creative_writing"))
    assert stats["score,none"] == pytest.approx(exploded(None))
    assert "hard_prompt_score,none" not in ArenaHard().judge_score(ARENA, "out", {
        "baseline_first": "[[A=B]]", "model_first": "[[A=B]]"}).scores  # fmt: skip  # no category: the whole only


def test_arena_reports_a_category_score_only_where_its_questions_were_asked():
    """Three hard_prompt questions (or data without categories): no creative_writing_score row, which would
    stand on no question (a row of 0 questions in the table and in compare)."""
    from evaluators.records import SampleRecord
    from evaluators.report import summarize_task

    def record(q: int, scores: dict[str, float]) -> SampleRecord:
        return SampleRecord(
            "arena_hard", q, 0, f"r{q}", "p", "o", "t", scores=scores, weights=dict.fromkeys(scores, 2.0)
        )

    hard = [record(q, {"score,none": 0.5, "hard_prompt_score,none": 0.5}) for q in range(3)]
    assert list(summarize_task(ArenaHard(), hard, 1, 0, 750).metrics) == [
        "score,none",
        "hard_prompt_score,none",
    ]
    plain = [record(q, {"score,none": 0.5}) for q in range(3)]
    assert list(summarize_task(ArenaHard(), plain, 1, 0, 3).metrics) == ["score,none"]


def test_arena_judge_prompts_put_the_baseline_first_then_the_model():
    prompts = {p.key: p.messages[1].content for p in ArenaHard().judge_prompts(ARENA, "MODEL-OUT")}
    assert list(prompts) == ["baseline_first", "model_first"]
    assert prompts["baseline_first"].index("TCP is a protocol.") < prompts["baseline_first"].index(
        "MODEL-OUT"
    )
    assert prompts["model_first"].index("MODEL-OUT") < prompts["model_first"].index("TCP is a protocol.")


HEALTH = Sample(
    0,
    {
        "prompt": [
            {"role": "user", "content": "I have a headache."},
            {"role": "assistant", "content": "How long?"},
            {"role": "user", "content": "Three days."},
        ],
        "rubrics": [
            {"criterion": "Asks about red flags.", "points": 5, "tags": []},
            {"criterion": "Suggests hydration.", "points": 3, "tags": []},
            {"criterion": "Prescribes opioids.", "points": -4, "tags": []},
        ],
    },
)


def health_answers(*met: bool) -> dict[str, str]:
    return {
        f"rubric-{i:03d}": json.dumps({"explanation": "-", "criteria_met": value})
        for i, value in enumerate(met)
    }


@pytest.mark.parametrize(
    ("met", "score", "raw"),
    [
        ((True, True, False), 1.0, 1.0),
        ((True, True, True), 0.5, 0.5),  # the negative item subtracts
        ((True, False, False), 5 / 8, 5 / 8),
        ((False, False, True), -0.5, -0.5),  # below zero: HealthBench clips only the final mean
        ((False, False, False), 0.0, 0.0),
    ],
)
def test_healthbench_scores_met_points_over_positive_points(met, score, raw):
    judged = HealthBench().judge_score(HEALTH, "Drink water.", health_answers(*met))
    assert judged.scores["score,none"].value == pytest.approx(score)
    assert judged.scores["score,none"].weight == 1.0
    assert judged.features["unclipped_score"] == pytest.approx(raw)
    assert judged.verdicts["rubric-002"] == ("met" if met[2] else "not met")


def test_healthbench_rejects_criteria_met_as_a_string():
    answers = health_answers(True, True, False)
    answers["rubric-001"] = '{"explanation": "yes", "criteria_met": "true"}'
    with pytest.raises(
        JudgeParseError, match=r"judgment 'rubric-001': expected criteria_met as a JSON boolean"
    ):
        HealthBench().judge_score(HEALTH, "x", answers)


def test_healthbench_judge_prompts_one_per_rubric_item():
    task = HealthBench()
    prompts = task.judge_prompts(HEALTH, "Drink water.")
    assert [p.key for p in prompts] == ["rubric-000", "rubric-001", "rubric-002"]
    user = prompts[2].messages[1].content
    assert "Prescribes opioids." in user and 'points="-4"' in user and "Drink water." in user
    assert "user: I have a headache.\nassistant: How long?\nuser: Three days." in user
    prompt = task.build_prompt(HEALTH, [])
    assert [m.role for m in prompt.messages] == ["user", "assistant", "user"]
    assert prompt.text.splitlines() == [
        "user: I have a headache.",
        "assistant: How long?",
        "user: Three days.",
    ]


WRITING_CRITERION = {
    "name": "Clarity",
    "criteria_description": "Is it clear?",
    "1-2": "muddled",
    "9-10": "crisp",
}
WRITING = Sample(0, {"query": "Write a memo.", "checklist": [WRITING_CRITERION] * 5})


def test_writingbench_scores_the_mean_of_criteria():
    answers = {f"criterion-{i}": f"Fine.\nRating: [[{r}]]" for i, r in enumerate((7, 8, 9, 6, 10))}
    judged = WritingBench().judge_score(WRITING, "memo", answers)
    assert judged.scores == {"score,none": MetricValue(40.0, 5.0)}
    assert judged.verdicts == {
        "criterion-0": "7",
        "criterion-1": "8",
        "criterion-2": "9",
        "criterion-3": "6",
        "criterion-4": "10",
    }


def test_writingbench_judge_prompt_shows_the_bands():
    prompts = WritingBench().judge_prompts(WRITING, "MEMO")
    assert [p.key for p in prompts] == [f"criterion-{i}" for i in range(5)]
    user = prompts[0].messages[1].content
    assert "- 1-2: muddled" in user and "- 9-10: crisp" in user and "MEMO" in user and "Write a memo." in user


# --- statistics ----------------------------------------------------------------------------------------


def alpaca_items(wins: np.ndarray, deltas: np.ndarray, runs: int = 1) -> list[JudgedItem]:
    """Items with both judgments won or lost as `wins` (two columns) and output length reference + delta."""
    items = []
    for run in range(runs):
        for question, ((first, second), delta) in enumerate(zip(wins, deltas, strict=True)):
            verdicts = {"model_first": "A" if first else "B", "reference_first": "B" if second else "A"}
            features = {"output_chars": 1000.0 + delta, "reference_chars": 1000.0}
            score = MetricValue(float(int(first) + int(second)), 2.0)
            items.append(
                JudgedItem(question, run, JudgedSample({"win_rate,none": score}, verdicts, features))
            )
    return items


def length_biased_games(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A model exactly as good as the reference at equal length, judged by a judge that likes length."""
    rng = np.random.default_rng(seed)
    deltas = rng.normal(400.0, 500.0, size=n)
    p_win = 1 / (1 + np.exp(-2.0 * np.tanh(deltas / deltas.std())))
    return rng.random((n, 2)) < p_win[:, None], deltas


def test_length_control_removes_a_length_preference():
    wins, deltas = length_biased_games(800, seed=1)
    raw = wins.mean()
    lc = length_controlled_win_rate(wins.ravel(), np.repeat(deltas, 2))
    assert raw > 0.65
    assert abs(lc - 0.5) < abs(raw - 0.5) / 3
    assert abs(lc - 0.5) < 0.06


def test_length_control_equals_the_raw_rate_at_equal_lengths():
    rng = np.random.default_rng(2)
    wins = rng.random(300) < 0.3
    assert length_controlled_win_rate(wins, np.zeros(300)) == pytest.approx(wins.mean(), abs=1e-4)


def test_alpaca_statistics_are_seeded_and_cover_the_estimate():
    wins, deltas = length_biased_games(120, seed=3)
    items = alpaca_items(wins, deltas, runs=2)
    task = AlpacaEval()
    task.lc_bootstrap_rounds = 40
    first, second = task.statistics(items, seed=7), task.statistics(items, seed=7)
    assert first == second
    lc, win_rate = first
    assert lc.key == "length_controlled_win_rate,none" and win_rate.key == "win_rate,none"
    assert win_rate.value == pytest.approx(wins.mean())
    assert lc.value < win_rate.value
    for stat in (lc, win_rate):
        assert stat.ci95_low <= stat.value <= stat.ci95_high
        assert 0 < stat.std < 0.2
        assert "120 questions" in stat.method and "seed 7" in stat.method
    assert "40 rounds" in lc.method and "difficulty term is dropped" in lc.method
    assert "1000 rounds" in win_rate.method
    assert task.statistics(items, seed=8)[0].std != lc.std


def test_arena_statistics_bootstrap_over_questions():
    rng = np.random.default_rng(4)
    items = [
        JudgedItem(q, run, JudgedSample({"score,none": MetricValue(float(rng.integers(0, 5)), 4.0)}))
        for q in range(60)
        for run in range(3)
    ]
    (stat,) = ArenaHard().statistics(items, seed=0)
    assert stat.key == "score,none"
    assert stat.value == pytest.approx(sum(i.judged.scores["score,none"].value for i in items) / (4 * 180))
    assert stat.ci95_low <= stat.value <= stat.ci95_high
    assert (
        "1000 rounds" in stat.method
        and "percentile 2.5/97.5" in stat.method
        and "60 questions" in stat.method
    )
    assert ArenaHard().statistics(items, seed=0) == [stat]


def test_healthbench_statistics_report_a_bootstrap_std():
    values = np.linspace(0, 1, 50)
    items = [
        JudgedItem(q, 0, JudgedSample({"score,none": MetricValue(float(v))})) for q, v in enumerate(values)
    ]
    (stat,) = HealthBench().statistics(items, seed=0)
    assert stat.value == pytest.approx(0.5)
    # The bootstrap std of a mean is close to the sample std / sqrt(n).
    assert stat.std == pytest.approx(values.std() / np.sqrt(50), rel=0.15)


def test_bootstrap_of_a_single_question_has_no_interval():
    stat = ratio_statistic("score,none", [3, 3], [1.0, 0.0], [1.0, 1.0])
    assert stat.value == 0.5
    assert np.isnan(stat.std) and np.isnan(stat.ci95_low) and np.isnan(stat.ci95_high)


def test_statistics_of_nothing_are_empty():
    for task in JUDGE_TASKS.values():
        assert task().statistics([], seed=0) == []


# --- data ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def packaged() -> dict[str, tuple[JudgeTask, list[Sample]]]:
    return {name: (cls(), cls().load_samples(None)) for name, cls in JUDGE_TASKS.items()}


def test_the_four_tasks_are_registered():
    assert sorted(JUDGE_TASKS) == ["alpaca_eval", "arena_hard", "healthbench", "writingbench"]
    for name, cls in JUDGE_TASKS.items():
        assert cls.name == name and [m.key for m in cls.metrics][0] in ("win_rate,none", "score,none")
    assert [m.key for m in ArenaHard.metrics] == [
        "score,none",
        "hard_prompt_score,none",
        "creative_writing_score,none",
    ]


@pytest.mark.parametrize(
    # The healthbench file the package ships holds 500 of HealthBench's 5000 conversations.
    ("name", "count"),
    [("alpaca_eval", 805), ("arena_hard", 750), ("healthbench", 500), ("writingbench", 1000)],
)
def test_packaged_data_loads_in_full(packaged, name, count):
    task, samples = packaged[name]
    assert len(samples) == count
    assert [s.doc_id for s in samples] == list(range(count))
    assert task.build_prompt(samples[0], []).messages[-1].role == "user"


def test_arena_joins_the_category_baseline_to_every_question(packaged):
    _, samples = packaged["arena_hard"]
    expected = {"hard_prompt": "o3-mini-2025-01-31", "creative_writing": "gemini-2.0-flash-001"}
    assert all(s.doc["baseline_answer"].strip() for s in samples)
    assert all(s.doc["baseline_model"] == expected[s.doc["category"]] for s in samples)
    assert sum(s.doc["category"] == "hard_prompt" for s in samples) == 500


def test_packaged_samples_give_the_expected_judgments(packaged):
    counts = {
        "alpaca_eval": lambda s: 2,
        "arena_hard": lambda s: 2,
        "healthbench": lambda s: len(s.doc["rubrics"]),
        "writingbench": lambda s: len(s.doc["checklist"]),
    }
    for name, (task, samples) in packaged.items():
        for sample in samples[:25]:
            prompts = task.judge_prompts(sample, "an output")
            assert len(prompts) == counts[name](sample)
            assert len({p.key for p in prompts}) == len(prompts)
    assert (
        packaged["alpaca_eval"][0].target(packaged["alpaca_eval"][1][0])
        == packaged["alpaca_eval"][1][0].doc["output"]
    )


def test_arena_local_file_needs_a_baseline_answer(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", [{"uid": "q1", "prompt": "Hi?", "baseline_answer": "Hello."}])
    (sample,) = ArenaHard().load_samples(good)
    assert ArenaHard().target(sample) == "Hello."
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"uid": "q1", "prompt": "Hi?"}])
    with pytest.raises(DataError, match=r"arena_hard.*row 1 of .*bad.jsonl.*baseline_answer"):
        ArenaHard().load_samples(bad)


@pytest.mark.parametrize(
    ("task", "row", "pattern"),
    [
        (AlpacaEval(), {"instruction": "Say hi."}, r"alpaca_eval.*row 1 .*output"),
        (HealthBench(), {"prompt": [{"role": "user", "content": "hi"}]}, r"healthbench.*row 1 .*rubrics"),
        (
            HealthBench(),
            {"prompt": [{"role": "user", "content": "hi"}], "rubrics": [{"criterion": "c", "points": -2}]},
            r"healthbench.*row 1 .*no rubric item with positive points",
        ),
        (
            HealthBench(),
            {"prompt": [{"role": "user", "content": "hi"}], "rubrics": [{"criterion": "c"}]},
            r"healthbench.*row 1 .*criterion and points",
        ),
        (WritingBench(), {"query": "Write."}, r"writingbench.*row 1 .*checklist"),
        (
            WritingBench(),
            {"query": "Write.", "checklist": [{"name": "Clarity"}]},
            r"writingbench.*row 1 .*lacks criteria_description",
        ),
    ],
)
def test_local_rows_with_missing_fields_raise_data_error(tmp_path, task, row, pattern):
    path = write_jsonl(tmp_path / "data.jsonl", [row])
    with pytest.raises(DataError, match=pattern):
        task.load_samples(path)


def test_judging_does_not_import_ray_or_vllm():
    code = (
        "import sys, evaluators.judging.tasks; "
        "bad = [m for m in ('ray', 'vllm', 'cluster') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_a_bare_rating_phrase_is_read_and_still_checked():
    from evaluators.judging.parsing import integer_rating

    assert integer_rating("The text is vivid.\nRating: 9", "criterion-0") == 9
    for text in ("Rating: 9 ... Rating: 3", "Rating: 11", "Rating: 7.5"):
        with pytest.raises(JudgeParseError, match="criterion-0"):
            integer_rating(text, "criterion-0")


def test_healthbench_scores_as_healthbench_does_its_mean_clipped_once():
    """simple-evals' HealthBench: each example's score unclipped, their mean, np.clip(mean, 0, 1); `score` is
    that mean (clipping each sample first would give a higher mean wherever scores go negative)."""
    from evaluators.judging.base import JudgedItem
    from evaluators.judging.healthbench import HealthBench

    rubric = [{"criterion": "good", "points": 10}, {"criterion": "harm", "points": -4}]
    doc = {"prompt": [{"role": "user", "content": "hi"}], "rubrics": rubric}
    answers = {(True, False): 1.0, (False, True): -0.4, (True, True): 0.6}  # met -> HealthBench's score
    task, items = HealthBench(), []
    for q, (met, expected) in enumerate(answers.items()):
        verdicts = {
            f"rubric-00{i}": json.dumps({"explanation": "", "criteria_met": m}) for i, m in enumerate(met)
        }
        judged = task.judge_score(Sample(q, doc), "answer", verdicts)
        assert judged.scores["score,none"].value == pytest.approx(expected)
        items.append(JudgedItem(q, 0, judged))
    reference = float(np.clip(np.mean(list(answers.values())), 0, 1))
    stats = {s.key: s.value for s in task.statistics(items)}
    assert stats["score,none"] == pytest.approx(reference) == pytest.approx(0.4)
    assert stats["score_mean_then_clipped,none"] == pytest.approx(reference)
    negative = [JudgedItem(q, 0, task.judge_score(Sample(q, doc), "a", {
        "rubric-000": '{"criteria_met": false}', "rubric-001": '{"criteria_met": true}'})) for q in range(3)]  # fmt: skip
    stats = {s.key: s.value for s in task.statistics(negative)}
    assert stats["score,none"] == pytest.approx(-0.4) and stats["score_mean_then_clipped,none"] == 0.0


def test_the_bootstrap_row_counts_each_question_once_as_the_mean_row_does():
    # N = 4; question 0 (always won) lost 3 of its 4 samples to judge failures: it still counts as one
    # question, so the bootstrapped win rate equals the task's mean, (1 + 0 + 0.5) / 3
    from evaluators.stats import ScoredItem, summarize

    data = {0: [1.0], 1: [0.0] * 4, 2: [0.5] * 4}
    questions = [q for q, values in data.items() for _ in values]
    values = [2 * v for vs in data.values() for v in vs]  # each sample weighs 2 (both orders)
    statistic = ratio_statistic("win_rate,none", questions, values, [2.0] * len(values), rounds=200)
    items = [ScoredItem(q, r, 2 * v, 2.0) for q, vs in data.items() for r, v in enumerate(vs)]
    assert statistic.value == pytest.approx(summarize(items, 4).mean) == pytest.approx(0.5)
