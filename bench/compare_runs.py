"""Whether two run folders hold the same results: every sample record (JSONL and Parquet) and every summary
metric. The fields that differ between any two runs of the same code are left out: `latency_s`, and
`replica` (which replica a request went to depends on timing); everything else must be identical. Used to
check that a refactor changes no output:

    python bench/compare_runs.py RUN_DIR_BEFORE RUN_DIR_AFTER      # exit 0 when identical
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pyarrow.parquet as pq

VOLATILE = {"latency_s", "replica"}


def stable_lines(path: Path) -> list[str]:
    """The file's records as JSON lines, in file order, without the volatile fields."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [json.dumps({k: v for k, v in r.items() if k not in VOLATILE}, ensure_ascii=False) for r in rows]


def same_samples(before: Path, after: Path) -> bool:
    ok = True
    for jsonl in sorted((before / "samples").rglob("*.jsonl")):
        other = after / jsonl.relative_to(before)
        a, b = stable_lines(jsonl), stable_lines(other)
        digest = [hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16] for lines in (a, b)]
        print(
            f"{jsonl.relative_to(before)}: {len(a)} records, identical: {a == b} (sha256 {digest[0]} / {digest[1]})"
        )
        table_a, table_b = (
            pq.read_table(jsonl.with_suffix(".parquet")),
            pq.read_table(other.with_suffix(".parquet")),
        )
        columns = [c for c in table_a.column_names if c not in VOLATILE]
        same_table = table_a.select(columns).equals(table_b.select(columns))
        print(f"  {jsonl.with_suffix('.parquet').name}: {len(columns)} columns identical: {same_table}")
        ok = ok and a == b and same_table
    return ok


def same_summaries(before: Path, after: Path) -> bool:
    ok = True
    tasks_a = json.loads((before / "summary.json").read_text())["tasks"]
    tasks_b = json.loads((after / "summary.json").read_text())["tasks"]
    for task, summary in tasks_a.items():
        same = summary["metrics"] == tasks_b[task]["metrics"]
        print(f"summary.json {task}: {len(summary['metrics'])} metrics identical: {same}")
        ok = ok and same
    return ok


def main() -> None:
    before, after = (Path(p) for p in sys.argv[1:3])
    ok = same_samples(before, after) & same_summaries(before, after)
    print("ALL IDENTICAL" if ok else "DIFFERENT")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
