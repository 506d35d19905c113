"""lm-eval's own vLLM backend and evaluator, as `lm_eval --model vllm ... --log_samples --output_path OUT` runs
them, for several option sets on one engine: one vLLM start and one lm-eval import for all of a test module's
reference runs.

Each run is the CLI's body: `simple_evaluate` on the same lm-eval `vllm` model object, then lm-eval's
`EvaluationTracker` writes results_*.json and samples_<task>_*.jsonl under the run's folder, which the tests read
as they read the CLI's files.

Usage: `python -m tests.lm_eval_reference SPEC.json`. SPEC holds `model_args` (lm-eval's `--model_args`
string), `include_path`, and `runs`: each with `out`, `tasks`, `limit` and `options` (simple_evaluate's keyword
arguments: num_fewshot, apply_chat_template, fewshot_as_multiturn, system_instruction, gen_kwargs).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(spec_path: str) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # as lm-eval's CLI sets it
    import lm_eval
    from lm_eval.api.registry import get_model
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    spec = json.loads(Path(spec_path).read_text())
    model = get_model("vllm").create_from_arg_string(
        spec["model_args"], {"batch_size": "auto", "max_batch_size": None, "device": None}
    )
    # the tests' tasks are all in include_path (their `include:` paths are absolute): lm-eval's own ~14,000
    # task files, which every TaskManager parses by default, are not needed to find them
    tasks = TaskManager(include_path=spec["include_path"], include_defaults=False)
    for run in spec["runs"]:
        tracker = EvaluationTracker(output_path=run["out"])
        results = lm_eval.simple_evaluate(
            model=model, tasks=run["tasks"], limit=run["limit"], batch_size="auto", log_samples=True,
            evaluation_tracker=tracker, task_manager=tasks, **run["options"],
        )  # fmt: skip
        samples = results.pop("samples")
        tracker.save_results_aggregated(results=results, samples=samples)
        for task_name in results["configs"]:
            tracker.save_results_samples(task_name=task_name, samples=samples[task_name])


if __name__ == "__main__":
    main(sys.argv[1])
