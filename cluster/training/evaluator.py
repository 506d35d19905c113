"""`cluster.Evaluator`: a training loop's evaluations, with weights taken straight from the trainer.

    ev = cluster.Evaluator({"model": {"path": BASE}, "tasks": ["ifeval"], "limit": 64, "output_dir": "evals"})
    for step in ...:
        train_step()
        ev.push_weights(step, model.state_dict())   # returns once the tensors are copied
        ev.evaluate(step)                            # a handle; the loop goes on
    print(ev.curve())
    ev.close()

The engines run on replicas of the base model that this evaluator starts and owns (a warm pool is shared by
other runs, whose answers a push would change). A push copies the tensors into Ray's object store and
returns; the replicas load them in place (vLLM's own reload, no file) once the jobs queued before it are
done. Jobs run in the order they were asked for, one at a time: a push made while an evaluation runs waits
in the queue, since moving the weights under a running step would mix two steps in one step's numbers. At
most `max_queued_pushes` pushes wait at once (each holds a copy of the weights); a push beyond that blocks
the trainer until the oldest is served.

The folder is a sweep's: `<output_dir>/<run_id>/step_<N>` run folders with the curves beside them, so
`rayeval plot` and `rayeval compare` read it. On a `ray start` cluster the coordinator outlives a trainer
that dies: it finishes the steps already asked for, then stops its engines.
"""

from __future__ import annotations

import itertools
import os
import time
from collections import deque
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, wait
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cluster.config import LORA_RANKS, RunConfig, build_config
from cluster.engines.pushed_weights import RawTensor, raw_tensor
from cluster.plan import build_plan
from cluster.preflight import preflight
from cluster.session import cluster_has_gpus, ray_session
from cluster.storage.location import is_remote, local_path
from cluster.training.weights import ModelTensors, named_tensors
from evaluators.errors import EvalInputError

if TYPE_CHECKING:
    import pandas as pd

    from cluster.training.coordinator import PushReport, StepReport

CHUNK_BYTES = 512 * 1024 * 1024  # one object in Ray's object store holds tensors up to this size
MAX_QUEUED_PUSHES = 8


@dataclass
class PushHandle:
    """A push on its way: the trainer got control back at `returned_at`; `result()` waits until every
    replica serves the weights and gives the coordinator's `PushReport`."""

    step: int
    called_at: float  # wall clock (time.time()) when push_weights was called
    returned_at: float  # when it returned to the trainer: the tensors were copied by then
    future: Future[PushReport] = field(repr=False)

    @property
    def trainer_blocked_s(self) -> float:
        return self.returned_at - self.called_at

    def done(self) -> bool:
        return self.future.done()

    def result(self, timeout: float | None = None) -> PushReport:
        return self.future.result(timeout)


@dataclass
class EvaluationHandle:
    """A step's evaluation on its way; `result()` waits for its `StepResult`."""

    step: int
    future: Future[StepReport] = field(repr=False)

    def done(self) -> bool:
        return self.future.done()

    def result(self, timeout: float | None = None) -> StepResult:
        return StepResult(self.future.result(timeout))


class StepResult:
    """One step's results: its run folder and its table (task, metric, mean, sem, ci95, n per row)."""

    def __init__(self, report: StepReport) -> None:
        self.report = report
        self.step = report.step
        self.run_dir = Path(report.run_dir)
        self.requests = report.requests
        self.requests_generated = report.requests_generated

    @property
    def table(self) -> pd.DataFrame:
        return _frame(self.report.rows)


