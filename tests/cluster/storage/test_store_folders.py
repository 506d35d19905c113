"""Run folders on a real S3-compatible server (SeaweedFS on loopback, tests/object_store.py), no engine: the
mirror's journal parts and their assembly on another node, what a pull keeps, the final upload, and every
bad --output-dir ending in exit 2 with one message before anything starts."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from cluster.cli import main
from cluster.config import build_config
from cluster.storage import FolderMirror, RemoteFolder, StorageError, probe_writable, readable_folder
from cluster.storage.folder_lock import FolderInUse, holding
from cluster.sweep import build_sweep_plan
from tests.cluster.models.test_checkpoints import full_model
from tests.object_store import BUCKET, READER, ObjectStore
from tests.ports import free_port

JOURNAL = "cache/completions.jsonl"


@pytest.fixture
def store_env(s3: ObjectStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ObjectStore:
    """This process as the writing node: the store's credentials in its environment, its own cache."""
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RAYEVAL_CACHE", str(tmp_path / "cache-here"))
    return s3


def mirror_at(store: ObjectStore, prefix: str, local: Path) -> FolderMirror:
    return FolderMirror(local, RemoteFolder.parse(store.uri(prefix)))


def test_a_journal_goes_up_in_parts_and_another_node_assembles_it(store_env: ObjectStore, tmp_path: Path):
    here = mirror_at(store_env, "parts/run", tmp_path / "here")
    journal = here.local / JOURNAL
    journal.parent.mkdir(parents=True)
    journal.write_text('{"n": 1}\n{"n": 2}\n')
    (here.local / "config.yaml").write_text("model: m\n")
    (here.local / "samples").mkdir()
    (here.local / "samples" / "t.jsonl").write_text("live\n")
    (here.local / "cache" / ".lock").write_text("")
    assert here.push(final=False) == 2  # the journal's lines, and config.yaml; live samples wait for the end
    with journal.open("a") as handle:
        handle.write('{"n": 3}\n{"n": 4, "half')  # a line still being written stays here
    assert here.push(final=False) == 1
    stored = store_env.read("parts/run")
    assert sorted(stored) == [f"{JOURNAL}.parts/000000000000000-000000000000018",
                              f"{JOURNAL}.parts/000000000000018-000000000000027", "config.yaml"]  # fmt: skip
    assert b"".join(stored[k] for k in sorted(stored) if ".parts/" in k) == b'{"n": 1}\n{"n": 2}\n{"n": 3}\n'

    there = mirror_at(store_env, "parts/run", tmp_path / "there")  # another node: nothing of it local
    assert there.pull() == 2
    assert (there.local / JOURNAL).read_text() == '{"n": 1}\n{"n": 2}\n{"n": 3}\n'
    assert not (there.local / "cache" / ".lock").exists() and not (there.local / "samples").exists()

    with (there.local / JOURNAL).open("a") as handle:  # the resumed run adds, then finishes
        handle.write('{"n": 5}\n')
    (there.local / "summary.json").write_text("{}")
    there.push(final=True)
    stored = store_env.read("parts/run")
    assert sorted(stored) == [JOURNAL, "config.yaml", "summary.json"]  # whole, its parts gone
    assert stored[JOURNAL] == b'{"n": 1}\n{"n": 2}\n{"n": 3}\n{"n": 5}\n'


def test_a_pull_keeps_a_longer_local_journal_and_skips_parts_the_whole_one_holds(
    store_env: ObjectStore, tmp_path: Path
):
    writer = mirror_at(store_env, "keep/run", tmp_path / "writer")
    (writer.local / "cache").mkdir(parents=True)
    (writer.local / JOURNAL).write_text("a\n")
    writer.push(final=False)
    (writer.local / JOURNAL).write_text("a\nb\n")
    writer.push(final=False)
    # a whole journal uploaded, and a crash before its parts were deleted: the parts are inside it
    filesystem = store_env.filesystem()
    with filesystem.open_output_stream(f"{BUCKET}/keep/run/{JOURNAL}") as out:
        out.write(b"a\nb\n")
    fresh = mirror_at(store_env, "keep/run", tmp_path / "fresh")
    fresh.pull()
    assert (fresh.local / JOURNAL).read_text() == "a\nb\n"
    # this node's journal ran ahead of the store (uploads failed): a pull leaves it as it is
    (writer.local / JOURNAL).write_text("a\nb\nc\nd\n")
    again = mirror_at(store_env, "keep/run", writer.local)
    assert again.pull() == 0
    assert (writer.local / JOURNAL).read_text() == "a\nb\nc\nd\n"
    again.push(final=True)
    assert store_env.read("keep/run")[JOURNAL] == b"a\nb\nc\nd\n"


