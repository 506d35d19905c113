"""`rayeval up`, `rayeval pools`, `rayeval down`: warm pools of engine replicas on a running cluster, which
the runs that follow use instead of starting engines."""

from __future__ import annotations

import argparse
import sys
import time

from cluster.cli.flags import ENGINE_MODEL_HELP, GROUPS, add_config_flags, flag_names, overrides, set_help
from cluster.cli.front_paths import WARM_CLI_ENV, enabled
from cluster.config import COMMAND_LINE, PoolConfig, build_config, load_config_file

UP_EPILOG = """examples:
  rayeval up                                       # the embedded SmolLM2, one replica, on this machine's cluster
  rayeval up --model Qwen/Qwen2.5-7B-Instruct --replicas 4 --address auto --idle-timeout 2h
  rayeval run --address auto --model Qwen/Qwen2.5-7B-Instruct --tasks ifeval   # served by the pool
  rayeval up --lora-slots 4 --address auto && rayeval run --address auto --lora ./adapter   # adapters, live
  rayeval pools --address auto        |   rayeval down NAME   |   rayeval down --all
A run uses a pool whose engine settings equal its own (model, dtype, context length, batch limits,
parallelism, eager or compiled, LoRA); `rayeval run --dry-run --address ...` says which pool would serve it
and why another would not. The pool stops after --idle-timeout with no run using it."""

