"""Two judges of one name (one model name at two endpoints, two folders called `final`) are never taken for
one: within a run each keeps its own folder and name, and `compare` refuses to pair their verdicts. Plain."""

from __future__ import annotations

import json

from cluster.cli import main
from cluster.judging.backends import JudgeIdentity
from cluster.judging.pipeline import own_identity
from tests.run_folders import write_judged_run


def test_a_second_judge_of_one_name_gets_its_own_folder_and_name(tmp_path):
    first = JudgeIdentity("openai:judge@http://10.0.0.1:8000/v1", "openai:judge", "openai-judge")
    assert own_identity(tmp_path, first) == first  # a new folder: as it is, recorded
    assert json.loads((tmp_path / "openai-judge" / "judge.json").read_text())["spec"] == first.spec
    assert own_identity(tmp_path, first) == first  # the same judge again: its own folder
    other = JudgeIdentity("openai:judge@https://other.example/v1", "openai:judge", "openai-judge")
    second = own_identity(tmp_path, other)
    assert second.spec == other.spec and second.name.startswith("openai:judge#")
    assert second.slug == f"openai-judge-{second.name.partition('#')[2]}"
    assert json.loads((tmp_path / "openai-judge" / "judge.json").read_text())["spec"] == first.spec  # kept


def test_compare_refuses_two_runs_judged_by_one_name_at_two_endpoints(tmp_path, capsys):
    wins = {q: [2, q % 3] for q in range(6)}
    a = write_judged_run(tmp_path, "a", {"openai:judge": wins})
    b = write_judged_run(tmp_path, "b", {"openai:judge": wins})
    for run, endpoint in ((a, "http://10.0.0.1:8000/v1"), (b, "https://other.example/v1")):
        folder = run / "judges" / "openai-judge"
        (folder / "judge.json").write_text(
            json.dumps({"name": "openai:judge", "spec": f"openai:judge@{endpoint}"})
        )
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert "judged by openai:judge (openai:judge@http://10.0.0.1:8000/v1) in A (a)" in err
    assert "--allow-different-judges" in err
    (b / "judges" / "openai-judge" / "judge.json").write_text(
        json.dumps({"name": "openai:judge", "spec": "openai:judge@http://10.0.0.1:8000/v1"})
    )
    assert main(["compare", str(a), str(b)]) == 0  # the same judge: compared


def test_plot_refuses_steps_judged_by_one_name_at_two_endpoints(tmp_path, capsys):
    """As compare: one judge name at two endpoints is two judges, and a curve over both would mix them; a
    step whose folder records no spec (an earlier version's) is taken as that name's judge."""
    wins = {q: [2, q % 3] for q in range(6)}
    steps = {
        step: write_judged_run(tmp_path / "sft", f"step_{step}", {"openai:judge": wins}) for step in (1, 2, 3)
    }
    for step, endpoint in ((1, "http://10.0.0.1:8000/v1"), (2, "https://other.example/v1")):
        (steps[step] / "judges" / "openai-judge" / "judge.json").write_text(
            json.dumps({"name": "openai:judge", "spec": f"openai:judge@{endpoint}"})
        )
    out = tmp_path / "plots"
    assert main(["plot", str(tmp_path / "sft"), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "alpaca_eval: the runs' judges share a name but were different judges (" in err
    assert (
        "openai:judge@http://10.0.0.1:8000/v1 at sft step 1; openai:judge@https://other.example/v1 at sft step 2"
        in err
    )
    assert main(["plot", str(tmp_path / "sft"), "--output", str(out), "--allow-different-judges"]) == 0
    (steps[2] / "judges" / "openai-judge" / "judge.json").unlink()
    assert main(["plot", str(tmp_path / "sft"), "--output", str(out)]) == 0  # step 3 and 2 record no spec
