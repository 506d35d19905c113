"""What a sweep records in its folders to know later what it did: the files a checkpoint's step answered
(a checkpoint or adapter saved again is evaluated afresh), which tracker had which step's numbers (a rerun
logs none twice), and the settings a step's numbers depend on (steps run otherwise are not points of one
curve)."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

# in the sweep folder: the numbers each --log-to tracker had, by step
TRACKED_STEPS = "tracker-steps.json"
# in a checkpoint's step folder: the files its answers came from
WEIGHTS_RECORD = "checkpoint-files.json"
CONFIG_FILES = ("config.json", "adapter_config.json")  # a model's, an adapter's


def weights_changed(run_dir: Path, current: list[list[str | int]]) -> bool:
    """Whether a checkpoint's step folder answered other files than `current` (`weights_state` of the
    checkpoint now); a folder without a record (none yet, or made before records were kept) did not. An
    unreadable record did: which weights answered is unknown."""
    record = run_dir / WEIGHTS_RECORD
    try:
        return record.is_file() and json.loads(record.read_text()) != current
    except (OSError, ValueError):
        return True


def weights_state(folder: Path) -> list[list[str | int]]:
    """(name, size, modification time) of the files an engine loads from a model or adapter folder: weights
    and config."""
    found = []
    for path in sorted(folder.iterdir()):
        if path.is_file() and (path.suffix in (".safetensors", ".bin") or path.name in CONFIG_FILES):
            stat = path.stat()
            found.append([path.name, stat.st_size, stat.st_mtime_ns])
    return found


def numbers_digest(run_dir: Path) -> str:
    """A digest of a run's task numbers (summary.json's `tasks`; its `run` part holds times, new each run)."""
    try:
        tasks = json.loads((run_dir / "summary.json").read_text())["tasks"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    return hashlib.sha256(json.dumps(tasks, sort_keys=True).encode()).hexdigest()[:16]


# What a step's numbers depend on besides its checkpoint (and its judge, which the curves check apart):
# steps run with other values of these are not points of one curve.
SCORING_SETTINGS = ("tasks", "limit", "test_range", "num_fewshot", "num_samples", "sampling", "lm_eval")
SCORING_MODEL_SETTINGS = ("dtype", "max_model_len", "chat_template", "think_end_token")


def scoring_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The part of a run's settings (its config.yaml, or a config's `model_dump(mode="json")`) that its
    numbers depend on besides the checkpoint. A setting left unset is left out, as one that did not exist yet
    when an earlier rayeval wrote the file (a new field's default is unset): neither is a difference."""
    model = settings.get("model") or {}
    return _set_only(
        {
            **{key: settings.get(key) for key in SCORING_SETTINGS},
            "model": {key: model.get(key) for key in SCORING_MODEL_SETTINGS},
        }
    )


def _set_only(value: Any) -> Any:
    """`value` with every mapping's None entries left out, at any depth (in lists too)."""
    if isinstance(value, dict):
        return {key: _set_only(inner) for key, inner in value.items() if inner is not None}
    if isinstance(value, list):
        return [_set_only(inner) for inner in value]
    return value


def step_settings(run_dir: Path) -> dict[str, Any] | None:
    """`scoring_settings` of a step folder's run, from its config.yaml; None where it has none readable. A
    watch asks this of every finished step at each poll: the file is parsed again only where its size or
    modification time changed (PyYAML takes milliseconds a file, hundreds of steps a good part of a poll)."""
    config = run_dir / "config.yaml"
    try:
        stat = config.stat()
    except OSError:
        return None
    saved = _parsed_config(str(config), stat.st_mtime_ns, stat.st_size)
    return scoring_settings(saved) if isinstance(saved, dict) else None


@functools.lru_cache(maxsize=4096)
def _parsed_config(path: str, mtime_ns: int, size: int) -> Any:
    """The YAML of the file at `path` as it was at (`mtime_ns`, `size`); None where it cannot be read. The
    result is shared between calls: read it, never change it."""
    import yaml

    try:
        return yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return None


def settings_differences(ran: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The settings (dotted) whose values differ between two `scoring_settings`, with both values."""
    found = []
    for key in sorted(set(ran) | set(now)):
        a, b = ran.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found += [f"{key}.{inner}" for inner in settings_differences(a, b)]
        elif a != b:
            found.append(f"{key} {json.dumps(a)} (now {json.dumps(b)})")
    return found
