"""Where `rayeval serve --lora NAME=...` adapters come from on each replica's node.

vLLM loads an adapter from a local folder, and every replica loads every adapter when its engine starts. A
local adapter is read at its path on each replica's node (a shared filesystem, or one node); with
`--lora-store URI` it is uploaded there first, under its name and a digest of its files, and an adapter
given as a URI (`--lora NAME=s3://...`) is used where it is. A replica downloads an adapter on object
storage into its node's staging folder (cluster.storage) before its engine starts, with that node's
credentials.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from cluster.errors import ClusterError
from cluster.storage import FolderMirror, RemoteFolder, explain, is_remote, readable_folder


@dataclass(frozen=True)
class ServedAdapter:
    name: str
    source: str  # a local path, or a URI on object storage
    local: Path  # a copy on this machine, for the checks before any replica starts


def adapter_digest(folder: Path) -> str:
    """A digest of the adapter's files (names and contents): a changed adapter is staged anew."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def locate_adapters(modules: dict[str, str]) -> list[ServedAdapter]:
    """Each adapter where it is now: a local folder, or one on object storage read into its staging copy
    here (for the checks before any replica starts)."""
    located = []
    for name, given in modules.items():
        if is_remote(given):
            uri = RemoteFolder.parse(given, f"--lora {name}").uri
            located.append(ServedAdapter(name, uri, readable_folder(uri)))
        else:
            local = Path(given).expanduser().resolve()
            located.append(ServedAdapter(name, str(local), local))
    return located


def stage_adapters(adapters: list[ServedAdapter], store: str) -> list[ServedAdapter]:
    """The local adapters uploaded under `store` (by name and digest), each replica to read them there; those
    already on object storage stay where they are."""
    staged = []
    for adapter in adapters:
        if is_remote(adapter.source):
            staged.append(adapter)
            continue
        target = RemoteFolder.parse(store, "--lora-store").child(
            f"{adapter.name}-{adapter_digest(adapter.local)}"
        )
        try:
            FolderMirror(adapter.local, target).push(final=True)
        except OSError as exc:
            raise ClusterError(
                f"--lora {adapter.name}: {explain(target, exc, 'staging the adapter')}"
            ) from None
        staged.append(ServedAdapter(adapter.name, target.uri, adapter.local))
    return staged


def replica_adapter_folder(name: str, source: str) -> str:
    """On a replica's node, before its engine starts: the local folder of an adapter (downloaded from object
    storage into the node's staging folder where it is there)."""
    if is_remote(source):
        return str(readable_folder(source))
    if not Path(source).is_dir():
        raise ClusterError(
            f"LoRA adapter {name}: {source} is not a folder on this replica's node. Either put the adapter at that "
            "path on every node (a shared filesystem), or stage it on object storage: `rayeval serve --lora "
            f"{name}={source} --lora-store s3://BUCKET/adapters` (or --lora {name}=s3://... for one already there)."
        )
    return source
