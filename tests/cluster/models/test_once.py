"""A model folder built once per machine (`cluster.models.once.built_once`): several builders at once (the
replicas of one node merging the same checkpoint) build it once, and every one gets the folder."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cluster.models.once import built_once


def test_builders_at_once_build_the_folder_once_and_all_get_it(tmp_path):
    target = tmp_path / "merged" / "SmolLM2-135M-Instruct+step_480-0123456789abcdef"
    builds: list[str] = []
    lock = threading.Lock()

    def build(staging: Path) -> None:
        with lock:
            builds.append(staging.name)
        time.sleep(0.3)  # long enough for the others to arrive while it builds
        (staging / "model.safetensors").write_bytes(b"merged")
        (staging / "config.json").write_text("{}")

    with ThreadPoolExecutor(4) as threads:
        got = list(threads.map(lambda _: built_once(target, build, "merging"), range(4)))
    assert got == [target] * 4 and len(builds) == 1
    assert (target / "model.safetensors").read_bytes() == b"merged"
    assert sorted(p.name for p in target.parent.iterdir()) == [
        f".{target.name}.lock",
        target.name,
    ]  # no staging left