class Evaluator:
    def __init__(
        self,
        config: RunConfig | dict[str, Any],
        *,
        resume: bool = False,
        lora_rank: int | None = None,
        max_queued_pushes: int = 2,
        verbose: bool = False,
    ) -> None:
        """Check the config, join (or start) the Ray cluster and start the replicas of its base model in the
        background; the first push or evaluation waits for them. `lora_rank`: engines with LoRA layers of up
        to that rank, for `push_adapter`. `resume`: keep the finished steps of an earlier evaluator in the
        folder (a restarted training run); without it such a folder is refused."""
        run_config = (
            config if isinstance(config, RunConfig) else build_config(config, {}, "the Evaluator's config")
        )
        _check_arguments(lora_rank, max_queued_pushes)
        if lora_rank is not None:
            run_config = run_config.model_copy(deep=True)
            run_config.model.max_lora_rank = lora_rank
        self.lora_rank = lora_rank
        plan = _checked_plan(run_config)
        self.root = local_path(run_config.output_dir) / (run_config.run_id or f"train-{plan.model.name}")
        _check_folder(self.root, resume)
        self.tensors = ModelTensors.of_checkpoint(Path(plan.model.path), plan.model.name)
        # each waiting job holds one of the coordinator's threads until it runs
        self.max_queued_pushes = max_queued_pushes
        self._session = ExitStack()
        replicas = run_config.cluster.replicas
        self._session.enter_context(ray_session(run_config.cluster.address, plan.replica, replicas, verbose))
        try:
            self._coordinator = _start_coordinator(run_config, plan.device, self.root, lora_rank, verbose)
        except BaseException:
            self._session.close()
            raise
        self._jobs = itertools.count()
        self._submitted: list[Any] = []  # the calls that queue each job, until `delivered` has seen them
        self._started = self._call("start")
        self._dtype: str | None = None  # the replicas' dtype, read once they have started
        self._weights_step = 0  # the step whose weights the replicas will serve once the queue is done
        self._evaluated: set[int] = set()
        self._pushes: deque[PushHandle] = deque()  # those that may still be waiting (back-pressure)
        self._pushed_all: list[PushHandle] = []  # every push asked for, for `wait`
        self._evaluations: list[EvaluationHandle] = []

    def _call(self, method: str, *args: Any) -> Any:
        """Queue a job on the coordinator; the reference to its result."""
        import ray

        job = next(self._jobs)
        self._submitted.append(getattr(self._coordinator, method).remote(job, *args))
        if len(self._submitted) > 64:  # keep only the calls not yet in the coordinator's queue
            _, self._submitted = ray.wait(self._submitted, num_returns=len(self._submitted), timeout=0)
        return self._coordinator.result.remote(job)

    def delivered(self, timeout: float | None = None) -> None:
        """Wait until every push and evaluation asked for so far is in the coordinator's queue (Ray sends a
        call in the background): from then on a trainer that dies leaves them to be finished."""
        import ray

        self._check_open("delivered()")
        ray.get(self._submitted, timeout=timeout)
        self._submitted.clear()

    def push_weights(
        self, step: int, weights: Mapping[str, Any] | Iterable[tuple[str, Any]], *, partial: bool = False
    ) -> PushHandle:
        """Hand the replicas these weights (a state dict or `named_parameters()`) for `step`. Checked first:
        a name the model has not, a shape that differs or (unless `partial`) a missing tensor is refused
        naming the first, and the replicas keep their weights. Returns once the tensors are copied."""
        import ray

        called = time.time()
        self._check_new_step(step)
        tensors = named_tensors(weights)
        self.tensors.check(tensors, partial)
        self._wait_for_room()
        # a tied output layer is the embeddings again, which vLLM's loader skips: not sent
        dtype = self._engine_dtype()
        raws = [
            raw_tensor(name, t, dtype) for name, t in tensors.items() if name not in self.tensors.optional
        ]
        chunks = [ray.put(chunk) for chunk in _chunks(raws)]
        future = self._call("push_weights", step, chunks).future()
        return self._pushed(step, called, future)

    def _engine_dtype(self) -> str | None:
        """The replicas' dtype once they have started (None before: the coordinator converts then)."""
        import ray

        if self._dtype is None and ray.wait([self._started], timeout=0)[0]:
            try:
                infos = ray.get(self._started)
            except Exception:  # noqa: BLE001 - a failed start is reported by the push's own job
                return None
            self._dtype = infos[0]["dtype"] if infos else None
        return self._dtype

    def push_adapter(
        self, step: int, adapter_state_dict: Mapping[str, Any], adapter_config: Any
    ) -> PushHandle:
        """Hand the replicas a LoRA adapter for `step`: PEFT's state dict (`get_peft_model_state_dict`) and
        its `LoraConfig` (or that config as a dict). The replicas load it live at the step's first request."""
        from safetensors.torch import save

        called = time.time()
        if self.lora_rank is None:
            raise EvalInputError(
                "push_adapter needs engines with LoRA layers: create the Evaluator with lora_rank=R."
            )
        self._check_new_step(step)
        settings = adapter_config.to_dict() if hasattr(adapter_config, "to_dict") else dict(adapter_config)
        files = {
            "adapter_model.safetensors": save(
                {n: t.detach().to("cpu").contiguous() for n, t in adapter_state_dict.items()}
            ),
            "adapter_config.json": _json(settings).encode(),
        }
        self._wait_for_room()
        return self._pushed(step, called, self._call("push_adapter", step, files).future())

    def load_checkpoint(self, step: int, folder: str | Path) -> PushHandle:
        """The disk way, for a trainer that saves checkpoints anyway: the replicas move to the saved folder
        in place (vLLM's reload from it, checked, as `rayeval sweep` moves its engines)."""
        called = time.time()
        self._check_new_step(step)
        path = Path(folder).resolve()
        if not (path / "config.json").is_file():
            raise EvalInputError(
                f"load_checkpoint({step}, {folder}): no config.json there; give a saved model folder."
            )
        self._wait_for_room()
        return self._pushed(step, called, self._call("load_checkpoint", step, str(path)).future())

    def _pushed(self, step: int, called: float, future: Future[PushReport]) -> PushHandle:
        self._weights_step = step
        handle = PushHandle(step, called, time.time(), future)
        self._pushes.append(handle)
        self._pushed_all.append(handle)
        return handle

    def evaluate(self, step: int) -> EvaluationHandle:
        """Evaluate the weights pushed for `step` (step 0 before any push: the base model) once the jobs asked
        for before are done; returns at once with a handle."""
        self._check_open(f"evaluate({step})")
        if step != self._weights_step:
            raise EvalInputError(
                f"evaluate({step}): the last push was for step {self._weights_step}; evaluate(step) scores the "
                f"weights pushed for that step, so push step {step}'s weights first."
            )
        if step in self._evaluated:
            raise EvalInputError(f"evaluate({step}): step {step} is already asked for.")
        self._evaluated.add(step)
        handle = EvaluationHandle(step, self._call("evaluate", step).future())
        self._evaluations.append(handle)
        return handle

    def wait(self, timeout: float | None = None) -> list[StepResult]:
        """Wait until every push and evaluation asked for so far is done; returns the evaluations' results in
        the order they were asked for. The first that failed raises its error here (TimeoutError where
        `timeout` seconds pass first); each handle keeps its own result."""
        self._check_open("wait()")
        deadline = None if timeout is None else time.monotonic() + timeout
        for push in self._pushed_all:
            push.result(_left(deadline))
        return [handle.result(_left(deadline)) for handle in self._evaluations]

    def curve(self) -> pd.DataFrame:
        """Every complete step in the folder so far (steps still running are not in it: `wait()` first for
        all of them; a step whose samples failed in part, its replicas lost, is left out with a warning, as
        the plots leave it): one row per step, task and metric (mean, sem, ci95_low, ci95_high, n...), a judged
        task's from the judge its step was judged by. Read from the folder on this node, so it also works
        after `close()`."""
        from cluster.sweep import complete_steps
        from evaluators.curves import points_from_run

        # the series is the folder's name, as the coordinator's plots have it
        return _frame([asdict(point) for step, folder in complete_steps(self.root)
                       for point in points_from_run(folder, self.root.name, step, latest_judge=True)])  # fmt: skip

    def engines(self) -> list[dict[str, Any]]:
        """The replicas' `EngineInfo`s as dicts (what each serves, how it got there), once they have started."""
        import ray

        self._check_open("engines()")
        ray.get(self._started)
        return list(ray.get(self._coordinator.engines.remote()))

    def close(self) -> None:
        """Finish what was asked for, stop the replicas and leave the Ray session this evaluator opened."""
        import ray

        if self._coordinator is None:
            return
        try:
            ray.get(self._call("close"))
        finally:
            ray.kill(self._coordinator)  # a detached actor left alive would hold its name and engines
            self._coordinator = None
            self._session.close()

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self, call: str) -> None:
        if self._coordinator is None:
            raise EvalInputError(
                f"{call}: this Evaluator is closed (close() stopped its replicas). Create another Evaluator with "
                "the same config and resume=True to go on with its finished steps kept."
            )

    def _check_new_step(self, step: int) -> None:
        self._check_open(f"push for step {step}")
        if step <= self._weights_step:
            last = (
                "the base model is step 0"
                if self._weights_step == 0
                else f"step {self._weights_step} was pushed"
            )
            raise EvalInputError(f"push for step {step}: steps go forward from 1, and {last}.")

    def _wait_for_room(self) -> None:
        """Back-pressure: at most `max_queued_pushes` pushes wait in the queue; wait for the oldest."""
        while self._pushes and self._pushes[0].done():
            self._pushes.popleft()
        while len(self._pushes) >= self.max_queued_pushes:
            wait([self._pushes.popleft().future])  # its error, if any, is its own handle's to raise


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _check_arguments(lora_rank: int | None, max_queued_pushes: int) -> None:
    if lora_rank is not None and lora_rank not in LORA_RANKS:
        raise EvalInputError(
            f"Evaluator(lora_rank={lora_rank!r}): vLLM serves LoRA ranks {', '.join(map(str, LORA_RANKS))}; give "
            "the smallest of them at least as large as the adapters' rank (LoraConfig's r)."
        )
    if not 1 <= max_queued_pushes <= MAX_QUEUED_PUSHES:
        raise EvalInputError(
            f"Evaluator(max_queued_pushes={max_queued_pushes!r}): give 1 to {MAX_QUEUED_PUSHES}. Each waiting "
            "push holds a copy of the weights in Ray's object store and one of the coordinator's threads."
        )


