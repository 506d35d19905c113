"""Lazy front doors: a package names what it exports and from which module, and the module is imported on
first use. Importing a package (or any module under it) then costs nothing heavy: Ray, vLLM and openai load
only where a caller reaches for a piece that runs them."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, given export name -> module (relative to the package)."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