# Settings of `rayeval run` that mean nothing to a pool (adapters ride on requests; prompts are the runs').
NOT_POOL_SETTINGS = frozenset(
    {"model.lora", "model.chat_template", "cluster.replica_restarts", "cluster.coordinator_node",
     "cluster.coordinator_idle_timeout_s", "cluster.forward_env", "cluster.warm_pools", "cluster.keep_warm_s",
     "cluster.max_in_flight"}
)  # fmt: skip
POOL_GROUPS = {
    "model": GROUPS["model"],
    "cluster": GROUPS["cluster"],
    "pool": ("pool", "The warm pool's name and lifetime."),
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    up = sub.add_parser(
        "up",
        help="start a warm pool of engine replicas on a running cluster, for the runs that follow",
        description="Start engine replicas on a running Ray cluster and leave them up as a warm pool: a later "
        "`rayeval run --address ...` with the same engine settings generates on them at once.",
        epilog=UP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    up.set_defaults(handler=cmd_up)
    up.add_argument(
        "--config", metavar="FILE", help="YAML with model: and cluster: sections; flags override it"
    )
    groups = {key: up.add_argument_group(title, text) for key, (title, text) in POOL_GROUPS.items()}
    add_config_flags(groups, PoolConfig, skip=NOT_POOL_SETTINGS)
    set_help(
        up, "--address", ADDRESS_HELP
    )  # a pool lives on a running cluster: no local one is started for it
    set_help(up, "--model", ENGINE_MODEL_HELP, "PATH_OR_HF_ID")
    groups["pool"].add_argument("--verbose", action="store_true", help="show Ray's and vLLM's logs")
    groups["pool"].add_argument(
        "--no-warm-cli",
        action="store_true",
        help="start no warm CLI server on this machine (by default one starts beside the pool, with its idle "
        "timeout: later `rayeval run` commands here fork from it, their imports done, about a second sooner; "
        f"{WARM_CLI_ENV}=0 runs a command without it)",
    )

    listed = sub.add_parser("pools", help="list the cluster's warm pools",
                            description="The warm pools of a running cluster: model, settings key, replicas and "
                            "their nodes, idle since, requests served, and which runs use them now.")  # fmt: skip
    listed.set_defaults(handler=cmd_pools)
    _address_flag(listed)

    down = sub.add_parser(
        "down", help="stop warm pools", description="Stop warm pools by name, or every one."
    )
    down.set_defaults(handler=cmd_down)
    down.add_argument(
        "names", nargs="*", metavar="POOL", help="the pools to stop (`rayeval pools` names them)"
    )
    down.add_argument("--all", action="store_true", help="stop every warm pool of the cluster")
    _address_flag(down)


ADDRESS_HELP = (
    "the running cluster (host:port, ray://host:10001; default auto: this machine's `ray start` one)"
)


def _address_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", metavar="ADDR", help=ADDRESS_HELP)


def pool_config(args: argparse.Namespace) -> PoolConfig:
    given = overrides(args, PoolConfig)
    file_data = load_config_file(args.config) if args.config else {}
    return build_config(file_data, given, args.config or COMMAND_LINE, flag_names(PoolConfig), PoolConfig)


def cmd_up(args: argparse.Namespace) -> int:
    from cluster.sources import up

    config = pool_config(args)
    row = up(config, args.verbose)
    state = "started" if row.started else "already running"
    print(f"warm pool {row.name} {state}: {row.replicas} replica(s) of {row.model} on {', '.join(row.nodes)}")
    if not row.started and row.replicas < config.cluster.replicas:
        print(
            f"(--replicas {config.cluster.replicas} asked: runs that need more start the rest beside it; "
            f"`rayeval down {row.name}` first for a pool of {config.cluster.replicas})"
        )
    if config.name and config.name != row.name:
        print(
            f"(not started as {config.name}: pool {row.name} has these engine settings and serves the same runs)"
        )
    print(
        f"key {row.key}; stops after {row.idle_timeout_s:g} s unused; `rayeval down {row.name}` stops it now"
    )
    if not args.no_warm_cli and enabled():
        _start_warm_cli(row.idle_timeout_s)
    return 0


def _start_warm_cli(idle_timeout_s: float) -> None:
    from cluster.cli.front_control import START_TIMEOUT_S, start_server
    from cluster.cli.front_paths import log_path

    pid = start_server(idle_timeout_s)
    if pid is None:
        print(
            f"no warm CLI server answered within {START_TIMEOUT_S:g} s (its log: {log_path()}); "
            "runs import for themselves"
        )
    else:
        print(
            f"warm CLI server on this machine: pid {pid}; `rayeval run` here forks from it ({WARM_CLI_ENV}=0: not)"
        )


def cmd_pools(args: argparse.Namespace) -> int:
    from cluster.sources import list_pools

    listing = list_pools(args.address)
    rows = listing.rows
    if listing.strays:
        print(
            f"{len(listing.strays)} engine actor(s) named as a pool's belong to no pool listed: a pool still starting, "
            f"or one whose start was killed outright ({', '.join(listing.strays)}); `rayeval down --all` stops them",
            file=sys.stderr,
        )
    if not rows:
        print("no warm pools on this cluster (`rayeval up` starts one)")
        return 0
    print("\t".join(("POOL", "MODEL", "KEY", "REPLICAS", "NODES", "IDLE SINCE", "SERVED", "IN USE BY",
                     "STOPS AFTER IDLE", "SETTINGS")))  # fmt: skip
    for row in rows:
        idle = (
            "-"
            if row.idle_since is None
            else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.idle_since))
        )
        print("\t".join((row.name, row.model, row.key, str(row.replicas), ",".join(row.nodes), idle,
                         str(row.requests_served), ",".join(row.in_use_by) or "-", f"{row.idle_timeout_s:g} s",
                         row.settings)))  # fmt: skip
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from evaluators.errors import EvalInputError

    if not args.names and not args.all:
        raise EvalInputError("rayeval down needs the pools to stop (`rayeval pools` names them) or --all.")
    if args.names and args.all:
        raise EvalInputError(
            f"rayeval down: give the pools to stop ({' '.join(args.names)}) or --all, not both: --all stops every "
            "pool of the cluster."
        )
    from cluster.sources import down  # Ray's import: after the checks, which answer at once

    stopped = down(args.address, args.names, args.all)
    print(f"stopped {len(stopped.pools)} warm pool(s): {', '.join(stopped.pools) or 'none'}")
    if stopped.stray_actors or stopped.stray_groups:
        print(
            f"stopped {len(stopped.stray_actors)} engine actor(s) and {stopped.stray_groups} placement group(s) "
            f"that belonged to no pool: {', '.join(stopped.stray_actors) or '-'}"
        )
    if args.all:
        from cluster.cli.front_control import stop_server

        if stop_server() is not None:
            print("stopped this machine's warm CLI server")
    return 0
