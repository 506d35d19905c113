"""`rayeval serve`: the model behind an OpenAI-compatible API on Ray Serve, and the application's status
and shutdown."""

from __future__ import annotations

import argparse
import threading
from typing import TYPE_CHECKING

from cluster.cli.flags import ENGINE_MODEL_HELP, GROUPS, add_config_flags, flag_names, overrides, set_help
from cluster.config import COMMAND_LINE, CPU_MAX_NUM_SEQS, ServeConfig, build_config, load_config_file

if TYPE_CHECKING:
    from cluster.serve import ServedModel

EPILOG = """examples:
  rayeval serve                                    # the embedded SmolLM2 on this machine, until Ctrl-C
  rayeval serve --model Qwen/Qwen2.5-7B-Instruct --replicas 2 --address auto    # onto a running cluster
  rayeval serve --lora tuned=./out/adapter         # the base model and a LoRA adapter named `tuned`
  rayeval serve --host 0.0.0.0 --api-key-env SERVE_KEY --address auto   # open to the network, with a key
  rayeval serve --status --address auto            # the application's replicas and their state
  rayeval serve --shutdown --address auto
  rayeval run --model openai:SmolLM2-135M-Instruct --base-url http://127.0.0.1:8000/v1 --tasks ifeval
  rayeval run --tasks alpaca_eval --judge openai:NAME --judge-base-url http://HEAD:8000/v1 \\
      --judge-api-key-env SERVE_KEY      # a shared judge, served with --host 0.0.0.0 --api-key-env SERVE_KEY
Without --address (or RAY_ADDRESS) the command starts a local Ray cluster and serves until it is stopped;
with one, it deploys onto that cluster and returns: the application lives on until --shutdown.
The API listens on 127.0.0.1 unless --host says otherwise; with --api-key-env every request needs the key."""

SERVE_GROUPS = {
    "model": GROUPS["model"],
    "cluster": GROUPS["cluster"],
    "serve": ("serving", "Ray Serve's application and HTTP proxy."),
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible API on Ray Serve (for runs, judges and people)",
        description="Serve a model behind an OpenAI-compatible API (/v1/models, /v1/chat/completions, "
        "/v1/completions, streaming) on Ray Serve, with vLLM engine replicas built as `rayeval run` builds them.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(handler=cmd_serve)
    p.add_argument(
        "--config", metavar="FILE", help="YAML with model: and cluster: sections; flags override it"
    )
    groups = {key: p.add_argument_group(title, text) for key, (title, text) in SERVE_GROUPS.items()}
    add_config_flags(groups, ServeConfig, skip=ServeConfig.not_served)
    set_help(p, "--model", ENGINE_MODEL_HELP, "PATH_OR_HF_ID")
    set_help(p, "--max-model-len", "context length per request; longer ones get a 400 (default: on GPU the "
             "model's own, as `vllm serve`; on CPU 2048, which the fixed --kv-cache-gib holds)")  # fmt: skip
    set_help(p, "--max-num-seqs", f"sequences batched per engine step (default: {CPU_MAX_NUM_SEQS} on CPU; on GPU "
             "vLLM's own default for the card)")  # fmt: skip
    manage = groups["serve"].add_mutually_exclusive_group()
    manage.add_argument("--status", action="store_true", help="print the application's state and exit")
    manage.add_argument("--shutdown", action="store_true", help="delete the application and exit")
    groups["serve"].add_argument("--verbose", action="store_true", help="show Ray, Serve and vLLM logs")


def serve_config(args: argparse.Namespace) -> ServeConfig:
    given = overrides(args, ServeConfig)
    file_data = load_config_file(args.config) if args.config else {}
    return build_config(file_data, given, args.config or COMMAND_LINE, flag_names(ServeConfig), ServeConfig)


def cmd_serve(args: argparse.Namespace) -> int:
    config = serve_config(args)
    from cluster import serve

    if args.status:
        print(serve.status(config, args.verbose))
        return 0
    if args.shutdown:
        if serve.shutdown(config, args.verbose):
            print(f"the Serve application '{config.app_name}' is shut down")
            return 0
        print(f"no Serve application '{config.app_name}' to shut down")
        return 1
    if config.cluster.address:
        served = serve.deploy(config, args.verbose)
        _print_served(served, config.api_key_env, "it runs until `rayeval serve --shutdown`")
        return 0
    stop = threading.Event()
    try:
        serve.serve_here(
            config,
            lambda served: _print_served(served, config.api_key_env, "Ctrl-C stops it"),
            stop,
            args.verbose,
        )
    except KeyboardInterrupt:
        pass
    return 0


def _print_served(served: ServedModel, key_env: str | None, lifetime: str) -> None:
    print(
        f"serving {served.name} ({served.model_path}, {served.replicas} replica(s) on {served.device}) "
        f"at {served.url} in {served.start_s:.1f} s; {lifetime}",
        flush=True,
    )
    print(f"OPENAI_BASE_URL={served.url} OPENAI_MODEL={served.name}", flush=True)
    for adapter in served.adapters:
        staged = served.staged.get(adapter)
        where = f" (each replica reads it from {staged})" if staged else ""
        print(f"LoRA adapter {adapter}: OPENAI_MODEL={adapter}{where}", flush=True)
    if key_env:
        print(
            f"requests need Authorization: Bearer ${key_env}; rayeval runs pass it with --api-key-env {key_env} "
            f"(a judge: --judge-api-key-env {key_env})",
            flush=True,
        )
    for note in served.notes:
        print(f"note: {note}", flush=True)
