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


def stage_adapters(modules: dict[str, str], store: str | None) -> list[ServedAdapter]:
    """Each adapter where its replicas read it: local ones uploaded under `store` when one is given."""
    staged = []
    for name, given in modules.items():
        if is_remote(given):
            staged.append(
                ServedAdapter(name, RemoteFolder.parse(given, f"--lora {name}").uri, readable_folder(given))
            )
            continue
        local = Path(given).expanduser().resolve()
        if store is None or not local.is_dir():  # a missing folder: the adapter checks say so
            staged.append(ServedAdapter(name, str(local), local))
            continue
        target = RemoteFolder.parse(store, "--lora-store").child(f"{name}-{adapter_digest(local)}")
        try:
            FolderMirror(local, target).push(final=True)
        except OSError as exc:
            raise ClusterError(f"--lora {name}: {explain(target, exc, 'staging the adapter')}") from None
        staged.append(ServedAdapter(name, target.uri, local))
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
