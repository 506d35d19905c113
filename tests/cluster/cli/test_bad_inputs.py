"""Bad inputs a new user gives rayeval, each ending in exit 2 and one message that names what is wrong and
says what would fix it: no traceback, no engine started, and an existing run folder left byte for byte.

Each row of CASES is one input: its id, the command line, files to create first, the exit code, and the
fragments the message must hold. In the command line `{tmp}` is the test's folder, `{gsm8k}` the shared
GSM8K test file. Rows with `run_folder=True` drop --dry-run and point at an existing run folder
(`--output-dir {tmp}/runs --run-id r1`), which must stay unchanged. docs/RELIABILITY.md lists the rows.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cluster.cli import main
from cluster.config import parse_gen_kwargs

GSM8K_ROW = '{"question": "What is 1+1?", "answer": "1+1=2\\n#### 2"}\n'
LATIN1_ROW = '{"question": "Combien coûte un café?", "answer": "#### 2"}\n'.encode("latin-1")
UTF16_ROW = GSM8K_ROW.encode("utf-16")
GZIP_ROW = b"\x1f\x8b\x08\x00" + b"\x00" * 12
TOKENIZER = {"tokenizer.json": "{}", "tokenizer_config.json": "{}"}
FEWSHOT_CONFIG = "tasks:\n  - {name: gsm8k, data_path: {tmp}/q.jsonl, fewshot_path: {tmp}/q.jsonl}\n"
RUN_CONFIG = "tasks: [alpaca_eval]\nrun_id: r1\nresolved_model_path: /models/m\n"


@dataclass(frozen=True)
class Case:
    id: str
    argv: str  # shlex-split after {tmp} and {gsm8k} are filled in
    code: int
    fragments: tuple[str, ...]  # in the one `rayeval: error:` line: what is wrong, and the fix
    files: Mapping[str, str | bytes] = field(default_factory=dict)  # relative to {tmp}
    env: Mapping[str, str | None] = field(default_factory=dict)  # None: unset
    run_folder: bool = False


CASES = [
    # --- config files ---------------------------------------------------------------------------------
    Case("config-missing", "validate {tmp}/none.yaml", 2, ("none.yaml does not exist", "Pass the path of a YAML")),
    Case("config-is-a-folder", "run --dry-run --config {tmp}", 2, ("is a folder, not a file", "Pass the YAML file itself")),
    Case("config-yaml-with-tabs", "validate {tmp}/c.yaml", 2, ("not valid YAML at line 2, column 1", "Indent with spaces"),
         files={"c.yaml": "tasks:\n\t- ifeval\n"}),
    Case("config-yaml-syntax", "validate {tmp}/c.yaml", 2, ("c.yaml is not valid YAML at line", "Fix the syntax there"),
         files={"c.yaml": "num_samples: [1, 2\nlimit: 3\n"}),
    Case("config-top-level-list", "validate {tmp}/c.yaml", 2, ("holds a YAML list at the top level", "`setting: value`"),
         files={"c.yaml": "- ifeval\n- gsm8k\n"}),
    Case("config-not-utf8", "validate {tmp}/c.yaml", 2, ("c.yaml is not UTF-8", "line 1", "Save it as UTF-8"),
         files={"c.yaml": "run_id: caf\xe9\n".encode("latin-1")}),
    Case("config-unknown-key", "validate {tmp}/c.yaml", 2, ("`cluster.replicaz` is not a setting", "did you mean `replicas`"),
         files={"c.yaml": "cluster:\n  replicaz: 2\n"}),
    Case("config-key-in-wrong-section", "validate {tmp}/c.yaml", 2, ("`temperature` is not a setting", "`sampling.temperature`"),
         files={"c.yaml": "temperature: 0.7\n"}),
    Case("config-key-as-its-flag", "validate {tmp}/c.yaml", 2, ("`judge.rps` is not a setting", "--judge-rps is `judge.requests_per_second` in a config"),
         files={"c.yaml": "judge:\n  rps: 5\n"}),
    Case("config-wrong-type", "validate {tmp}/c.yaml", 2, ("`model.max_model_len` is 'ten'", "valid integer", "Fix it in"),
         files={"c.yaml": "model:\n  max_model_len: ten\n"}),
    Case("config-negative-number", "validate {tmp}/c.yaml", 2, ("`num_samples` is -3", "greater than or equal to 1"),
         files={"c.yaml": "num_samples: -3\n"}),
    Case("config-good-flag-bad", "run --dry-run --config {tmp}/c.yaml --limit 0", 2,
         ("the command line has 1 invalid setting(s): `limit` (--limit) is 0", "`rayeval run --help`"),
         files={"c.yaml": "tasks: [ifeval]\nlimit: 5\n"}),
    Case("config-tasks-a-number", "validate {tmp}/c.yaml", 2, ("`tasks` is 5", "write a list of task names"),
         files={"c.yaml": "tasks: 5\n"}),
    Case("config-section-a-string", "run --dry-run --config {tmp}/c.yaml --max-model-len 512", 2,
         ("`model` is 'Qwen/Qwen2.5-1.5B'", "mapping of its settings: path"), files={"c.yaml": "model: Qwen/Qwen2.5-1.5B\n"}),
    Case("config-task-without-name", "validate {tmp}/c.yaml", 2, ("`tasks.0.name` is required",),
         files={"c.yaml": "tasks:\n  - {limit: 5}\n"}),
    Case("config-no-task-enabled", "validate {tmp}/c.yaml", 2, ("no task is enabled", "tasks: [ifeval]"),
         files={"c.yaml": "tasks:\n  - {name: ifeval, enabled: false}\n"}),
    Case("config-task-twice", "validate {tmp}/c.yaml", 2, ("ifeval listed twice", "keep one entry per task"),
         files={"c.yaml": "tasks: [ifeval, ifeval]\n"}),
    Case("config-data-path-missing", "validate {tmp}/c.yaml", 2, ("the data path /no/such.jsonl does not exist", "Give an existing"),
         files={"c.yaml": "tasks:\n  - {name: gsm8k, data_path: /no/such.jsonl}\n"}),
    Case("config-fewshot-pool-too-small", "run --config {tmp}/c.yaml --num-fewshot 5", 2,
         ("num_fewshot 5", "q.jsonl holds (2 besides the question itself)", "Lower --num-fewshot to 2"),
         files={"c.yaml": FEWSHOT_CONFIG, "q.jsonl": GSM8K_ROW * 3}, run_folder=True),
    # --- task names -----------------------------------------------------------------------------------
    Case("tasks-empty", "run --dry-run --tasks ''", 2, ("`tasks` (--tasks)", "no task is enabled", "--tasks ifeval")),
    Case("task-unknown", "run --tasks ifevl", 2, ("Unknown task 'ifevl' (--tasks, or `tasks:` in a config file)", "Closest matches", "rayeval tasks: ifeval"), run_folder=True),
    Case("task-names-with-spaces", "run --dry-run --tasks 'ifeval gsm8k'", 2, ("'ifeval gsm8k' holds spaces", "--tasks ifeval,gsm8k")),
    Case("task-twice", "run --dry-run --tasks ifeval,ifeval", 2, ("ifeval listed twice", "keep one")),
    Case("task-twice-via-lm-eval", "run --dry-run --tasks gsm8k,lm_eval:gsm8k", 2, ("gsm8k appear twice", "Keep one")),
    Case("lm-eval-task-unknown", "run --dry-run --tasks lm_eval:arc_eassy", 2, ("Unknown lm-eval task 'arc_eassy'", "arc_easy")),
    Case("lm-eval-prefix-alone", "run --dry-run --tasks lm_eval:", 2, ("names no task after 'lm_eval:'", "lm_eval:NAME")),
    Case("lm-eval-task-with-data-path", "run --dry-run --tasks arc_easy --data-path {tmp}/q.jsonl", 2,
         ("'arc_easy' is an lm-eval task", "--include-path"), files={"q.jsonl": GSM8K_ROW}),
    Case("include-path-missing", "run --dry-run --include-path {tmp}/nope", 2, ("--include-path", "nope does not exist", "Give the folder")),
    Case("fewshot-as-multiturn-without-chat-template", "run --dry-run --tasks arc_easy --fewshot-as-multiturn", 2,
         ("--fewshot-as-multiturn needs --apply-chat-template", "Add --apply-chat-template")),
    Case("num-fewshot-without-fewshot-source", "run --dry-run --tasks gsm8k --data-path {gsm8k} --num-fewshot 5", 2,
         ("no `fewshot_path` was given", "--num-fewshot 0")),
    # --- lm-eval gen kwargs (parsed as lm_eval.utils.simple_parse_args_string parses them) ---------------
    Case("gen-kwargs-no-keys", "run --gen-kwargs =,==", 2, ("(--gen-kwargs) is '=,=='", "'=' has no key", "KEY=VALUE pairs"), run_folder=True),
    Case("gen-kwargs-no-equals", "run --dry-run --gen-kwargs temperature", 2, ("'temperature' has no '='", "KEY=VALUE")),
    Case("gen-kwargs-empty-value", "run --dry-run --gen-kwargs temperature=", 2, ("'temperature' has no value", "KEY=VALUE")),
    Case("gen-kwargs-value-shape", "run --dry-run --gen-kwargs temperature=hot,top_p=0", 2,
         ("temperature=hot must be a number", "top_p=0 must be in (0, 1]")),
    Case("gen-kwargs-unknown-key", "run --dry-run --gen-kwargs temprature=0.5", 2, ("'temprature' is not a generation kwarg", "did you mean temperature")),
    Case("gen-kwargs-set-elsewhere", "run --dry-run --gen-kwargs seed=3", 2, ("'seed' is not a gen kwarg here", "use --seed")),
    # --- engine and sampling flags -----------------------------------------------------------------------
    Case("max-model-len-zero", "run --dry-run --max-model-len 0", 2, ("`model.max_model_len` (--max-model-len) is 0", "greater than or equal to 16", "Fix it")),
    Case("max-model-len-beyond-model", "run --max-model-len 100000", 2,
         ("--max-model-len 100000 is longer than SmolLM2-135M-Instruct", "max_position_embeddings = 8192", "8192 or less"), run_folder=True),
    Case("temperature-negative", "run --temperature -1", 2, ("(--temperature) is -1.0", "greater than or equal to 0"), run_folder=True),
    Case("top-p-above-one", "run --dry-run --top-p 2", 2, ("(--top-p) is 2.0", "less than or equal to 1")),
    Case("num-samples-zero", "run --dry-run --num-samples 0", 2, ("(--num-samples) is 0", "greater than or equal to 1")),
    Case("limit-zero", "run --dry-run --limit 0", 2, ("(--limit) is 0", "greater than or equal to 1")),
    Case("replicas-zero", "run --dry-run --replicas 0", 2, ("(--replicas) is 0", "greater than or equal to 1")),
    Case("dtype-unknown", "run --dry-run --dtype float8", 2, ("argument --dtype: invalid choice: 'float8'", "'bfloat16'")),
    Case("device-unknown", "run --dry-run --device tpu", 2, ("invalid choice: 'tpu'", "choose from 'auto', 'cpu', 'gpu'")),
    Case("limit-not-a-number", "run --dry-run --limit many", 2, ("argument --limit: invalid int value: 'many'", "rayeval run --help")),
    Case("flag-unknown", "run --dry-run --modle m", 2, ("unrecognized arguments: --modle", "did you mean --mode or --model?", "--help")),
    Case("flag-abbreviated", "run --dry-run --temp 0.5", 2, ("unrecognized arguments: --temp 0.5", "did you mean --temperature?")),
    Case("command-misspelt", "rn --tasks ifeval", 2, ("invalid choice: 'rn'", "did you mean 'run'?", "`rayeval --help`")),
    Case("subcommand-flag-misspelt", "jobs logs --follw raysubmit_1", 2, ("--follw", "did you mean --follow?", "`rayeval jobs logs --help`")),
    Case("inference-only-and-judge-only", "run --dry-run --inference-only --judge-only", 2,
         ("--judge-only: not allowed with argument --inference-only", "--help")),
    Case("pipeline-parallel-on-cpu", "run --dry-run --pipeline-parallel-size 2 --device cpu", 2,
         ("--pipeline-parallel-size > 1 does not run on CPU", "--tensor-parallel-size instead")),
    Case("run-id-with-slash", "run --dry-run --run-id ../other", 2, ("(--run-id) is '../other'", "not a folder name", "--output-dir")),
    # --- data files -----------------------------------------------------------------------------------
    Case("data-latin1", "run --tasks gsm8k --data-path {tmp}/q.jsonl", 2,
         ("q.jsonl is not UTF-8", "byte 0xfb on line 1", "Save it as UTF-8", "iconv"), files={"q.jsonl": LATIN1_ROW}, run_folder=True),
    Case("data-utf16", "run --dry-run --tasks gsm8k --data-path {tmp}/q.jsonl", 2, ("q.jsonl is not UTF-8", "UTF-16", "iconv -f UTF-16"),
         files={"q.jsonl": UTF16_ROW}),
    Case("data-gzip", "run --dry-run --tasks gsm8k --data-path {tmp}/q.jsonl.gz", 2, ("q.jsonl.gz is gzip-compressed", "gunzip"),
         files={"q.jsonl.gz": GZIP_ROW}),
    Case("data-empty-file", "run --dry-run --tasks gsm8k --data-path {tmp}/q.jsonl", 2, ("q.jsonl holds no rows", "a file with data"),
         files={"q.jsonl": ""}),
    Case("data-broken-line", "run --dry-run --tasks gsm8k --data-path {tmp}/q.jsonl", 2,
         ("line 2 of", "is not valid JSON", "Fix or delete that line"), files={"q.jsonl": GSM8K_ROW + '{"question": oops\n'}),
    Case("data-row-missing-field", "run --dry-run --tasks gsm8k --data-path {tmp}/q.jsonl", 2,
         ("row 2 of", "lacks the field(s) answer", "Every row needs question, answer"), files={"q.jsonl": GSM8K_ROW + '{"question": "2+2?"}\n'}),
    Case("data-csv", "run --dry-run --tasks gsm8k --data-path {tmp}/q.csv", 2, ("q.csv is a .csv file", "Convert it"),
         files={"q.csv": "question,answer\n1+1?,2\n"}),
    Case("data-json-object", "run --dry-run --tasks gsm8k --data-path {tmp}/q.json", 2,
         ("q.json holds a JSON dict, not an array", "Give a JSON array"), files={"q.json": '{"rows": []}'}),
    Case("data-corrupt-parquet", "run --dry-run --tasks gsm8k --data-path {tmp}/q.parquet", 2,
         ("could not read", "q.parquet as Parquet", "give the data as .jsonl"), files={"q.parquet": "not parquet"}),
    Case("data-folder-without-data", "run --dry-run --tasks gsm8k --data-path {tmp}/d", 2,
         ("the folder", "holds no .jsonl, .json or .parquet file", "put a 'test.jsonl'"), files={"d/readme.txt": "x"}),
    Case("data-path-missing", "run --dry-run --tasks gsm8k --data-path {tmp}/no.jsonl", 2, ("no.jsonl does not exist", "Give an existing")),
    Case("data-path-task-not-in-run", "run --dry-run --tasks gsm8k --data-path ifeval={gsm8k}", 2,
         ("names task 'ifeval', which is not among the run's tasks (gsm8k)", "Add it to --tasks")),
    Case("data-path-without-task-several-tasks", "run --dry-run --tasks gsm8k,ifeval --data-path {gsm8k}", 2,
         ("does not say which task it is for", "TASK=PATH")),
    Case("data-path-empty", "run --dry-run --tasks gsm8k --data-path gsm8k=", 2, ("--data-path gsm8k= gives no path", "TASK=PATH")),
    Case("data-path-twice", "run --dry-run --tasks gsm8k --data-path gsm8k={gsm8k} --data-path gsm8k={tmp}/q.jsonl", 2,
         ("--data-path is given twice for task 'gsm8k'", "Keep one per task"), files={"q.jsonl": GSM8K_ROW}),
    Case("data-path-hub-without-name", "run --dry-run --tasks gsm8k --data-path hf://", 2, ("hf:// names no dataset", "hf://org/name")),
    # --- model folders and hub ids --------------------------------------------------------------------
    Case("model-missing", "run --dry-run --model /no/such/model", 2, ("--model /no/such/model does not exist", "Give an existing local model folder")),
    Case("model-folder-without-config", "run --dry-run --model {tmp}/m", 2, ("is not a model folder: it has no config.json", "Point it at"),
         files={"m/model.safetensors": "x"}),
    Case("model-config-not-json", "run --dry-run --model {tmp}/m", 2, ("config.json is not valid JSON (line 1", "Restore it"),
         files={"m/config.json": "{nope", "m/model.safetensors": "x", **{f"m/{k}": v for k, v in TOKENIZER.items()}}),
    Case("model-without-weights", "run --dry-run --model {tmp}/m", 2, ("has a config.json but no weights", "Download the complete model folder"),
         files={"m/config.json": "{}", **{f"m/{k}": v for k, v in TOKENIZER.items()}}),
    Case("model-without-tokenizer", "run --dry-run --model {tmp}/m", 2, ("has a config.json but no tokenizer files", "Download the complete"),
         files={"m/config.json": "{}", "m/model.safetensors": "x"}),
    Case("model-hub-id-not-cached-offline", "run --model nobody-rayeval/no-such-model", 2,
         ("--model nobody-rayeval/no-such-model is not in the Hugging Face cache", "pass --model DIR"),
         env={"HF_HUB_OFFLINE": "1"}, run_folder=True),
    # --- judges ---------------------------------------------------------------------------------------
    Case("judged-task-without-judge", "run --dry-run --tasks alpaca_eval", 2, ("alpaca_eval are scored by a judge model", "pass --judge local:")),
    Case("judge-without-kind", "run --dry-run --tasks alpaca_eval --judge gpt-4o", 2, ("(--judge) is 'gpt-4o'", "names no judge kind", "openai:MODEL")),
    Case("judge-nothing-after-colon", "run --dry-run --tasks alpaca_eval --judge local:", 2, ("'local:' has no model after the colon", "write local:MODEL")),
    Case("judge-local-model-missing", "run --dry-run --tasks alpaca_eval --judge local:/no/such/judge", 2,
         ("--judge local:/no/such/judge does not exist", "Give an existing local model folder")),
    Case("judge-openai-key-unset", "run --judge-only --judge openai:gpt-4.1-mini --judge-api-key-env RAYEVAL_TEST_KEY", 2,
         ("environment variable RAYEVAL_TEST_KEY, which is not set", "export RAYEVAL_TEST_KEY="),
         env={"RAYEVAL_TEST_KEY": None}, run_folder=True),
    Case("judge-api-key-env-not-a-name", "run --dry-run --tasks alpaca_eval --judge openai:m --judge-api-key-env MY-KEY", 2,
         ("(--judge-api-key-env): not an environment variable name", "never the key itself")),
    Case("judge-base-url-not-a-url", "run --dry-run --tasks alpaca_eval --judge openai:m --judge-base-url localhost:8000", 2,
         ("(--judge-base-url) is 'localhost:8000'", "not an http(s) URL", "http://localhost:8000/v1")),
    Case("judge-rps-zero", "run --dry-run --tasks alpaca_eval --judge openai:m --judge-rps 0", 2, ("(--judge-rps) is 0.0", "greater than 0")),
    Case("judge-only-without-run-id", "run --dry-run --judge-only --judge local:x", 2, ("--judge-only needs --run-id", "--output-dir")),
    Case("judge-only-run-missing", "run --judge-only --run-id gone --output-dir {tmp}/runs --judge local:x", 2,
         ("runs/gone/config.yaml does not exist", "Give the --run-id")),
    Case("judge-only-without-judge", "run --judge-only", 2, ("--judge-only needs --judge local:PATH_OR_ID",), run_folder=True),
    # --- Ray addresses --------------------------------------------------------------------------------
    Case("address-without-port", "run --dry-run --address head-node", 2, ("(--address) is 'head-node'", "not a Ray address", "host:port")),
    Case("address-dashboard-url", "run --dry-run --address http://127.0.0.1:8265", 2, ("is a web address", "host:6379")),
    Case("address-port-out-of-range", "run --dry-run --address 10.0.0.5:99999", 2, ("is '10.0.0.5:99999'", "not a Ray address")),
    Case("address-unreachable", "run --address 127.0.0.1:1", 2,
         ("--address 127.0.0.1:1: nothing answers", "`ray start --head`", "leave --address out"), run_folder=True),
    Case("pools-address-unreachable", "pools --address 127.0.0.1:1", 2, ("--address 127.0.0.1:1: nothing answers",)),
    Case("up-address-local", "up --address local", 2, ("--address local starts a cluster that stops", "ray start --head")),
    # --- durations, output paths, watch -----------------------------------------------------------------
    Case("duration-cannot-be-off", "run --dry-run --sync-interval off", 2,
         ("--sync-interval cannot be 'off' here", "e.g. --sync-interval 30m")),
    Case("duration-without-unit", "run --dry-run --judge-timeout 1h30", 2, ("give each number of --judge-timeout its unit",)),
    Case("compare-output-is-a-folder", "compare {tmp}/a {tmp}/b --output {tmp}", 2, ("--output", "is a folder: give a file path",)),
    Case("plot-output-is-a-file", "plot {tmp}/runs --output {tmp}/taken", 2, ("is a file, not a folder",), files={"taken": "x"}),
    Case("watch-task-typo", "watch {tmp}/ckpts --tasks ifevl", 2, ("Unknown task 'ifevl'", "ifeval"), files={"ckpts/.keep": ""}),
    Case("watch-poll-interval-zero", "watch {tmp}/ckpts --poll-interval 0", 2, ("--poll-interval cannot be '0' here",)),
    Case("sweep-endpoint-model", "sweep {tmp}/ckpts --model openai:m --base-url http://127.0.0.1:9/v1 --dry-run", 2,
         ("--model openai:m is a model behind an endpoint", "Leave --model out"), files={"ckpts/step_1/.keep": ""}),
    # --- credentials in URIs: refused, and never echoed (SECRETY must not appear) ---------------------
    Case("base-url-with-credentials", "run --dry-run --model openai:m --tasks gsm8k --base-url https://u:SECRETY@h/v1", 2,
         ("(--base-url): the URL carries a credential (https://USER:...@...)", "--api-key-env")),
    Case("submit-output-uri-with-credentials", "submit --address 127.0.0.1:1 -- run --tasks gsm8k --output-dir s3://K:SECRETY@b/e", 2,
         ("--output-dir carries a credential in its URI", "job's command in its record", "--env NAME")),
    Case("submit-job-server-in-command", "submit --address 127.0.0.1:1 -- run --address http://127.0.0.1:8265", 2,
         ("--address http://127.0.0.1:8265 after `--` is the job server's", "give it to submit, before `--`")),
    Case("submit-query-credential", "submit --address 127.0.0.1:1 -- run --tasks gsm8k --output-dir=s3://b/e?secret_key=SECRETY", 2,
         ("--output-dir carries a credential in its URI (its query's secret_key)",)),
    Case("submit-bad-flag", "submit --address 127.0.0.1:1 -- run --tasks gsm8k --limit 0", 2,
         ("the command line has 1 invalid setting(s): `limit` (--limit) is 0",)),
    Case("output-dir-one-slash-credentials", "run --dry-run --output-dir s3:/K:SECRETY@bucket/e", 2,
         ("carries a credential (s3://USER:...@...)",)),
    Case("output-dir-file-uri-credentials", "run --dry-run --output-dir file://K:SECRETY@host/e", 2,
         ("carries a credential (file://USER:...@...)",)),
    Case("output-dir-no-bucket-query-credential", "run --dry-run --output-dir s3://?secret_key=SECRETY", 2,
         ("carries a credential (its query's secret_key)",)),
    Case("base-url-query-key", "run --dry-run --tasks alpaca_eval --judge openai:j --judge-base-url https://h/v1?key=SECRETY", 2,
         ("(--judge-base-url): the URL carries a credential (its query's key)",)),
    Case("log-to-with-credentials", "run --dry-run --log-to mlflow:https://alice:SECRETY@mlflow.example.com", 2,
         ("(--log-to): the tracker's URI carries a credential (https://USER:...@...)", "MLFLOW_TRACKING_PASSWORD")),
    Case("submit-log-to-with-credentials", "submit --address 127.0.0.1:1 -- run --log-to mlflow:https://a:SECRETY@h", 2,
         ("--log-to carries a credential in its URI",)),
    Case("submit-env-value-with-credentials", "submit --address 127.0.0.1:1 --env MLFLOW_TRACKING_URI=https://a:SECRETY@h -- run", 2,
         ("--env MLFLOW_TRACKING_URI=...: a job's runtime_env is shown by Ray's dashboard",)),
    Case("key-given-as-its-variable", "run --dry-run --tasks alpaca_eval --judge openai:j --judge-api-key-env hf_SECRETYabcdefghijklmnopqrstuvwxyz", 2,
         ("(--judge-api-key-env): this looks like a key itself", "keep the key in the environment")),
    Case("key-given-as-env-to-forward", "run --dry-run --env sk-SECRETY-abc", 2,
         ("`cluster.forward_env` (--env): this looks like a key itself", "e.g. HF_TOKEN")),
    Case("unknown-flag-with-a-credential", "run --dry-run --outptu-dir s3://K:SECRETY@b/e", 2,
         ("unrecognized arguments: --outptu-dir (a value carrying a credential: s3://USER:...@...)", "did you mean --output-dir?")),
    Case("lora-uri-with-credentials", "run --dry-run --lora s3://AK:SECRETY@b/adapter", 2,
         ("`model.lora` (--lora): the URI carries a credential (s3://USER:...@...)",)),
    Case("data-path-with-credentials", "run --dry-run --tasks gsm8k --data-path https://u:SECRETY@h/q.jsonl", 2,
         ("--data-path: the URI carries a credential (https://USER:...@...)",)),
    Case("cache-prune-storage", "cache prune --kind storage", 2, ("staged run folders are never pruned", "remove one by hand")),
    Case("cache-prune-bad-duration", "cache prune --unused-for 7days", 2, ("is not a duration", "--unused-for 30m")),
]  # fmt: skip


def _run_folder(root: Path) -> Path:
    """A finished run's files (contents need only be stable bytes): config, cache, samples, summary."""
    run = root / "runs" / "r1"
    files = {
        "config.yaml": RUN_CONFIG,
        "cache/completions.jsonl": '{"request_id": "a", "text": "hi"}\n',
        "samples/SmolLM2-135M-Instruct/alpaca_eval.jsonl": '{"doc_id": 0, "output": "hi"}\n',
        "summary.json": json.dumps({"tasks": {}}),
        "results.txt": "table\n",
    }
    for name, text in files.items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text(text)
    return run


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _cli(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exit_info:  # argparse's own usage errors
        return int(exit_info.code or 0)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_exits_2_naming_it_and_the_fix(case, tmp_path, shared_gsm8k, capsys, monkeypatch):
    for name, content in case.files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content.replace("{tmp}", str(tmp_path)))
    for name, value in case.env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    argv = shlex.split(case.argv.format(tmp=tmp_path, gsm8k=shared_gsm8k))
    run = _run_folder(tmp_path) if case.run_folder else None
    before = _snapshot(run) if run else {}
    if run:
        assert "--dry-run" not in argv, "a run-folder case runs for real: nothing may start or be written"
        argv += ["--output-dir", str(run.parent), "--run-id", run.name]

    code = _cli(argv)

    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("rayeval: error:")]
    assert code == case.code, err
    assert len(errors) == 1 and err.rstrip().endswith(errors[0]), err
    for fragment in case.fragments:
        assert fragment in errors[0], f"{fragment!r} not in {errors[0]!r}"
    assert "Traceback" not in out + err and out == ""
    assert "SECRETY" not in out + err, "a credential given in a URI was echoed"
    if run:
        assert _snapshot(run) == before, "the existing run folder changed"


