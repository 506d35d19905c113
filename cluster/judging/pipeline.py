"""The judging half of a run with judged tasks, wired up: the judge backend, its cache and folder, the judged
samples and the judge runner, started beside generation so judging begins on the first finished outputs."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from cluster.judging.backends import JudgeIdentity, build_judge_backend
from cluster.judging.rules import core_slots
from cluster.judging.runner import JudgeRunner
from cluster.judging.samples import JudgedSamples
from cluster.plan import RunPlan
from cluster.progress import progress_bar
from evaluators.errors import EvalInputError
from evaluators.failures import FailureKind
from evaluators.judging.base import JudgeTask
from evaluators.verdicts import JUDGE_FILE, recorded_spec
from sharding.store import ResultStore, StoreInUse

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JudgePaths:
    """One judge's folder inside a run folder (`judges/JUDGE/`)."""

    root: Path

    @property
    def cache(self) -> Path:
        return self.root / "cache" / "judgments.jsonl"

    @property
    def samples(self) -> Path:
        return self.root / "samples"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"


@dataclass
class JudgePipeline:
    """The judging half of a run with judged tasks: bookkeeping, the judge loop and its cache."""

    samples: JudgedSamples
    runner: JudgeRunner
    store: ResultStore
    paths: JudgePaths

    @property
    def directory(self) -> Path:
        return self.paths.root

    def close(self, completed: bool) -> None:
        """Stop judging: after the last answer when the run completed, at once when it was interrupted
        (answers already cached stay cached)."""
        self.runner.finish(timeout_s=None if completed else 0)
        self.samples.close()
        self.store.close()


def own_identity(judges_root: Path, identity: JudgeIdentity) -> JudgeIdentity:
    """The judge's identity in this run folder: as it is, unless a judge of the same name and another spec
    (another endpoint, or another folder of that name) judged the run before: then its name and folder get
    a digest of its spec (`local:final#3fa2c1d0`), so neither judge's verdicts overwrite or pass for the
    other's. The folder records the identity it holds (`judge.json`)."""
    folder = judges_root / identity.slug
    recorded = recorded_spec(folder)
    if recorded is not None and recorded != identity.spec:
        digest = hashlib.sha256(identity.spec.encode()).hexdigest()[:8]
        identity = JudgeIdentity(identity.spec, f"{identity.name}#{digest}", f"{identity.slug}-{digest}")
        folder = judges_root / identity.slug
    folder.mkdir(parents=True, exist_ok=True)
    (folder / JUDGE_FILE).write_text(json.dumps({"name": identity.name, "spec": identity.spec}) + "\n")
    return identity


def start_judging(plan: RunPlan, judges_root: Path, verbose: bool) -> JudgePipeline | None:
    """The judge pipeline of a run with judged tasks, started (None without any); its folder goes under
    `judges_root`, named after the judge."""
    judged = [t for t in plan.tasks if isinstance(t.task, JudgeTask)]
    if not judged:
        return None
    config = plan.config
    backend = build_judge_backend(config, plan.device, plan.replica, verbose, core_slots(plan, judge=True))
    backend.identity = own_identity(judges_root, backend.identity)
    paths = JudgePaths(judges_root / backend.identity.slug)
    try:
        store = ResultStore(paths.cache)
    except StoreInUse:
        raise EvalInputError(
            f"The judge folder {paths.root} is in use by another rayeval process; wait for it or use another judge."
        ) from None
    samples = JudgedSamples(
        backend, config.judge.max_tokens, config.judge.temperature, paths.samples, judged,
        config.model.think_end_token,
    )  # fmt: skip
    runner = JudgeRunner(
        backend, store, samples.on_answer, second_pass_pause_s=config.judge.second_pass_pause_s
    )
    samples.submit = runner.submit
    runner.start(eager=len(store) == 0)
    log.info(
        "judge %s: judging starts with the first finished outputs (cache %s)",
        backend.identity.name,
        store.path,
    )
    return JudgePipeline(samples, runner, store, paths)


def wait_for_judging(pipeline: JudgePipeline, progress: bool) -> None:
    """Until every judged sample has its verdicts (a progress bar if asked); unanswered ones fail."""
    if pipeline.samples.unfinished and progress:
        _, total = pipeline.runner.progress()
        bar = progress_bar("judging", enabled=True)
        with bar:
            job = bar.add_task("judging", total=total)
            while pipeline.samples.unfinished:
                answered, total = pipeline.runner.progress()
                bar.update(job, completed=answered, total=total)
                time.sleep(0.2)
            bar.update(job, completed=total, total=total)
    pipeline.runner.finish()
    pipeline.samples.fail_unanswered(
        FailureKind.JUDGE_UNANSWERED.error("judging stopped before this sample's verdicts came back")
    )
    if pipeline.runner.write_error is not None:
        raise pipeline.runner.write_error
