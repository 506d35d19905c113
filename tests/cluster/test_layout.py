"""Project-level checks: Ray accepts ray-config.yaml, and the dependency direction of DESIGN.md holds."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def test_ray_accepts_the_cluster_launcher_config():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(yaml.safe_load((REPO / "ray-config.yaml").read_text()))
    validate_config(config)
    assert set(config["available_node_types"]) == {"head", "gpu_worker"}
    assert any("rayeval" in command for command in config["setup_commands"])


def test_sharding_and_evaluators_never_import_ray_vllm_or_cluster():
    offenders = []
    for package in ("sharding", "evaluators"):
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                offenders += [
                    f"{path.name}: {n}" for n in names if n.split(".")[0] in {"ray", "vllm", "cluster"}
                ]
    assert offenders == []
