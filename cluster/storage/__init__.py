"""Run folders on object storage: `--output-dir s3://BUCKET/PREFIX` (or any URI pyarrow or fsspec opens).

`location` parses the URI and opens its filesystem (credentials from the node's own environment), `probe`
checks before any engine starts that the store takes a write and explains what a store reports, `mirror`
keeps the local staging folder and the store in step (journals in parts), and `sync` pushes a run's folder
while the run goes on. Plain Python and pyarrow; nothing here imports Ray."""

from cluster._lazy import lazy_exports

_EXPORTS = {
    "location": ("RemoteFolder", "is_remote", "local_path", "staging_root"),
    "probe": ("StorageError", "probe_writable", "explain"),
    "mirror": ("FolderMirror", "is_journal"),
    "sync": (
        "RunFolderSync",
        "SyncPolicy",
        "open_run_folder",
        "local_copy",
        "readable_folder",
        "move_on_store",
    ),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
