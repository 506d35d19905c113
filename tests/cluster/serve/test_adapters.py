"""Where a served LoRA adapter comes from on a replica's node (no engine): a folder missing there is one
message naming both ways to get it there, and an adapter staged on the object store (a real S3-compatible
server) is downloaded into the node's staging folder, the same files as the local one."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.errors import ClusterError
from cluster.serve.adapters import adapter_digest, locate_adapters, replica_adapter_folder, stage_adapters
from tests.object_store import BUCKET, ObjectStore


def test_a_missing_adapter_folder_on_a_replicas_node_names_both_ways(tmp_path: Path):
    with pytest.raises(ClusterError) as refused:
        replica_adapter_folder("tuned", str(tmp_path / "not-here"))
    message = str(refused.value)
    assert "is not a folder on this replica's node" in message
    assert "at that path on every node" in message and "--lora-store s3://BUCKET/adapters" in message


def test_a_staged_adapter_is_uploaded_once_by_digest_and_downloaded_whole(
    s3: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 4}')
    (adapter / "adapter_model.safetensors").write_bytes(b"\x00weights" * 100)
    [staged] = stage_adapters(locate_adapters({"tuned": str(adapter)}), s3.uri("staged-adapters"))
    assert staged.source == f"{s3.uri('staged-adapters')}/tuned-{adapter_digest(adapter)}"
    assert s3.read(staged.source.removeprefix(f"s3://{BUCKET}/")) == {
        "adapter_config.json": b'{"r": 4}',
        "adapter_model.safetensors": b"\x00weights" * 100,
    }
    monkeypatch.setenv("RAYEVAL_STAGING_DIR", str(tmp_path / "replica-node"))
    folder = Path(replica_adapter_folder("tuned", staged.source))
    assert folder.is_relative_to(tmp_path / "replica-node")
    assert (folder / "adapter_model.safetensors").read_bytes() == b"\x00weights" * 100
    # an adapter on the store already is served from there: `--lora NAME=URI`, taken as it is
    from cluster.config import ServeConfig

    given = ServeConfig(adapters=[f"tuned={staged.source}"])
    [there] = locate_adapters(given.lora_modules)
    assert there.source == staged.source and (Path(there.local) / "adapter_config.json").is_file()
    (adapter / "adapter_config.json").write_text('{"r": 8}')  # changed: staged anew, beside the old copy
    [again] = stage_adapters(locate_adapters({"tuned": str(adapter)}), s3.uri("staged-adapters"))
    assert again.source != staged.source