def test_ids_are_unique_and_there_are_at_least_40():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 40


def test_a_data_file_that_is_not_utf8_is_one_message_from_the_real_command(tmp_path):
    """The installed entry point, not only main(): no UnicodeDecodeError traceback reaches the terminal."""
    data = tmp_path / "q.jsonl"
    data.write_bytes(LATIN1_ROW)
    done = subprocess.run(
        [sys.executable, "-m", "cluster.cli", "run", "--dry-run", "--tasks", "gsm8k", "--data-path", str(data)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "q.jsonl is not UTF-8" in done.stderr and "Traceback" not in done.stderr


def test_a_utf8_data_file_with_a_byte_order_mark_is_read(tmp_path, capsys):
    """What Windows editors write (UTF-8 with a BOM) is UTF-8: it loads instead of failing on line 1."""
    data = tmp_path / "q.jsonl"
    data.write_bytes(b"\xef\xbb\xbf" + (GSM8K_ROW * 2).encode())
    assert main(["run", "--dry-run", "--tasks", "gsm8k", "--data-path", str(data)]) == 0
    assert "samples=2" in capsys.readouterr().out


@pytest.mark.parametrize(
    "text",
    ["temperature=0.7,do_sample=true", "until='42',max_gen_toks=64,", "top_k=-1,min_p=0.05,ignore_eos=False"],
)
def test_gen_kwargs_accepted_parse_as_lm_eval_parses_them(text):
    from lm_eval.utils import simple_parse_args_string

    assert parse_gen_kwargs(text) == simple_parse_args_string(text)
