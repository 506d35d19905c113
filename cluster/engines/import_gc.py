"""Large imports with Python's cyclic garbage collector paused, and what they made frozen after.

Importing vLLM makes hundreds of thousands of objects that live as long as the process (modules, classes,
functions, torch's operator registrations, transformers' lazy tables). The collector walks them again each
time allocations pass its thresholds during the import, and finds nothing to free: about a tenth of an
engine process's 8 to 9 s vLLM import on two cores (docs/BENCHMARKS.md). Paused for the import, the collector
runs no pass; `gc.freeze()` then moves what the import made into the permanent generation, so later passes in
the engine's process skip it (and in the engine-core server, children forked from it share those pages
instead of copying them when a pass would touch their headers). vLLM's engine core freezes its own heap
after it starts, the same way.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No collection while inside; on the way out everything alive is frozen and the collector runs again
    if it ran before (a caller that had turned it off keeps it off)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