def _checked_plan(config: RunConfig) -> Any:
    from cluster.api import through_ray_client

    if through_ray_client(config):
        raise EvalInputError(
            f"cluster.address {config.cluster.address or '(a Ray client session already open)'}: the Evaluator "
            "runs in the trainer on a node of the cluster (its coordinator is placed on that node and watches "
            "the trainer's process there, and its folder is written there); give 'auto' or the GCS address "
            "(HEAD:6379), not a Ray client address."
        )
    if is_remote(config.output_dir):
        raise EvalInputError(
            f"output_dir {config.output_dir}: the Evaluator writes its step folders on the trainer's node; give a "
            "local folder (`rayeval watch` evaluates saved checkpoints into object storage)."
        )
    plan = build_plan(config)
    if plan.model.endpoint:
        raise EvalInputError(
            "The Evaluator pushes weights into engines it runs: model.path must be a model folder."
        )
    if plan.adapter is not None:
        raise EvalInputError(
            "The Evaluator's adapters come from push_adapter: leave model.lora out of its config."
        )
    preflight(plan)
    return plan


def _check_folder(root: Path, resume: bool) -> None:
    from cluster.sweep import finished_steps

    done = [step for step, _ in finished_steps(root)]
    if done and not resume:
        raise EvalInputError(
            f"{root} holds finished steps {done}: pass resume=True to keep them (a restarted training run; "
            "they are read back, not evaluated again), or give another run_id or output_dir."
        )


