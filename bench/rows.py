"""What every bench script's rows carry: `write_row` prints a row and appends it to a JSON-lines file with the
machine and the time; `commit_of` names the commit a checkout runs (what a row measured)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def commit_of(checkout: Path = REPO) -> str:
    """The short hash of `checkout`'s HEAD; a copy without git metadata (a `git archive`) says so."""
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=False)  # fmt: skip
    return done.stdout.strip() or "unknown (no git metadata)"


def machine_facts() -> dict:
    """What every row says of where and when it was measured: the host, its cores, the time (UTC)."""
    return {"host": platform.node(), "cores": len(os.sched_getaffinity(0)),
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M")}  # fmt: skip


def write_row(out: Path, row: dict) -> None:
    """Print the row and append it to `out` (JSON lines), with the machine and the time."""
    row = row | machine_facts()
    print(json.dumps(row), flush=True)
    with out.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(row) + "\n")
