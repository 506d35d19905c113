"""Which checkpoints of a training run still being written are complete (no engine): the trainers' markers
(HF Trainer's trainer_state.json, verl's latest_checkpointed_iteration.txt), and files that stopped changing
where there is no marker; --every."""

from __future__ import annotations

import os
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


def test_a_marker_older_than_the_checkpoints_files_counts_once_they_settle(tmp_path: Path):
    """A checkpoint saved again in place writes new weights over its old trainer_state.json: it is not taken
    (mid-write, it would be read in mixed shards) until its new marker comes, or its files settle (a folder
    copied in another order keeps a marker older than its weights for good)."""
    run = tmp_path / "hf"
    folder = adapter(run / "checkpoint-10")
    marker, weights = folder / "trainer_state.json", folder / "adapter_model.safetensors"
    marker.write_text("{}")
    at = marker.stat().st_mtime_ns
    os.utime(weights, ns=(at - 10**9, at - 10**9))
    watcher = ArrivalWatcher(run, settle_s=10)
    assert steps(watcher, 0) == [10]  # marked after its files
    rng = folder / "rng_state_1.pth"  # another rank's file, written after the marker: no engine loads it
    rng.write_bytes(b"r")
    os.utime(rng, ns=(at + 10**9, at + 10**9))
    assert steps(watcher, 0.5) == [10]

    weights.write_bytes(b"v" * 64)  # saved again: new weights, the old marker
    os.utime(weights, ns=(at + 10**9, at + 10**9))
    assert steps(watcher, 1) == []
    assert steps(watcher, 5) == []
    os.utime(marker, ns=(at + 2 * 10**9, at + 2 * 10**9))  # the new marker, written last
    assert steps(watcher, 6) == [10]

    os.utime(marker, ns=(at, at))  # a copy whose marker is older than its weights
    assert steps(watcher, 7) == []
    assert steps(watcher, 17) == [10]  # its files unchanged for settle_s


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


def test_a_finished_step_whose_task_could_not_run_or_whose_replicas_died_is_left_off_and_tried_again(
    tmp_path: Path, caplog
):
    """A step whose run could not run a task, or whose samples failed outside the model (its replicas died,
    an API kept failing), is no checkpoint's score: the curves leave it off with a warning and a later watch
    asks it again; one whose failures are the model's own (an over-long prompt) stands."""
    import json

    from cluster.sweep import complete_steps, draw_curves
    from evaluators.curves import ErrorBar, partial_because

    steps = {
        "step_100": ({}, {"EmptyOutput": 1, "VLLMValidationError": 2}),
        "step_200": ({"mmlu": "lm-eval failed while evaluating it"}, {}),
        "step_300": ({}, {"ReplicasDead": 97}),
        "step_400": ({}, {"JudgeAPIError": 2, "ReplicaLost": 1}),
    }
    for name, (errors, reasons) in steps.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(
            json.dumps({"run": {"task_errors": errors}, "tasks": {"gsm8k": {"failure_reasons": reasons}}})
        )
    (tmp_path / "step_500").mkdir()  # no summary: not finished
    assert partial_because(tmp_path / "step_100") is None
    assert partial_because(tmp_path / "step_200") == "task(s) mmlu could not run"
    assert partial_because(tmp_path / "step_300") == "97 sample(s) failed outside the model (97 ReplicasDead)"
    assert partial_because(tmp_path / "step_400") == (
        "3 sample(s) failed outside the model (2 JudgeAPIError, 1 ReplicaLost)"
    )
    assert complete_steps(tmp_path) == [(100, tmp_path / "step_100")]
    assert "step 300 is left off the curves: 97 sample(s) failed outside the model" in caplog.text
    warned: set[str] = set()  # a watch's: each partial step said once, not at every poll
    caplog.clear()
    complete_steps(tmp_path, warned)
    complete_steps(tmp_path, warned)
    assert caplog.text.count("step 300 is left off the curves") == 1
    caplog.clear()
    for _ in range(2):  # the curves a watch draws after each batch say it once too
        draw_curves(tmp_path, "s", ErrorBar.CI95)
    assert caplog.text.count("step 300 is left off the curves") == 1