def record(request_id: str, text: str) -> bytes:
    return json.dumps({"request_id": request_id, "text": text}).encode() + b"\n"


def test_a_stale_copy_on_a_node_gives_way_to_the_store_and_adds_only_the_records_it_lacks(
    store_env: ObjectStore, tmp_path: Path
):
    """Node A uploads r0-r2, writes r3-r5 and is killed; node B resumes from the store, generates r3 (its
    own sample) and r6 and finishes; the same command again on A must neither keep A's copy (which lacks
    r6) nor splice it after the store's bytes (a torn line, r6 dropped), nor give r3 a second record."""
    node_a = mirror_at(store_env, "stale/run", tmp_path / "a")
    (node_a.local / "cache").mkdir(parents=True)
    (node_a.local / JOURNAL).write_bytes(b"".join(record(f"r{i}", "a") for i in range(3)))
    node_a.push(final=False)
    with (node_a.local / JOURNAL).open("ab") as journal:
        journal.write(b"".join(record(f"r{i}", "a, longer than b's") for i in range(3, 6)))
    node_b = mirror_at(store_env, "stale/run", tmp_path / "b")
    node_b.pull()
    with (node_b.local / JOURNAL).open("ab") as journal:
        journal.write(record("r3", "b") + record("r6", "b"))
    node_b.push(final=True)

    again = mirror_at(store_env, "stale/run", node_a.local)
    assert again.pull() == 1
    lines = (node_a.local / JOURNAL).read_bytes().splitlines()
    records = [json.loads(line) for line in lines]  # every line readable
    assert [(r["request_id"], r["text"]) for r in records] == [
        ("r0", "a"), ("r1", "a"), ("r2", "a"), ("r3", "b"), ("r6", "b"),
        ("r4", "a, longer than b's"), ("r5", "a, longer than b's"),
    ]  # fmt: skip
    again.push(final=False)  # the records the store lacked go up as a part after its bytes
    assembled = mirror_at(store_env, "stale/run", tmp_path / "c")
    assembled.pull()
    assert (assembled.local / JOURNAL).read_bytes() == (node_a.local / JOURNAL).read_bytes()


