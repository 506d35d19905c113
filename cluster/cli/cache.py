"""`rayeval cache list` and `rayeval cache prune`: what rayeval keeps on disk (merged checkpoints, staged
adapters, the default model, rendered prompts, lm-eval's task index, staged run folders), on this machine or
on every node of a cluster, and removing what has not been used for a while."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from cluster.config.values import parse_duration
from cluster.models.cache import DEFAULT_PRUNED, CacheKind, check_prunable

if TYPE_CHECKING:
    from cluster.node_caches import NodeAnswer

EPILOG = """examples:
  rayeval cache list                               # this machine's cache, largest first
  rayeval cache list --address auto                # every node of this machine's `ray start` cluster
  rayeval cache prune --dry-run                    # what a prune would remove here
  rayeval cache prune --address auto --unused-for 2d --kind merged
Kinds: merged (checkpoints merged from LoRA adapters, a full model each), adapters (copies staged on an
engine's node), models (the embedded default model), rendered (chat-rendered prompts), lm_eval (lm-eval's
task index), storage (run folders of object storage staged here: listed, never pruned, since a killed run's
files may not all be on the store yet). A pruned entry is rebuilt by the next run that needs it. The cache
is $RAYEVAL_CACHE, else ~/.cache/rayeval, on each node."""

PRUNE_DEFAULT = "7d"


def add_parser(sub: argparse._SubParsersAction) -> None:
    cache = sub.add_parser(
        "cache",
        help="list or prune what rayeval keeps on disk, here or on every node of a cluster",
        description="What rayeval keeps in its cache on each machine, and removing what has not been used for a "
        "while.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = cache.add_subparsers(dest="cache_action", required=True, metavar="{list,prune}")
    listed = actions.add_parser("list", help="the cache's entries: node, kind, size, last used, path")
    listed.set_defaults(handler=cmd_list)
    _common_flags(listed, default_kinds="every kind")
    pruned = actions.add_parser("prune", help="remove the entries not used for a while")
    pruned.set_defaults(handler=cmd_prune)
    _common_flags(pruned, default_kinds=", ".join(kind.value for kind in DEFAULT_PRUNED))
    pruned.add_argument(
        "--unused-for",
        default=PRUNE_DEFAULT,
        metavar="DURATION",
        help=f"remove entries not used for this long (90, 30m, 12h, 7d; 0: every entry; default {PRUNE_DEFAULT})",
    )
    pruned.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")


def _common_flags(parser: argparse.ArgumentParser, default_kinds: str) -> None:
    parser.add_argument(
        "--kind",
        action="append",
        choices=[kind.value for kind in CacheKind],
        help=f"only entries of this kind (repeatable; default {default_kinds})",
    )
    parser.add_argument(
        "--address",
        metavar="ADDR",
        help="every node of the cluster at this address (host:port, ray://host:10001, auto); default: this "
        "machine only",
    )


def cmd_list(args: argparse.Namespace) -> int:
    from cluster.node_caches import cache_entries

    kinds = tuple(CacheKind(kind) for kind in args.kind) if args.kind else tuple(CacheKind)
    answers = cache_entries(args.address, kinds)
    _print_entries(answers, "")
    return _exit_code(answers)


def cmd_prune(args: argparse.Namespace) -> int:
    from cluster.node_caches import prune_caches
    from evaluators.errors import EvalInputError

    kinds = tuple(CacheKind(kind) for kind in args.kind) if args.kind else DEFAULT_PRUNED
    try:
        check_prunable(kinds)  # here, before any node is asked
        every = args.unused_for.strip() == "0"  # 0 means every entry here, not "off"
        unused_for_s = 0.0 if every else parse_duration(args.unused_for, "--unused-for", off=False)
    except ValueError as exc:
        raise EvalInputError(str(exc)) from None
    answers = prune_caches(args.address, kinds, unused_for_s, args.dry_run)
    _print_entries(answers, "would remove " if args.dry_run else "removed ")
    return _exit_code(answers)


def _print_entries(answers: list[NodeAnswer], verb: str) -> None:
    print("\t".join(("NODE", "KIND", "SIZE", "LAST USED", "PATH")))
    total = count = 0
    for answer in answers:
        if answer.problem:
            print(f"{answer.node}\t-\t-\t-\t(no answer: {answer.problem})")
        for entry in answer.entries:
            used = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.last_used))
            print("\t".join((entry.node, entry.kind.value, _size(entry.size_bytes), used, entry.path)))
            total, count = total + entry.size_bytes, count + 1
    nodes = len(answers)
    print(
        f"{verb}{count} entr{'y' if count == 1 else 'ies'}, {_size(total)}, on {nodes} node{'s' * (nodes != 1)}"
    )


def _exit_code(answers: list[NodeAnswer]) -> int:
    """1 where a node gave no answer (its entries are unknown or were not pruned), else 0."""
    return 1 if any(answer.problem for answer in answers) else 0


def _size(size_bytes: float) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    power = 0
    while size_bytes >= 1024 and power < len(units) - 1:
        size_bytes, power = size_bytes / 1024, power + 1
    return f"{size_bytes:.0f} B" if power == 0 else f"{size_bytes:.1f} {units[power]}"
