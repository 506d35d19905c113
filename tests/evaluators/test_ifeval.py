"""IFEval scored with lm-eval's reference checkers on hand-made responses, offline."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from evaluators.sentence_splitting import load_ifeval_utils, offline_punkt
from evaluators.tasks.base import Sample
from evaluators.tasks.ifeval import IFEval, sample_seed, seeded_checkers

ROOT = Path(__file__).resolve().parents[2]


def doc(instructions: list[str], kwargs: list[dict]) -> Sample:
    return Sample(0, {"key": 1, "prompt": "p", "instruction_id_list": instructions, "kwargs": kwargs})


def score(sample: Sample, output: str) -> dict[str, tuple[float, float]]:
    return {k: (v.value, v.weight) for k, v in IFEval().score(sample, output).items()}


def test_all_instructions_followed():
    sample = doc(
        ["punctuation:no_comma", "length_constraints:number_sentences"],
        [{}, {"relation": "less than", "num_sentences": 3}],
    )
    result = score(sample, "Hello there. Goodbye now.")
    assert result["prompt_level_strict_acc,none"] == (1.0, 1.0)
    assert result["inst_level_strict_acc,none"] == (2.0, 2.0)


def test_instruction_level_counts_each_instruction():
    sample = doc(
        ["punctuation:no_comma", "length_constraints:number_sentences"],
        [{}, {"relation": "less than", "num_sentences": 2}],
    )
    result = score(sample, "One sentence. Two sentences. Three sentences.")
    assert result["prompt_level_strict_acc,none"] == (0.0, 1.0)
    assert result["inst_level_strict_acc,none"] == (1.0, 2.0)


def test_loose_forgives_a_chatty_last_line():
    sample = doc(["punctuation:no_comma"], [{}])
    result = score(sample, "No commas in the answer itself\nHope this helps, friend")
    assert result["prompt_level_strict_acc,none"] == (0.0, 1.0)
    assert result["prompt_level_loose_acc,none"] == (1.0, 1.0)


def test_word_tokenize_based_checker_works_offline():
    sample = doc(
        ["change_case:capital_word_frequency"], [{"capital_relation": "at least", "capital_frequency": 2}]
    )
    assert score(sample, "THIS is VERY loud.")["prompt_level_strict_acc,none"] == (1.0, 1.0)
    assert score(sample, "only ONE here.")["prompt_level_strict_acc,none"] == (0.0, 1.0)


@pytest.mark.parametrize(
    ("text", "sentences"),
    [
        ("Dr. Smith went home. He was tired.", 2),
        ("It cost $3.50 at the U.S. store. Then we left!", 2),
        ("One. Two? Three!", 3),
    ],
)
def test_offline_punkt_splits_like_nltk_english(text, sentences):
    assert len(offline_punkt().tokenize(text)) == sentences
    assert load_ifeval_utils() is load_ifeval_utils()


def test_packaged_data_has_all_541_prompts():
    samples = IFEval().load_samples(None)
    assert len(samples) == 541
    assert samples[0].doc["instruction_id_list"]


# Cases whose lm-eval result depends on a draw. The letter "!" is unusable, so `letter_frequency` checks a
# random letter; the response has each of a-m five times and no n-z, so the draw decides pass/fail.
# langdetect calls "I am" Italian or Catalan, and "hello" Finnish or Dutch, depending on its seed.
HALF_ALPHABET = " ".join(letter * 5 for letter in "abcdefghijklm")
RANDOM_PATH_CASES = [
    (
        ["keywords:letter_frequency"],
        [{"letter": "!", "let_frequency": 3, "let_relation": "at least"}],
        HALF_ALPHABET,
    ),
    (["language:response_language"], [{"language": "it"}], "I am"),
    (["language:response_language"], [{"language": "fi"}], "hello"),
]

SCORE_IN_FRESH_PROCESS = """
import json, sys
from evaluators.tasks.base import Sample
from evaluators.tasks.ifeval import IFEval
task = IFEval()
cases = json.load(sys.stdin)
scores = [{k: [v.value, v.weight] for k, v in task.score(Sample(0, doc), out).items()} for doc, out in cases]
print(json.dumps(scores))
"""


def random_path_cases(copies: int) -> list[tuple[dict, str]]:
    """Each random-path case under `copies` keys, so unseeded scoring agrees twice with odds ~2**-copies."""
    cases = []
    for key in range(copies):
        for instructions, kwargs, output in RANDOM_PATH_CASES:
            cases.append((doc(instructions, kwargs).doc | {"key": key}, output))
    return cases


def score_in_fresh_processes(cases: list[tuple[dict, str]], runs: int) -> list[list[dict]]:
    """Score `cases` in `runs` separate Python processes, run side by side; one score list per process."""
    stdin = json.dumps(cases)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCORE_IN_FRESH_PROCESS],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(runs)
    ]
    outputs = [proc.communicate(stdin, timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * runs
    return [json.loads(stdout) for stdout, _ in outputs]


def test_scores_are_identical_across_processes():
    cases = random_path_cases(copies=30)
    first, second = score_in_fresh_processes(cases, runs=2)
    assert first == second
    here = [
        {k: [v.value, v.weight] for k, v in IFEval().score(Sample(0, d), out).items()} for d, out in cases
    ]
    assert here == first
    # The draws differ between keys, so the cases do reach the random paths.
    strict = {case: {s["inst_level_strict_acc,none"][0] for s in first[case::3]} for case in range(3)}
    assert strict == {0: {0.0, 1.0}, 1: {0.0, 1.0}, 2: {0.0, 1.0}}


def test_seeded_draws_are_those_of_random_seed_and_leave_global_state_alone():
    utils = load_ifeval_utils()
    state = random.getstate()
    seeded, reference = [], []
    for d, out in random_path_cases(copies=20)[::3]:  # the letter_frequency cases, under 20 keys
        seeded.append(score(Sample(0, d), out))
        assert random.getstate() == state
        random.seed(sample_seed(d))  # lm-eval's own scorer, with the same seed on the global source
        reference.append(utils.process_results(d, [out]))
        random.setstate(state)
    for mine, theirs in zip(seeded, reference, strict=True):
        assert mine["inst_level_strict_acc,none"] == (float(sum(theirs["inst_level_strict_acc"])), 1.0)
        assert mine["inst_level_loose_acc,none"] == (float(sum(theirs["inst_level_loose_acc"])), 1.0)
    assert {mine["inst_level_strict_acc,none"][0] for mine in seeded} == {0.0, 1.0}


def test_seed_comes_from_the_key_only():
    assert sample_seed({"key": 1001}) == sample_seed({"key": 1001, "prompt": "other"})
    assert sample_seed({"key": 1001}) != sample_seed({"key": 1002})


def test_other_threads_drawing_from_random_do_not_change_scores():
    cases = random_path_cases(copies=10)
    expected = [score(Sample(0, d), out) for d, out in cases]
    stop = threading.Event()

    def draw_forever() -> None:
        while not stop.is_set():
            random.random()

    thread = threading.Thread(target=draw_forever)
    thread.start()
    try:
        assert [score(Sample(0, d), out) for d, out in cases] == expected
    finally:
        stop.set()
        thread.join()


def test_seeded_block_restores_checker_random_and_langdetect_seed():
    import langdetect
    from lm_eval.tasks.ifeval import instructions

    load_ifeval_utils()
    with seeded_checkers(7):
        assert langdetect.DetectorFactory.seed == 7
        assert instructions.random is not random
    assert langdetect.DetectorFactory.seed is None
    assert instructions.random is random


def words_printed_by_a_fresh_process(script: str) -> list[str]:
    """What `python -c script` prints, split into words, from an interpreter that imported nothing before."""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_checkers_lm_eval_imported_itself_count_sentences_offline():
    # lm-eval's own ifeval task (or one built on its checkers) imports them from its YAML, without rayeval's
    # loader; a run of such a task makes them offline before evaluating (cluster/lm_eval/runs.py). A fresh
    # process, so that lm-eval's import comes first.
    script = (
        "import contextlib, io\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "    from lm_eval.tasks.ifeval import utils  # lm-eval's download attempt fails offline\n"
        "from evaluators.sentence_splitting import offline_loaded_checkers\n"
        "offline_loaded_checkers()\n"
        "doc = {'key': 1, 'prompt': 'p', 'instruction_id_list': ['length_constraints:number_sentences'],\n"
        "       'kwargs': [{'relation': 'less than', 'num_sentences': 3}]}\n"
        "print(utils.process_results(doc, ['One. Two.'])['prompt_level_strict_acc'],\n"
        "      utils.process_results(doc, ['One. Two. Three. Four.'])['prompt_level_strict_acc'])\n"
    )
    assert words_printed_by_a_fresh_process(script) == ["True", "False"]


def test_the_checkers_load_without_nltks_optional_imports_which_stay_importable():
    # A fresh process, as a run's: nltk comes in without scikit-learn and scipy.stats, which the checkers
    # never use; another thread importing them meanwhile gets them, and so does everything after.
    script = (
        "import sys, threading\n"
        "from evaluators.sentence_splitting import NLTK_OPTIONAL_IMPORTS, load_ifeval_utils\n"
        "from evaluators.sentence_splitting import refusing_imports\n"
        "load_ifeval_utils()\n"
        "print(*[name in sys.modules for name in NLTK_OPTIONAL_IMPORTS])\n"
        "seen = {}\n"
        "def other():\n"
        "    import scipy.stats, sklearn.metrics\n"
        "    seen['other'] = round(float(scipy.stats.t.ppf(0.975, 3)), 4)\n"
        "with refusing_imports(NLTK_OPTIONAL_IMPORTS):\n"
        "    try:\n"
        "        import scipy.stats\n"
        "    except ImportError:\n"
        "        seen['own'] = 'refused'\n"
        "    thread = threading.Thread(target=other)\n"
        "    thread.start()\n"
        "    thread.join()\n"
        "import sklearn.metrics\n"
        "print(seen['own'], seen['other'], sklearn.metrics.accuracy_score([1, 0], [1, 1]))\n"
    )
    assert words_printed_by_a_fresh_process(script) == ["False", "False", "refused", "3.1824", "0.5"]


def test_the_checkers_load_without_lm_evals_task_index_which_loads_later_beside_them():
    # A fresh process: the checkers come without lm_eval.tasks' package (its task manager imports datasets and
    # pandas); importing that package afterwards gives lm-eval's own, and its ifeval modules are the same
    script = (
        "import sys\n"
        "from evaluators.sentence_splitting import load_ifeval_utils\n"
        "utils = load_ifeval_utils()\n"
        "print(*[name in sys.modules for name in ('lm_eval.tasks', 'datasets', 'pandas')])\n"
        "from lm_eval.tasks import TaskManager\n"
        "from lm_eval.tasks.ifeval import instructions_registry, utils as again\n"
        "print(again is utils, utils.instructions_registry is instructions_registry, 'datasets' in sys.modules)\n"
        "doc = {'key': 1, 'prompt': 'p', 'instruction_id_list': ['length_constraints:number_sentences'],\n"
        "       'kwargs': [{'relation': 'less than', 'num_sentences': 3}]}\n"
        "print(again.process_results(doc, ['One. Two. Three. Four.'])['prompt_level_strict_acc'])\n"
    )
    printed = words_printed_by_a_fresh_process(script)
    assert printed == ["False", "False", "False", "True", "True", "True", "False"]


def test_asking_whether_the_checkers_failed_to_import_does_not_start_their_import():
    # A run asks before it starts engines; on a cluster it starts the import only once its first requests are
    # out, so asking must not start it (the import would then hold the interpreter during the handout).
    script = (
        "import sys\n"
        "from evaluators.sentence_splitting import ifeval_utils_preloaded\n"
        "from evaluators.tasks.ifeval import IFEval\n"
        "task = IFEval()\n"
        "task.raise_if_scorer_failed()\n"
        "print(ifeval_utils_preloaded() is None, 'nltk' in sys.modules)\n"
        "task.preload_scorer()\n"
        "task.wait_for_scorer()\n"
        "task.raise_if_scorer_failed()\n"
        "print(ifeval_utils_preloaded().done(), 'nltk' in sys.modules)\n"
    )
    assert words_printed_by_a_fresh_process(script) == ["True", "False", "True", "True"]
