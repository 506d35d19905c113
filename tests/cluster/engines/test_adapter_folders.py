"""Where an engine actor finds a LoRA adapter's files on its node (`cluster.engines.adapters.AdapterFolders`):
plain files, no Ray. The adapter's own path while it holds the planned files, the copy staged in the node's
cache otherwise; never other files at the path, also where they are put there after the first lookup."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cluster.engines.adapters import AdapterFolders
from cluster.models.checkpoints import adapter_digest, adapter_files, staged_adapter_dir
from sharding.requests import Adapter

PLANNED = {"adapter_config.json": b'{"r": 4}', "adapter_model.safetensors": b"planned weights"}


def write(folder: Path, files: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def test_the_planned_files_at_the_path_then_the_staged_copy_once_the_path_holds_others(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYEVAL_CACHE", str(tmp_path / "cache"))
    path = write(tmp_path / "step_480", PLANNED)
    adapter = Adapter("step_480", str(path), adapter_digest(adapter_files(path)))
    folders = AdapterFolders()

    assert asyncio.run(folders.folder(adapter)) == str(path)
    (path / "adapter_model.safetensors").write_bytes(
        b"retrained, longer weights"
    )  # the path given other files
    assert asyncio.run(folders.folder(adapter)) is None  # looked up again: its files' sizes changed

    staged = asyncio.run(folders.stage(adapter, PLANNED))
    assert (
        staged
        == str(staged_adapter_dir(adapter))
        == str(tmp_path / "cache" / "adapters" / f"step_480-{adapter.digest}")
    )
    assert adapter_files(Path(staged)) == PLANNED
    assert asyncio.run(folders.folder(adapter)) == staged

    fresh = AdapterFolders()  # another engine of the node (or this one restarted) finds the staged copy
    assert asyncio.run(fresh.folder(adapter)) == staged


def test_a_node_without_the_adapter_has_no_folder_for_it(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYEVAL_CACHE", str(tmp_path / "cache"))
    adapter = Adapter("gone", str(tmp_path / "gone"), "0" * 16)
    assert asyncio.run(AdapterFolders().folder(adapter)) is None
