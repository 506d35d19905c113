"""The `rayeval` command: a parser whose `run` flags come from the config's fields, and one thin module per
command that builds a config, calls the API and prints. `entry` (the `rayeval` script) hands a run to this
machine's warm CLI server when one is up (`front`, `front_server`), so the front door is lazy: the script's
own start imports nothing heavy."""

from cluster._lazy import lazy_exports

_EXPORTS = {"app": ("build_parser", "main"), "front": ("entry",)}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
