"""Paired measurements: two ways of generating take turns on engines that stay up (issue 5, round 7).

On the lent GPU hosts a vCPU's speed swings up to 2x from one second to the next (docs/BENCHMARKS.md,
rounds 6 and 7), and a small model's throughput follows its engine core's vCPU. Configurations measured one
after the other, minutes apart, then differ by host drift as much as by what they do. Here both sides of a
comparison start their engines once, then generate in alternating turns seconds apart (ABBA order, so a
steady drift favours neither), and every pair of adjacent turns gives one ratio: the median and the spread
of those ratios say what the comparison is and how much of it is noise.

Sides in separate processes (an `LLM` on one GPU against a rayeval replica on the other) talk through
files in one folder: the referee (`Referee`, in the parent) writes `<role>.<n>.go` with an instruction,
the side (`serve_turns`, in the child) runs it and writes `<role>.<n>.done` with its result. A turn may give
several roles an instruction at once: they start within the polling interval of each other.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

POLL_S = 0.005
READY_TIMEOUT_S = 480.0  # engine start (CUDA graph capture included) of the slowest side
TURN_TIMEOUT_S = 300.0
STOP_MARGIN_S = 30.0  # after the last pair: the sides stop, their engines shut down, the row is written


def serve_turns(folder: Path, role: str, run_turn: Callable[[dict], dict]) -> int:
    """The side's loop: announce readiness, then run each instruction the referee writes for `role` until
    it writes `<role>.stop`. Returns the number of turns served."""
    _write(folder / f"{role}.ready", "{}")
    served = 0
    while True:
        go, stop = folder / f"{role}.{served}.go", folder / f"{role}.stop"
        while not go.exists() and not stop.exists():
            time.sleep(POLL_S)
        if not go.exists():
            return served
        result = run_turn(json.loads(go.read_text()))
        _write(folder / f"{role}.{served}.done", json.dumps(result))
        served += 1


class Referee:
    """The parent's side: waits until every child is ready, then hands out turns and collects their results.
    A child that exits early fails the measurement at once, naming its role and exit status."""

    def __init__(self, folder: Path, children: dict[str, subprocess.Popen]) -> None:
        """`children` by role; the caller may add to it until the first turn (sides started one by one)."""
        self.folder = folder
        self.children = children
        self._turns: dict[str, int] = {}

    def wait_ready(self, roles: list[str] | None = None) -> None:
        """Wait until the named roles (every child by default) have their engines up."""
        for role in self.children if roles is None else roles:
            self._wait(self.folder / f"{role}.ready", READY_TIMEOUT_S, f"{role} to start its engine")

    def turn(self, instructions: dict[str, dict]) -> dict[str, dict]:
        """Give each named role its instruction at once; each one's result when all have finished."""
        for role, instruction in instructions.items():
            _write(self.folder / f"{role}.{self._turns.get(role, 0)}.go", json.dumps(instruction))
        results = {}
        for role in instructions:
            number = self._turns.get(role, 0)
            done = self.folder / f"{role}.{number}.done"
            self._wait(done, TURN_TIMEOUT_S, f"{role}'s turn {number}")
            results[role] = json.loads(done.read_text())
            self._turns[role] = number + 1
        return results

    def stop(self) -> None:
        for role in self.children:
            _write(self.folder / f"{role}.stop", "{}")

    def _wait(self, path: Path, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            for role, child in self.children.items():
                if child.poll() is not None:
                    raise RuntimeError(f"{role} exited (status {child.returncode}) while waiting for {what}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
            time.sleep(POLL_S)


def abba(pairs: int) -> list[tuple[str, str]]:
    """The order of each pair's two turns: A then B, B then A, and so on."""
    return [("a", "b") if k % 2 == 0 else ("b", "a") for k in range(pairs)]


def pairs_before(
    deadline: float | None, pairs: int, margin_s: float = STOP_MARGIN_S
) -> Iterator[tuple[int, tuple[str, str]]]:
    """`abba(pairs)`, ending early when the next pair would not end `margin_s` before `deadline` (a
    `time.time()`), judged by the slowest pair so far. The first pair always runs: a row needs one ratio."""
    slowest = 0.0
    for k, order in enumerate(abba(pairs)):
        if k and deadline is not None and time.time() + slowest + margin_s > deadline:
            return
        began = time.time()
        yield k, order
        slowest = max(slowest, time.time() - began)


def pair_ratios(a_s: list[float], b_s: list[float]) -> dict:
    """B's speed over A's for each pair (A's time over B's), with their median and range."""
    ratios = [round(a / b, 3) for a, b in zip(a_s, b_s, strict=True)]
    return {
        "ratios": ratios,
        "median": round(statistics.median(ratios), 3),
        "min": min(ratios),
        "max": max(ratios),
    }


def _write(path: Path, text: str) -> None:
    """Written whole before it appears (the other process polls for the name, then reads)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(text)
    partial.replace(path)
