"""Ray client sessions started against a head whose `ray start` ran as it comes (`default`) and with
`cluster.head_env.CLIENT_SERVER_HEAD_ENV` (`fork-support-off`: gRPC's fork support off).

Ray's client server starts each session's own server as a subprocess of a process whose gRPC threads are
busy; with gRPC's fork support on, gRPC restarts its threads in the child before it runs the server, and the
child now and then dies there (`ray.init` fails: "Initialization failure from server", after about 40 s) or
hangs there for good (`ray.init` never returns). ray-project/ray#63202.

Two `ray start --head` clusters with token auth (tests.ray_head), one per side, up at once (the `default`
side's head without the variable even where this shell has it); sessions in blocks of --block against one
side, then the other, each `ray.init("ray://...")` as `cluster.connect` calls it but not retried, in a fresh
process, then one task. So each head serves sessions back to back, then idles while the other side's block
runs (the faults seen so far came at a block's first session; with the sides alternating session by session
none came in 50 each). A row per session:
`outcome` ok / failed (its first line) / hung (no answer in --hang-s; the process is killed), `seconds` from
the process's start. At the end a row per side counts its client server's "SpecificServer startup failed"
lines (a session whose server died as it was forked).

    python bench/ray_client_fork.py --turns 6 --block 10 --out bench/results/ray-client-fork-native-bf16.jsonl
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.rows import commit_of, write_row  # noqa: E402
from cluster.head_env import CLIENT_SERVER_HEAD_ENV  # noqa: E402
from tests.ray_head import HeadNode, start_head  # noqa: E402

SIDES = {"default": {}, "fork-support-off": CLIENT_SERVER_HEAD_ENV}
SESSION = """
import sys, ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="WARNING")
print(ray.get(ray.remote(lambda: "ok").remote()))
"""


def one_session(head: HeadNode, hang_s: float) -> tuple[str, float]:
    env = {**head.client_env(), "RAY_AUTH_MODE": "token"}
    began = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", SESSION, head.client_address], capture_output=True,
                              text=True, timeout=hang_s, env=env, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "hung", round(time.perf_counter() - began, 2)
    seconds = round(time.perf_counter() - began, 2)
    if done.returncode == 0 and done.stdout.strip().endswith("ok"):
        return "ok", seconds
    lines = [line for line in done.stderr.splitlines() if "Error" in line] or done.stderr.splitlines()[-1:]
    return f"failed: {lines[-1][:200] if lines else done.returncode}", seconds


def forks_lost(head: HeadNode) -> int:
    log = head.temp_dir / "session_latest" / "logs" / "ray_client_server.err"
    text = log.read_text(errors="replace") if log.exists() else ""
    return text.count("SpecificServer startup failed")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=6, help="blocks per side")
    parser.add_argument("--block", type=int, default=10, help="sessions in a row against one side")
    parser.add_argument("--hang-s", type=float, default=120.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    os.environ.pop("GRPC_ENABLE_FORK_SUPPORT", None)  # the default side's head: as `ray start` comes
    common = {"commit": commit_of(), "cpu_count": os.cpu_count()}
    heads = {side: start_head(num_cpus=4, client_server_env=env) for side, env in SIDES.items()}
    try:
        for turn in range(args.turns):
            for side, head in heads.items():
                for session in range(args.block):
                    outcome, seconds = one_session(head, args.hang_s)
                    write_row(args.out, {"side": side, "turn": turn, "session": session, "outcome": outcome,
                                         "seconds": seconds, **common})  # fmt: skip
        for side, head in heads.items():
            write_row(args.out, {"side": side, "sessions": args.turns * args.block,
                                 "servers_lost_at_fork": forks_lost(head), **common})  # fmt: skip
    finally:
        for head in heads.values():
            head.stop()


if __name__ == "__main__":
    main()
