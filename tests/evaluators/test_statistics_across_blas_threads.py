"""Every statistic rayeval reports has the same bits whatever number of threads numpy's BLAS (OpenBLAS) runs:
BLAS splits a long matrix-vector or dot product over its threads and adds the parts, so a sum computed that
way rounds differently on a machine with more cores, under OPENBLAS_NUM_THREADS, or in a `rayeval run` forked
by the warm CLI server (whose BLAS runs one thread: cluster/cli/front_server.py). The same statistics are
computed in two fresh processes, one with BLAS on one thread and one with it on every core, and compared by
their reprs. On a one-core machine both sides run one thread and the comparison cannot fail."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

# 20,000 questions: past OpenBLAS's one-thread limit for a dot product (10,000 elements)
PROBE = """
import numpy as np

from evaluators.judging.statistics import length_controlled_win_rate, ratio_statistic
from evaluators.paired import paired_difference
from evaluators.passk import pass_at_k_table
from evaluators.stats import ScoredItem, summarize

rng = np.random.default_rng(7)
questions = np.repeat(np.arange(20_000), 2)
values, weights = rng.random(questions.size), rng.integers(1, 4, questions.size).astype(float)
print(repr(ratio_statistic("k", questions, values, weights, rounds=200)))
items = [ScoredItem(int(q), i % 2, float(v), float(w)) for i, (q, v, w) in enumerate(zip(questions, values, weights))]
print(repr(summarize(items, 2)))
other = [ScoredItem(i.question, i.run, 1.0 - i.value, i.weight) for i in items]
print(repr(paired_difference(items, other)))
binary = [ScoredItem(i.question, i.run, float(i.value > 0.5), 1.0) for i in items]
print(repr(pass_at_k_table(binary)))
games = 20_000
print(repr(length_controlled_win_rate(rng.integers(0, 2, games).astype(float), rng.normal(0, 300, games))))
"""


def statistics_with_blas_threads(threads: int) -> str:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_every_statistic_has_the_same_bits_on_one_blas_thread_as_on_every_core():
    cores = len(os.sched_getaffinity(0))
    one, every = statistics_with_blas_threads(1), statistics_with_blas_threads(max(cores, 2))
    assert one.count("\n") == 5
    assert one == every


# numpy's functions that compute through BLAS (or can: einsum with `optimize` goes through tensordot)
BLAS_ROUTES = frozenset({"dot", "vdot", "vecdot", "matmul", "matvec", "vecmat", "inner", "tensordot", "linalg",
                         "correlate", "convolve", "cov", "corrcoef", "polyfit", "lstsq"})  # fmt: skip


def blas_routes(path: Path) -> list[str]:
    """Where a module computes through BLAS: `@`, a BLAS_ROUTES function by attribute, name or import, and
    einsum given `optimize`."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            found.append(f"{node.lineno} @")
        elif isinstance(node, ast.Attribute) and node.attr in BLAS_ROUTES:
            found.append(f"{node.lineno} .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in BLAS_ROUTES:
            found.append(f"{node.lineno} {node.id}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("numpy"):
            found += [f"{node.lineno} import {a.name}" for a in node.names if a.name in BLAS_ROUTES]
            found += [f"{node.lineno} from {node.module}"] if "linalg" in node.module else []
        elif isinstance(node, ast.Call) and any(k.arg == "optimize" for k in node.keywords):
            found.append(f"{node.lineno} optimize=")
    return found


def test_no_statistic_is_a_blas_product(tmp_path):
    """The probe above covers the statistics of today; this keeps a new one off BLAS:
    `evaluators.judging.statistics.row_sums` sums in numpy's own loop."""
    found = {str(p.relative_to(REPO)): blas_routes(p) for p in sorted((REPO / "evaluators").rglob("*.py"))}
    assert {path: lines for path, lines in found.items() if lines} == {}
    # and each route is seen
    probe = tmp_path / "routes.py"
    probe.write_text("import numpy as np\nfrom numpy import dot\nfrom numpy.linalg import norm\n"
                     "a @ b\nnp.vecdot(a, b)\ndot(a, b)\nnp.einsum('i,i', a, b, optimize=True)\n")  # fmt: skip
    assert sorted(blas_routes(probe)) == sorted(
        ["2 import dot", "3 from numpy.linalg", "4 @", "5 .vecdot", "6 dot", "7 optimize="]
    )
