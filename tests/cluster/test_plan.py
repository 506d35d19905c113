"""A run's plan is frozen: what the cluster decides once it is joined (the device of `auto`) makes a new plan."""

from __future__ import annotations

from dataclasses import FrozenInstanceError

import pytest

from cluster.config import build_config
from cluster.engines import replica_plan
from cluster.plan import build_model_plan


def test_a_plan_is_frozen_and_the_clusters_device_makes_a_new_one():
    config = build_config({"model": {"tensor_parallel_size": 2}}, {}, "the test")
    plan = build_model_plan(config, "cpu")
    with pytest.raises(FrozenInstanceError):
        plan.device = "gpu"  # type: ignore[misc]
    on_gpu = plan.on_device("gpu")
    assert (on_gpu.device, on_gpu.replica) == ("gpu", replica_plan(config, "gpu"))
    assert on_gpu.replica.bundle["GPU"] == 2.0 and on_gpu.model == plan.model
    assert (plan.device, plan.replica) == ("cpu", replica_plan(config, "cpu"))  # the first plan is unchanged