def test_a_finished_checkpoint_saved_again_is_evaluated_again_by_the_watch(tmp_path: Path):
    """Its step folder records the files it answered (the sweep writes checkpoint-files.json); a trainer
    restarted from an earlier step saves the step again: the watch counts it unfinished (the sweep then sets
    the old folder aside, tests/cluster/sweep/test_full_sweep.py), a full checkpoint's or an adapter's."""
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
    saved = adapter(tmp_path / "run" / "checkpoint-200")
    (tmp_path / "sweep" / "step_200").mkdir(parents=True)
    (tmp_path / "sweep" / "step_200" / WEIGHTS_RECORD).write_text(json.dumps(weights_state(saved)))
    lora = [Checkpoint(200, saved, CheckpointKind.LORA)]
    assert _saved_again(lora, {200}, tmp_path / "sweep") == set()
    (saved / "adapter_model.safetensors").write_bytes(b"v" * 80)  # the adapter saved again
    assert _saved_again(lora, {200}, tmp_path / "sweep") == {200}


def test_a_doubled_step_stops_only_a_sweep_that_asks_for_it(tmp_path: Path):
    """checkpoint-200 holds an adapter and a merged copy of it: a watch leaves step 200 out and asks for
    300 alone, which must plan (and not end the watch over step 200); a sweep of every step, or
    `--steps 200`, is told which folders to choose between."""
    import pytest

    from cluster.models.checkpoints import find_checkpoints
    from evaluators.errors import EvalInputError

    adapter(tmp_path / "checkpoint-200")
    merged = tmp_path / "checkpoint-200" / "merged"
    merged.mkdir()
    (merged / "config.json").write_text("{}")
    (merged / "model.safetensors").write_bytes(b"w")
    adapter(tmp_path / "checkpoint-300")
    assert [c.step for c in find_checkpoints(tmp_path, [300])] == [300]
    for steps in (None, [200, 300]):
        with pytest.raises(EvalInputError, match="Step 200 has 2 checkpoints"):
            find_checkpoints(tmp_path, steps)


def test_a_watch_whose_first_checkpoints_are_all_skipped_keeps_watching(tmp_path: Path, caplog):
    """The first checkpoint to complete is an adapter that cannot run (IA3, not LoRA): the watch says why
    and goes on polling until idle, rather than ending with the sweep's "no checkpoint can run"."""
    from cluster.config import build_config
    from cluster.sweep.watch import WatchOptions, watch_checkpoints

    run = tmp_path / "train"
    bad = adapter(run / "checkpoint-100")
    (bad / "adapter_config.json").write_text('{"peft_type": "IA3"}')
    config = build_config({"output_dir": str(tmp_path / "out")}, {}, "the test")
    options = WatchOptions(until_idle_s=0.5, poll_s=0.1, settle_s=0.0)
    result = watch_checkpoints(config, run, options, progress=False)
    assert result.batches == []
    assert "step 100 skipped:" in caplog.text and "only LoRA adapters run on vLLM" in caplog.text


def test_sweep_json_keeps_every_steps_latest_outcome_across_calls(tmp_path: Path):
    """A watch writes sweep.json after each batch (a sweep after each --steps call): the earlier steps stay."""
    import json
    from types import SimpleNamespace

    from cluster.sweep.runner import StepOutcome, StepStatus, _write_sweep_json

    plan = SimpleNamespace(root=tmp_path, checkpoint_dir=tmp_path / "train", series="train")

    def call(*outcomes: StepOutcome) -> list[tuple[int, str]]:
        result = SimpleNamespace(wall_s=1.0, engine_starts=1, swaps=0, outcomes=list(outcomes), files=[])
        _write_sweep_json(plan, result)
        return [(o["step"], o["status"]) for o in json.loads((tmp_path / "sweep.json").read_text())["steps"]]

    assert call(StepOutcome(200, "lora", "c-200", StepStatus.FAILED)) == [(200, "failed")]
    assert call(StepOutcome(100, "lora", "c-100", StepStatus.DONE)) == [(100, "done"), (200, "failed")]
    assert call(StepOutcome(200, "lora", "c-200", StepStatus.DONE)) == [(100, "done"), (200, "done")]


