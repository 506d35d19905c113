"""rayeval in other tools' contracts: `rdagent` (RD-Agent's fine-tuning loop's benchmark step)."""

from cluster._lazy import lazy_exports

_EXPORTS = {"rdagent": ("run_benchmark", "run_benchmarks", "install", "SUPPORTED_BENCHMARKS")}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
