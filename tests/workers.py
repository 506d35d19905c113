"""How the suite spreads over pytest-xdist's workers (`make test` runs `pytest -n 2`; tests/conftest.py's
`pytest_xdist_make_scheduler` returns `UnitScheduling`).

Each test module is one unit of work (its module fixtures, often a run or a cluster, are made once, in one
worker), except two groups of modules that each run in one worker, one module after another:

- MANY_ENGINES: modules whose tests start several engines of their own at once (beyond the shared cluster's
  warm pools: tests/warm_cluster.py), or clusters of their own holding them;
- ONE_ENGINE: modules whose tests start one engine (or one small cluster) of their own at a time.

So at most one test of each group holds its own engines at any time: the machine's memory (24 GiB, each CPU
engine about 3 GB, the pools about 7) holds the pools, one test of each group and the rest, which start none.
The groups go first (the longest chain of work starts at once, beside the tests that need no cluster), the
tests outside tests/cluster next, while the pools start, then the other modules of tests/cluster.
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

MANY_ENGINES = (
    "tests/cluster/run/test_multi_node.py",  # a cluster of its own: useful work while the pools start
    "tests/cluster/run/test_end_to_end.py",
    "tests/cluster/sources/test_warm_pools.py",
    "tests/cluster/serve/test_serve.py",
    "tests/cluster/lm_eval/test_lm_eval.py",
    "tests/cluster/training/test_evaluator.py",
    "tests/cluster/sweep/test_full_sweep.py",
    "tests/cluster/sweep/test_lora_sweep.py",
)
ONE_ENGINE = (
    "tests/cluster/engines/test_actor.py",  # an in-process local cluster: useful work while the pools start
    "tests/cluster/engines/test_failures.py",
    "tests/cluster/engines/test_forkserver.py",
    "tests/cluster/test_separate_hosts.py",
    "tests/cluster/test_runs_on_separate_hosts.py",
    "tests/cluster/run/test_sampling.py",
    "tests/cluster/endpoints/test_endpoint_lm_eval.py",
    "tests/cluster/integrations/test_rdagent.py",
)
GROUPS = {"many-engines": MANY_ENGINES, "one-engine": ONE_ENGINE}
_GROUP_OF = {module: name for name, modules in GROUPS.items() for module in modules}
_PLACE = {module: place for modules in GROUPS.values() for place, module in enumerate(modules)}


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def group_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its group's name, or its module's path."""
    module = module_of(nodeid)
    return _GROUP_OF.get(module, module)


def order(nodeid: str) -> tuple[int, int]:
    """Where a test goes in the run (a stable sort keeps the order within a module): the groups first, each
    in its modules' order, then the tests outside tests/cluster, then the rest of tests/cluster."""
    module = module_of(nodeid)
    if module in _GROUP_OF:
        return (list(GROUPS).index(_GROUP_OF[module]), _PLACE[module])
    return (len(GROUPS) + int(module.startswith("tests/cluster/")), 0)


class UnitScheduling(LoadScopeScheduling):
    """xdist's scope scheduling over this module's units (`group_of`), handed out in the collection's order
    (tests/conftest.py sorts it by `order`) rather than the largest unit first. A worker is given the next
    unit when it has two tests left, so a group is never split and no unit waits long behind one."""

    def __init__(self, config, log=None) -> None:  # noqa: ANN001 - xdist's pytest.Config and Producer
        config.option.loadscopereorder = False  # read by LoadScopeScheduling.schedule
        super().__init__(config, log)

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)