def test_steps_run_with_other_settings_are_evaluated_again_by_a_watch_and_flagged_on_the_curves(
    tmp_path: Path, caplog
):
    """Step 100 ran with --limit 50, step 200 with --limit 100 (the watch restarted with another limit): the
    watch evaluates step 100 again, saying why once, and the curves warn that its points are not comparable."""
    import yaml

    from cluster.config import build_config
    from cluster.sweep.runner import _warn_of_mixed_settings
    from cluster.sweep.step_records import scoring_settings
    from cluster.sweep.watch import _ran_otherwise

    for step, limit in ((100, 50), (200, 100)):
        (tmp_path / f"step_{step}").mkdir()
        saved = {**build_config({"limit": limit}, {}, "t").model_dump(mode="json"), "run_id": f"step_{step}"}
        (tmp_path / f"step_{step}" / "config.yaml").write_text(yaml.safe_dump(saved))
    now = scoring_settings(build_config({"limit": 100}, {}, "t").model_dump(mode="json"))
    warned: set[str] = set()
    assert _ran_otherwise({100, 200}, tmp_path, now, warned) == {100}
    assert _ran_otherwise({100, 200}, tmp_path, now, warned) == {100}
    assert caplog.text.count("watch: step 100 ran with other settings (limit 50 (now 100))") == 1
    for _ in range(2):  # the curves of two batches of a watch: said once
        _warn_of_mixed_settings(warned, [(100, tmp_path / "step_100"), (200, tmp_path / "step_200")])
    assert caplog.text.count("step 100 ran with other settings than step 200 (limit 50 (now 100))") == 1


def test_a_step_an_earlier_rayeval_ran_before_a_setting_existed_is_not_evaluated_again(
    tmp_path: Path, caplog
):
    """Step 100's config.yaml lacks settings added since (sampling.top_k, a task's top_k): unset then and
    unset now are the same settings, so a watch after an upgrade does not evaluate every old step again.
    A setting given a value is a difference still."""
    import yaml

    from cluster.config import build_config
    from cluster.sweep.step_records import scoring_settings
    from cluster.sweep.watch import _ran_otherwise

    config = build_config({"limit": 10}, {}, "t").model_dump(mode="json")
    older = {**config, "run_id": "step_100", "sampling": dict(config["sampling"])}
    del older["sampling"]["top_k"]
    older["tasks"] = [{k: v for k, v in task.items() if k != "top_k"} for task in config["tasks"]]
    assert older["tasks"] and older["tasks"] != config["tasks"]
    (tmp_path / "step_100").mkdir()
    (tmp_path / "step_100" / "config.yaml").write_text(yaml.safe_dump(older))
    now = scoring_settings(config)
    assert _ran_otherwise({100}, tmp_path, now, set()) == set()
    topped = scoring_settings(
        build_config({"limit": 10, "sampling": {"top_k": 5}}, {}, "t").model_dump(mode="json")
    )
    assert _ran_otherwise({100}, tmp_path, topped, set()) == {100}
    assert "sampling.top_k null (now 5)" in caplog.text


def test_a_sweeps_curves_warn_where_its_steps_were_scored_by_different_versions_of_a_task(
    tmp_path: Path, caplog
):
    """Step 100 scored by an older version of gsm8k (the sweep's folder outlived an upgrade): the curves are
    drawn with a warning naming each version's steps (once, though a watch draws them after every batch), and
    the table says which version scored each point."""
    import csv
    import json

    from cluster.sweep.runner import draw_curves
    from evaluators.curves import ErrorBar
    from evaluators.tasks.gsm8k import GSM8K
    from tests.run_folders import write_gsm8k_run

    for step in (100, 200):
        write_gsm8k_run(tmp_path, f"step_{step}", {q: [q % 2] for q in range(4)}, {q: [1] for q in range(4)})
    summary_file = tmp_path / "step_100" / "summary.json"
    summary = json.loads(summary_file.read_text())
    summary["tasks"]["gsm8k"]["version"] = "0.9"
    summary_file.write_text(json.dumps(summary))
    files = draw_curves(tmp_path, "s", ErrorBar.CI95)
    assert draw_curves(tmp_path, "s", ErrorBar.CI95) == files
    now = GSM8K().version
    said = f"gsm8k: the steps scored it with different versions of the task (0.9 at s step 100; {now} at s step 200)"
    assert caplog.text.count(said) == 1
    rows = list(csv.DictReader(files[0].open()))
    assert {(r["step"], r["version"]) for r in rows} == {("100", "0.9"), ("200", now)}


def test_a_steps_settings_are_read_again_once_its_config_is_written_again(tmp_path: Path):
    """A watch asks every finished step's settings at each poll, parsed once per version of the file: a step
    run again with another --limit is seen with it, even where the file keeps its size."""
    import yaml

    from cluster.config import build_config
    from cluster.sweep.step_records import step_settings

    config = tmp_path / "config.yaml"
    for limit, at in ((50, 10**18), (70, 10**18 + 10**9)):  # one size, another modification time
        config.write_text(yaml.safe_dump(build_config({"limit": limit}, {}, "t").model_dump(mode="json")))
        os.utime(config, ns=(at, at))
        assert step_settings(tmp_path)["limit"] == limit
        assert step_settings(tmp_path)["limit"] == limit
    config.unlink()
    assert step_settings(tmp_path) is None
