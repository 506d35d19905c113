"""Which checkpoints of a training run still being written are complete (no engine): the trainers' markers
(HF Trainer's trainer_state.json, verl's latest_checkpointed_iteration.txt), and files that stopped changing
where there is no marker; --every."""

from __future__ import annotations

import shutil
from pathlib import Path

from cluster.sweep.arrivals import ArrivalWatcher


def adapter(folder: Path, weights: bytes = b"w" * 64) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text('{"r": 4}')
    (folder / "adapter_model.safetensors").write_bytes(weights)
    return folder


def steps(watcher: ArrivalWatcher, now: float) -> list[int]:
    return [c.step for c in watcher.complete(now)]


def test_without_a_marker_a_checkpoint_is_complete_once_its_files_stopped_changing(tmp_path: Path):
    run = tmp_path / "run"
    watcher = ArrivalWatcher(run, settle_s=10)
    run.mkdir()
    assert steps(watcher, 0) == []  # nothing yet is not an error
    adapter(run / "checkpoint-100")
    assert steps(watcher, 1) == []  # just seen
    assert steps(watcher, 5) == []
    assert steps(watcher, 11) == [100]
    (run / "checkpoint-100" / "adapter_model.safetensors").write_bytes(b"w" * 128)  # written again
    assert steps(watcher, 12) == []
    assert steps(watcher, 22) == [100]


def test_a_trainers_marker_decides_where_the_layout_has_one(tmp_path: Path):
    run = tmp_path / "hf"
    done = adapter(run / "checkpoint-10")
    (done / "trainer_state.json").write_text("{}")
    adapter(run / "checkpoint-20")  # weights there, trainer_state.json not yet: still being saved
    watcher = ArrivalWatcher(run, settle_s=0)
    assert steps(watcher, 100) == [10]
    (run / "checkpoint-20" / "trainer_state.json").write_text("{}")
    assert steps(watcher, 101) == [10, 20]

    verl = tmp_path / "verl"
    adapter(verl / "global_step_5" / "actor" / "lora_adapter")
    adapter(verl / "global_step_10" / "actor" / "lora_adapter")
    (verl / "latest_checkpointed_iteration.txt").write_text("5\n")
    watcher = ArrivalWatcher(verl, settle_s=0)
    assert steps(watcher, 0) == [5]
    (verl / "latest_checkpointed_iteration.txt").write_text("10\n")
    assert steps(watcher, 1) == [5, 10]


def test_every_keeps_the_multiples(tmp_path: Path):
    run = tmp_path / "run"
    for step in (50, 100, 150, 200):
        adapter(run / f"step_{step}")
        (run / f"step_{step}" / "trainer_state.json").write_text("{}")
    assert steps(ArrivalWatcher(run, settle_s=0, every=100), 0) == [100, 200]


def test_a_marker_on_a_step_every_leaves_out_still_decides_for_the_others(tmp_path: Path):
    # --every 20: checkpoint-10 is left out, but its trainer_state.json says the trainer marks its checkpoints,
    # so checkpoint-20 (no marker yet: still being saved) is not taken as settled
    run = tmp_path / "hf"
    (adapter(run / "checkpoint-10") / "trainer_state.json").write_text("{}")
    adapter(run / "checkpoint-20")
    watcher = ArrivalWatcher(run, settle_s=0, every=20)
    assert steps(watcher, 100) == [] and [c.step for c in watcher.found()] == [20]
    (run / "checkpoint-20" / "trainer_state.json").write_text("{}")
    assert steps(watcher, 101) == [20]


def test_a_step_with_two_checkpoints_is_left_out_once_said_and_the_others_go_on(tmp_path: Path, caplog):
    """checkpoint-200/merged beside checkpoint-200's adapter: two checkpoints of one step. The watch once saw
    none at all then (and --until-idle ended it as if training were idle)."""
    run = tmp_path / "run"
    for step in (100, 200):
        (adapter(run / f"checkpoint-{step}") / "trainer_state.json").write_text("{}")
    merged = run / "checkpoint-200" / "merged"
    merged.mkdir()
    (merged / "config.json").write_text("{}")
    (merged / "model.safetensors").write_bytes(b"m" * 64)
    watcher = ArrivalWatcher(run, settle_s=0)
    with caplog.at_level("ERROR"):
        assert steps(watcher, 0) == [100]
        assert steps(watcher, 1) == [100]
    said = [r.getMessage() for r in caplog.records if "Step 200 has 2 checkpoints" in r.getMessage()]
    assert len(said) == 1 and "leaves it out until one is left" in said[0]
    shutil.rmtree(merged)
    assert steps(watcher, 2) == [100, 200]


def test_a_folder_removed_while_the_walk_reads_it_has_no_checkpoints(tmp_path: Path):
    """A trainer rotating its checkpoints (save_total_limit) removes one between the walk's listing of its
    parent and the listing of its own folders: the walk finds nothing there instead of raising."""
    from cluster.models.checkpoints import _subfolders

    (tmp_path / "a-file").write_text("x")
    assert _subfolders(tmp_path / "checkpoint-100") == [] and _subfolders(tmp_path / "a-file") == []


def test_a_finished_step_whose_task_could_not_run_is_tried_again_by_a_later_watch(tmp_path: Path):
    import json

    from cluster.sweep.watch import _had_task_errors

    for name, errors in (("step_100", {}), ("step_200", {"mmlu": "lm-eval failed while evaluating it"})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(
            json.dumps({"run": {"task_errors": errors}, "tasks": {}})
        )
    assert not _had_task_errors(tmp_path / "step_100") and _had_task_errors(tmp_path / "step_200")
    assert not _had_task_errors(tmp_path / "step_300")  # no summary: not finished, decided elsewhere


def test_a_finished_full_checkpoint_saved_again_is_evaluated_again_by_the_watch(tmp_path: Path):
    """Its step folder records the files it answered (the sweep writes checkpoint-files.json); a trainer
    restarted from an earlier step saves the step again: the watch counts it unfinished (the sweep then sets
    the old folder aside, tests/cluster/sweep/test_full_sweep.py). An adapter's digest names its requests."""
    import json

    from cluster.models.checkpoints import Checkpoint, CheckpointKind
    from cluster.sweep.step_records import WEIGHTS_RECORD, weights_state
    from cluster.sweep.watch import _saved_again

    checkpoint = tmp_path / "run" / "checkpoint-100"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text("{}")
    (checkpoint / "model.safetensors").write_bytes(b"w" * 64)
    (tmp_path / "sweep" / "step_100").mkdir(parents=True)
    (tmp_path / "sweep" / "step_100" / WEIGHTS_RECORD).write_text(json.dumps(weights_state(checkpoint)))
    full = [Checkpoint(100, checkpoint, CheckpointKind.FULL)]
    assert _saved_again(full, {100}, tmp_path / "sweep") == set()
    (checkpoint / "model.safetensors").write_bytes(b"v" * 80)  # saved again
    assert _saved_again(full, {100}, tmp_path / "sweep") == {100}
    assert (
        _saved_again([Checkpoint(100, checkpoint, CheckpointKind.LORA)], {100}, tmp_path / "sweep") == set()
    )
