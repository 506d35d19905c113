"""Lazy front doors: a package names what it exports, by the module that defines it, and the module is
imported on first use. Importing a package (or any module under it) then costs nothing heavy: Ray, vLLM and
openai load only where a caller reaches for a piece that runs them."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, tuple[str, ...]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """`__getattr__`, `__dir__` and `__all__` for `package`, given module (relative to it) -> names."""
    home = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = home.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    def __dir__() -> list[str]:
        return sorted(home)

    return __getattr__, __dir__, sorted(home)
