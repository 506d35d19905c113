"""The evaluator's coordinator: a Ray actor on the trainer's node that owns the replicas and the step folders,
and runs the trainer's requests (start, push, evaluate, close) one at a time in the order the trainer made
them, in a thread of its own, so the trainer only waits for its tensors to be copied.

It outlives the trainer on a `ray start` cluster (a detached actor): a trainer that dies leaves the steps it
asked for in the queue, and the coordinator finishes them, stops its engines and exits. A push's tensors
become this actor's own object as soon as the call arrives (the trainer's copies are then released), so
a queued push survives the trainer too.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import ray

from cluster.config import RunConfig
from cluster.engines.pushed_weights import in_dtype, pack, write_files
from cluster.errors import ClusterError
from cluster.plan import RunPlan, build_plan
from cluster.run import SharedReplicas, run_evaluation
from cluster.run.paths import set_aside
from cluster.sweep import draw_curves
from evaluators.curves import ErrorBar, points_from_run

log = logging.getLogger(__name__)

NAMESPACE = "rayeval"
TRAINER_POLL_S = 1.0
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


def coordinator_name(root: Path) -> str:
    return f"rayeval-training-{root.name}"


@dataclass(frozen=True)
class PushReport:
    """What the replicas did with one push (wall-clock times, `time.time()`)."""

    step: int
    began_at: float  # the coordinator began loading it (after the jobs queued before it)
    serving_at: float  # every replica serves the step's weights from now on (an adapter: can load it)
    megabytes: float
    replicas: int


@dataclass(frozen=True)
class StepReport:
    """One evaluated step: its run folder and its metrics (one row per task and metric)."""

    step: int
    run_dir: str
    rows: list[dict[str, Any]]
    requests: int
    requests_generated: int
    began_at: float
    finished_at: float


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=64)
class TrainingCoordinator:
    def __init__(
        self,
        config: dict[str, Any],
        device: str,
        root: str,
        lora: bool,
        trainer_pid: int,
        verbose: bool,
    ) -> None:
        self.config = RunConfig.model_validate(config)
        self.plan: RunPlan = build_plan(self.config, device=device)
        self.root = Path(root)
        self.series = self.root.name
        self.lora = lora
        self.shared = SharedReplicas(self.plan, verbose=verbose, lora=lora, max_loras=2 if lora else 1)
        self.jobs = ThreadPoolExecutor(1, thread_name_prefix="rayeval-training")
        self.order = threading.Condition()
        self.next_job = 0
        self.results: dict[int, Future[Any]] = {}
        self.adapters: dict[int, Any] = {}  # step -> its pushed adapter (sharding.requests.Adapter)
        self.pushed_megabytes: dict[int, float] = {}
        self.loaded_from: dict[int, str] = {}  # step -> the saved checkpoint the replicas moved to
        self.closed = False
        self.failed_pushes: dict[int, str] = {}  # step -> why its weights did not reach the replicas
        self.engine_dtype: str | None = None  # the engines' weights' dtype, once they have started
        threading.Thread(
            target=self._outlive, args=(trainer_pid,), name="rayeval-trainer-watch", daemon=True
        ).start()

    def _enqueue(self, job: int, work: Any, *args: Any) -> None:
        """Queue `work` for the job thread once every job numbered before `job` is queued (a job that comes
        after the coordinator began stopping fails with the reason)."""
        with self.order:
            self.order.wait_for(lambda: self.next_job == job)
            try:
                self.results[job] = self.jobs.submit(work, *args)
            except RuntimeError:  # the job thread is shut down: the trainer died or close() ran
                stopped: Future[Any] = Future()
                stopped.set_exception(
                    ClusterError("The evaluator's coordinator is stopping: nothing new runs.")
                )
                self.results[job] = stopped
            self.next_job += 1
            self.order.notify_all()

    def result(self, job: int) -> Any:
        """What job `job` returned, once it has run (its error, raised, where it failed)."""
        with self.order:
            self.order.wait_for(lambda: job in self.results)
            future = self.results.pop(job)
        return future.result()

    def start(self, job: int) -> None:
        """Start the replicas on the base model (`result` gives their `EngineInfo`s as dicts)."""
        self._enqueue(job, self._start)

    def _start(self) -> list[dict[str, Any]]:
        _, infos = self.shared.replicas_for(self.plan.model.path)
        self.engine_dtype = infos[0].dtype if infos else None
        return [asdict(info) for info in infos]

    def push_weights(self, job: int, step: int, chunks: list[ray.ObjectRef]) -> None:
        """Take the trainer's tensors into this actor's own object (the trainer's copies are released when this
        call returns, and a trainer that dies later loses nothing queued), then queue their load."""
        try:
            # in the engines' dtype once they have started (what they would round to anyway)
            blobs = [pack(in_dtype(part, self.engine_dtype)) for part in ray.get(chunks)]
            megabytes = sum(map(len, blobs)) / 1e6
            owned = ray.put(blobs)
        except Exception as exc:  # noqa: BLE001 - the job reports it to the trainer's handle
            self._enqueue(job, self._failed, step, f"{type(exc).__name__}: {exc}")
            return
        self._enqueue(job, self._pushed, step, self._push_weights, owned, megabytes)

    def _failed(self, step: int, reason: str) -> None:
        """A step whose weights did not reach every replica: its evaluation is refused (the replicas serve
        the previous step's weights, or a mix), and the push's handle raises."""
        self.failed_pushes[step] = reason
        raise ClusterError(f"Step {step}'s weights did not reach the replicas: {reason}")

    def _pushed(self, step: int, load: Any, *args: Any) -> PushReport:
        """Run a push job, remembering a failure so that the step is not evaluated on other weights."""
        try:
            return load(step, *args)
        except Exception as exc:
            self.failed_pushes[step] = f"{type(exc).__name__}: {exc}"
            raise

    def _push_weights(self, step: int, packed: ray.ObjectRef, megabytes: float) -> PushReport:
        began = time.time()
        infos = self.shared.push_weights(packed, self._label(step))
        self.pushed_megabytes[step] = megabytes
        return PushReport(step, began, time.time(), megabytes, len(infos))

    def push_adapter(self, job: int, step: int, files: dict[str, bytes]) -> None:
        self._enqueue(job, self._pushed, step, self._push_adapter, files)

    def _push_adapter(self, step: int, files: dict[str, bytes]) -> PushReport:
        """The adapter's files written under the folder's adapters/ on every replica's node (vLLM loads an
        adapter from a folder); the step's requests carry it, and vLLM loads it at their first one."""
        from cluster.models import load_adapter

        began = time.time()
        folder = self.root / "adapters" / f"step_{step}"
        self.shared.stage_files(str(folder), files)  # every replica's node
        write_files(str(folder), files)  # and this one, whose copy the adapter's digest is read from
        self.adapters[step] = load_adapter(
            str(folder), Path(self.plan.model.path), self.config.model.max_lora_rank
        )
        megabytes = sum(len(data) for data in files.values()) / 1e6
        self.pushed_megabytes[step] = megabytes
        return PushReport(step, began, time.time(), megabytes, len(self.shared.pool.actors))

    def load_checkpoint(self, job: int, step: int, folder: str) -> None:
        self._enqueue(job, self._pushed, step, self._load_checkpoint, folder)

    def _load_checkpoint(self, step: int, folder: str) -> PushReport:
        """The replicas moved to a saved checkpoint in place, as a sweep moves them (`SharedReplicas`)."""
        began = time.time()
        if self.shared.pool is None:  # started, if this is the first job
            self.shared.replicas_for(self.plan.model.path)
        infos = self.shared.move_to(folder)
        self.pushed_megabytes[step] = 0.0
        self.loaded_from[step] = folder
        return PushReport(step, began, time.time(), 0.0, len(infos))

    def evaluate(self, job: int, step: int) -> None:
        self._enqueue(job, self._evaluate, step)

    def _evaluate(self, step: int) -> StepReport:
        if step in self.failed_pushes:
            raise ClusterError(f"Step {step} is not evaluated: its weights did not reach the replicas "
                               f"({self.failed_pushes[step]}).")  # fmt: skip
        began = time.time()
        plan = self._step_plan(step)
        folder = self.root / f"step_{step}"
        if folder.is_dir() and not (folder / "summary.json").is_file():
            # an unfinished step of an earlier evaluator: its journal answered other weights (a request's
            # identity names the base model, not the weights pushed), so none of it is reused
            log.warning("step %d: the unfinished run folder %s is started again", step, folder)
            shutil.rmtree(folder)
        elif folder.is_dir():  # finished by an earlier evaluator, on the weights it was given then
            log.warning("step %d: evaluated again on the weights given now; the earlier run folder is kept as "
                        "%s", step, set_aside(folder))  # fmt: skip
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "weights.json").write_text(json.dumps(self._weights_record(step), indent=2) + "\n")
        result = run_evaluation(plan, progress=False, shared=self.shared)
        if self.config.log_to:  # one tracker run for the training, each step at its step, as a sweep's
            from cluster.exporters import log_run

            log_run(self.config.log_to, result.run_dir, self.root.name, step)
        draw_curves(self.root, self.series, ErrorBar.CI95)
        rows = [
            asdict(point) for point in points_from_run(result.run_dir, self.series, step, latest_judge=True)
        ]
        return StepReport(step, str(result.run_dir), rows, result.requests_total,
                          result.requests_total - result.requests_reused, began, time.time())  # fmt: skip

    def _label(self, step: int) -> str:
        return f"{self.plan.model.name}-step{step}"

    def _step_plan(self, step: int) -> RunPlan:
        """The base plan run in the step's folder, on the weights (or with the adapter) pushed for it."""
        config = self.config.model_copy(deep=True)
        config.output_dir = str(self.root)
        config.run_id = f"step_{step}"
        config.log_to = []  # logged by `_evaluate`, at the step, into the training's own tracker run
        adapter = self.adapters.get(step)
        if adapter is not None:
            config.model.lora = adapter.path
            return replace(self.plan, config=config, adapter=adapter)
        # the folder the replicas were started on or last moved to: a run on it moves nothing
        serving = self.shared.pool.settings.model if self.shared.pool is not None else self.plan.model.path
        label = self._label(step) if step in self.pushed_megabytes else self.plan.model.name
        return replace(self.plan, config=config, model=replace(self.plan.model, name=label, path=serving))

    def _weights_record(self, step: int) -> dict[str, Any]:
        """What the step's run folder evaluated, which its config.yaml (the base model's) cannot say."""
        if step in self.adapters:
            source = f"LoRA adapter pushed by the trainer, saved in {self.adapters[step].path}"
        elif step in self.loaded_from:
            source = f"the checkpoint saved in {self.loaded_from[step]}"
        elif step in self.pushed_megabytes:
            source = "weights pushed by the trainer in memory"
        else:
            source = "the base model's own weights (nothing pushed before this step)"
        return {"step": step, "base_model": self.plan.model.path, "weights": source,
                "megabytes": self.pushed_megabytes.get(step, 0.0)}  # fmt: skip

    def engines(self) -> list[dict[str, Any]]:
        """The replicas' `EngineInfo`s now (what each serves and how it got there), as dicts."""
        pool = self.shared.pool
        return [asdict(info) for info in pool.infos] if pool is not None else []

    def close(self, job: int) -> None:
        """Stop the replicas once every job queued before this one is done."""
        self._enqueue(job, self._close)

    def _close(self) -> None:
        if not self.closed:
            self.closed = True
            self.shared.close()

    def _outlive(self, trainer_pid: int) -> None:
        """A trainer that dies: the jobs it queued are finished, then the engines stop and this actor exits."""
        import psutil

        while psutil.pid_exists(trainer_pid) and not self.closed:
            time.sleep(TRAINER_POLL_S)
        if self.closed:
            return
        log.warning(
            "the trainer (pid %d) is gone: finishing the steps it asked for, then exiting", trainer_pid
        )
        time.sleep(TRAINER_POLL_S)  # calls already on their way from the trainer reach their queue first
        with self.order:
            self.jobs.shutdown(wait=True)  # every queued job runs to its end
        self._close()
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
