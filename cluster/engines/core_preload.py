"""What the engine-core server (cluster.engines.forkserver) imports before it forks an engine core, imported
with the collector paused (cluster.engines.import_gc). Importing this module is the server's one preload.

The order matters. title_room first: it must run before an import changes the environment (OpenCV's,
imported with vLLM, prepends to LD_LIBRARY_PATH). Ray: a child imports its parent's main module before it
runs (a Ray worker's is Ray's default_worker.py, which imports Ray), at once when the server has Ray already.
lean_imports before vLLM: transformers then skips scikit-learn, which no engine uses.
"""

from __future__ import annotations

from cluster.engines.import_gc import import_with_collector_paused

ENGINE_CORE_IMPORTS = (
    "cluster.engines.title_room",
    "ray",
    "cluster.engines.lean_imports",
    "vllm.v1.engine.core",
)

import_with_collector_paused(*ENGINE_CORE_IMPORTS)