def _start_coordinator(
    config: RunConfig, device: str, root: Path, lora_rank: int | None, verbose: bool
) -> Any:
    """The coordinator on this node; detached on a `ray start` cluster, where it outlives the trainer."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from cluster.training.coordinator import NAMESPACE, TrainingCoordinator, coordinator_name

    if config.cluster.address and config.cluster.device == "auto":
        device = "gpu" if cluster_has_gpus() else "cpu"
    name = coordinator_name(root)
    running = ray.util.list_named_actors(all_namespaces=True)
    if {"name": name, "namespace": NAMESPACE} in running:
        raise EvalInputError(
            f"An Evaluator already writes {root} (actor {name}): close it, or give another run_id."
        )
    options: dict[str, Any] = {
        "name": name,
        "namespace": NAMESPACE,
        "scheduling_strategy": NodeAffinitySchedulingStrategy(
            ray.get_runtime_context().get_node_id(), soft=False
        ),
    }
    if config.cluster.address:
        options["lifetime"] = "detached"
    coordinator = TrainingCoordinator.options(**options).remote(
        config.model_dump(mode="json"), device, str(root), lora_rank is not None, os.getpid(), verbose
    )
    return coordinator


def _chunks(raws: list[RawTensor]) -> list[list[RawTensor]]:
    """The tensors in groups of up to CHUNK_BYTES (a larger tensor is a group of its own)."""
    groups: list[list[RawTensor]] = [[]]
    size = 0
    for raw in raws:
        if groups[-1] and size + raw.nbytes > CHUNK_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(raw)
        size += raw.nbytes
    return groups


def _json(settings: dict[str, Any]) -> str:
    import json

    return json.dumps(settings, indent=2, default=lambda v: sorted(v) if isinstance(v, set) else str(v))


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(rows)
