"""The dtype every side of a bench runs in: what rayeval's engines make of `--dtype` on the device
(cluster.engines.engine_dtype), handed to the peers (`vllm.LLM`, `vllm serve`, lm-eval, Ray Data LLM) as
well, so that each comparison sets like engines side by side. `auto` on CPU is bfloat16 only where the CPU
computes it natively, else float32, where bfloat16 generates 3x slower (docs/BENCHMARKS.md); on GPU `auto` is
the model's own dtype, which vLLM resolves alike on every side. Each row records the dtype and whether the
CPU computes bfloat16 natively (`dtype_fields`)."""

from __future__ import annotations


def side_dtype(asked: str, device: str) -> str:
    """The dtype to give every side for rayeval's `--dtype asked` on `device`."""
    from cluster.config import ModelOptions
    from cluster.engines import engine_dtype, engine_settings

    return engine_dtype(engine_settings(ModelOptions(dtype=asked), "", device))


def dtype_fields(asked: str, device: str) -> dict[str, object]:
    """A row's record of its dtype: the one every side ran in, what rayeval was asked for, and this CPU."""
    from cluster.engines import cpu_has_native_bf16

    return {
        "dtype": side_dtype(asked, device),
        "dtype_asked": asked,
        "cpu_native_bf16": cpu_has_native_bf16(),
    }


def check_engine_dtype(run: dict, expected: str) -> None:
    """A rayeval side's engines (summary.json's `run.engines`) ran in `expected`; on GPU with `auto` the model
    decides, and every side's vLLM alike, so there is nothing to check."""
    if expected == "auto":
        return
    ran = {engine["dtype"] for engine in run.get("engines", [])}
    if ran - {expected}:
        raise SystemExit(
            f"rayeval's engines ran in {sorted(ran)}, the other sides in {expected}: unlike engines"
        )