def test_two_stores_with_one_bucket_and_prefix_stage_apart_and_their_records_never_mix(
    store_env: ObjectStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """Two S3-compatible stores told apart by AWS_ENDPOINT_URL alone, each with a run at the same s3:// URI:
    a node that reads one, then the other, stages each in its own folder. One folder for both made the
    second pull merge the first store's staged records into the second's journal."""
    from tests.object_store import object_store

    monkeypatch.setenv("RAYEVAL_STAGING_DIR", str(tmp_path / "staging"))
    uri = store_env.uri("twin/run")
    journal = f"{BUCKET}/twin/run/{JOURNAL}"
    with store_env.filesystem().open_output_stream(journal) as out:
        out.write(record("a0", "first store") + record("a1", "first store"))
    first = readable_folder(uri)
    with object_store(tmp_path / "second-store") as other:
        with other.filesystem().open_output_stream(journal) as out:
            out.write(record("b0", "second store"))
        monkeypatch.setenv("AWS_ENDPOINT_URL", other.endpoint)
        second = readable_folder(uri)
        assert (second / JOURNAL).read_bytes() == record("b0", "second store")
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", store_env.endpoint)  # the S3 one wins, as in AWS's SDK
        assert readable_folder(uri) == first
    assert first != second and first.is_relative_to(tmp_path / "staging" / "s3")
    assert (first / JOURNAL).read_bytes() == record("a0", "first store") + record("a1", "first store")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # AWS itself: the URI's own path, as before
    assert RemoteFolder.parse(uri).staging == tmp_path / "staging" / "s3" / BUCKET / "twin" / "run"
    named = RemoteFolder.parse(f"{uri}?endpoint_override=localhost:1").staging  # the URI names its store
    assert named.parent.parent.parent.name.startswith("query-") and "endpoint-" not in str(named)


def test_a_sweep_on_the_store_moves_a_saved_again_checkpoints_folder_aside_there_too(
    store_env: ObjectStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """A full checkpoint's requests are named by its folder: a trainer that saves step 100 again (restarted
    from an earlier step) must not have the new weights answered from the old journal. On object storage the
    store's step folder is moved aside (kept whole, under step_100.replaced-TIME) by the next sweep, from any
    node: left there, the step's pull would bring the old answers back. The step's run itself is not started
    here (test_full_sweep runs the same on a local folder with engines)."""
    from cluster.storage import local_copy
    from cluster.sweep.runner import _answers_these_weights
    from cluster.sweep.step_records import WEIGHTS_RECORD, weights_state

    checkpoint = full_model(tmp_path / "train" / "step_100")  # files enough for a plan: no engine starts
    (checkpoint / "tokenizer.json").write_text("{}")
    settings = build_config({"tasks": ["ifeval"], "output_dir": store_env.uri("resaved")}, {}, "the test")

    def step_here(node: str):  # noqa: ANN202 - the sweep's one step, as a sweep on `node` reads it first
        monkeypatch.setenv("RAYEVAL_STAGING_DIR", str(tmp_path / node))
        plan = build_sweep_plan(settings, checkpoint.parent, materialise_model=False)
        local_copy(plan.remote)
        return plan.steps[0], plan.root / "step_100"

    step, staged = step_here("node-a")
    _answers_these_weights(step)  # the first sweep: the record of the files answered, then the step's run
    (staged / "cache").mkdir()
    (staged / JOURNAL).write_bytes(record("r0", "old weights"))
    (staged / "summary.json").write_text("{}")
    mirror_at(store_env, "resaved/sweep-train/step_100", staged).push(final=True)

    (checkpoint / "model.safetensors").write_bytes(b"new weights")  # saved again
    step, staged = step_here("node-b")  # another node, nothing staged
    assert json.loads((staged / WEIGHTS_RECORD).read_text()) != weights_state(checkpoint)
    _answers_these_weights(step)
    stored = store_env.read("resaved/sweep-train")
    [aside] = {name.split("/")[0] for name in stored if name.startswith("step_100.replaced-")}
    assert stored[f"{aside}/{JOURNAL}"] == record("r0", "old weights") and f"{aside}/summary.json" in stored
    assert not [name for name in stored if name.startswith("step_100/")]  # the step's pull brings nothing
    assert sorted(p.name for p in staged.iterdir()) == [WEIGHTS_RECORD]  # the new files' record only
    assert json.loads((staged / WEIGHTS_RECORD).read_text()) == weights_state(checkpoint)
    assert (staged.parent / aside / JOURNAL).is_file()  # the staged copy kept too


def test_a_pull_leaves_the_files_of_a_folder_a_run_on_this_node_is_writing(
    store_env: ObjectStore, tmp_path: Path
):
    """compare/plot/view (or a sweep's reader) pulling a store's folder on the node where a run writes one of
    its run folders must not put the store's older files over the live ones."""
    writer = mirror_at(store_env, "live/sweep", tmp_path / "first")
    for step in ("step_1", "step_2"):
        (writer.local / step).mkdir(parents=True)
        (writer.local / step / "summary.json").write_text(f'{{"{step}": "as uploaded"}}')
    writer.push(final=True)
    node = mirror_at(store_env, "live/sweep", tmp_path / "node")
    (node.local / "step_1").mkdir(parents=True)
    (node.local / "step_1" / "summary.json").write_text('{"step_1": "being written"}')
    with holding(node.local / "step_1"):
        assert node.pull() == 1  # step_2 only
        assert (node.local / "step_1" / "summary.json").read_text() == '{"step_1": "being written"}'
        assert (node.local / "step_2" / "summary.json").read_text() == '{"step_2": "as uploaded"}'
        with pytest.raises(FolderInUse):  # a second run over it: refused
            with holding(node.local / "step_1"):
                pass
    assert node.pull() == 1  # once the run is gone, the store's copy comes


def test_a_run_over_a_folder_in_use_is_refused_before_its_config_changes(tmp_path: Path, shared_gsm8k: Path):
    from cluster.config import RunConfig
    from cluster.plan import build_plan
    from cluster.run.coordinator import run_evaluation
    from evaluators.errors import EvalInputError

    folder = tmp_path / "runs" / "r1"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("sampling: {temperature: 0.0}\n")
    config = RunConfig.model_validate(
        {"output_dir": str(tmp_path / "runs"), "run_id": "r1", "tasks": [{"name": "gsm8k", "data_path": str(shared_gsm8k)}],
         "sampling": {"temperature": 0.7}}
    )  # fmt: skip
    with holding(folder), pytest.raises(EvalInputError, match="in use by another rayeval process"):
        run_evaluation(build_plan(config))
    assert (folder / "config.yaml").read_text() == "sampling: {temperature: 0.0}\n"


def test_the_probe_leaves_nothing_and_explains_a_store_that_refuses(s3: ObjectStore, monkeypatch, tmp_path):
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    probe_writable(RemoteFolder.parse(s3.uri("probed")))
    assert s3.read("probed") == {}
    with pytest.raises(StorageError, match="the bucket 'no-such-bucket' does not exist"):
        probe_writable(RemoteFolder.parse("s3://no-such-bucket/runs"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", READER[0])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", READER[1])
    with pytest.raises(StorageError, match="access denied while writing a probe object"):
        probe_writable(RemoteFolder.parse(s3.uri("probed")))
    monkeypatch.setenv("RAYEVAL_CACHE", str(tmp_path))
    with pytest.raises(StorageError, match="holds no files"):
        readable_folder(s3.uri("nothing-here"))


BAD_OUTPUT_DIRS = [
    ("missing-bucket", "s3://no-such-bucket/runs", {}, ["bucket 'no-such-bucket' does not exist", "aws s3 mb"]),
    ("read-only-key", f"s3://{BUCKET}/runs", {"AWS_ACCESS_KEY_ID": READER[0], "AWS_SECRET_ACCESS_KEY": READER[1]},
     ["access denied while writing a probe object", "credentials found on node"]),
    ("unreachable", f"s3://{BUCKET}/runs", {"AWS_ENDPOINT_URL": "http://127.0.0.1:{closed}"},
     ["cannot be reached", "AWS_ENDPOINT_URL"]),
    ("key-in-uri", f"s3://AKIA:secret@{BUCKET}/runs", {}, ["carries a credential (s3://USER:...@...)", "~/.aws"]),
    ("key-in-query", f"s3://{BUCKET}/runs?secret_key=abc", {}, ["carries a credential (its query's secret_key)", "~/.aws"]),
    ("unknown-scheme", "nosuchfs://bucket/runs", {}, ["neither pyarrow nor fsspec can open"]),
    ("no-bucket", "s3://", {}, ["names no bucket"]),
    ("one-slash", f"s3:/{BUCKET}/runs", {}, ["two slashes after its scheme", f"Write s3://{BUCKET}/runs"]),
    ("file-uri-with-host", "file://runs", {}, ["names the host 'runs'", "file:///abs/path"]),
    ("s3-without-bucket", "s3:///runs", {}, ["pyarrow cannot read this s3:// URI", "s3://BUCKET/PREFIX"]),
]  # fmt: skip


def test_an_upper_case_scheme_is_the_store_and_an_upper_case_file_uri_a_local_folder(store_env: ObjectStore):
    from cluster.storage.location import local_path, output_location

    assert output_location(f"S3://{BUCKET}/Runs/") == f"s3://{BUCKET}/Runs"
    assert local_path("FILE:///tmp/runs") == Path("/tmp/runs")


@pytest.mark.parametrize("case", BAD_OUTPUT_DIRS, ids=[c[0] for c in BAD_OUTPUT_DIRS])
def test_a_bad_output_uri_exits_2_before_anything_starts(
    case, s3: ObjectStore, monkeypatch, capsys, tmp_path
):
    _, uri, env, fragments = case
    for name, value in {**s3.env(), **env}.items():
        monkeypatch.setenv(name, value.format(closed=free_port()))
    monkeypatch.setenv("RAYEVAL_CACHE", str(tmp_path))
    try:
        code = main(shlex.split(f"run --dry-run --limit 2 --output-dir '{uri}'"))
    except SystemExit as exit_info:
        code = int(exit_info.code or 0)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("rayeval: error:")]
    assert code == 2 and len(errors) == 1, err
    for fragment in fragments:
        assert fragment in errors[0], f"{fragment!r} not in {errors[0]!r}"
    assert "secret" not in errors[0] or "secret_key" in errors[0]
    assert not list(tmp_path.rglob("config.yaml"))  # nothing was written for the run
