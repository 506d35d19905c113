"""The engine replica: a Ray actor that owns one vLLM AsyncLLM for the whole run.

The engine is built once when the actor starts and serves every task, every sample round and every batch
of the run; it is never reloaded. Requests of one prompt group run concurrently inside the engine, so
vLLM's continuous batching and prefix cache see all N samples of a prompt together.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

import ray

from cluster.engines.adapters import AdapterFolders
from cluster.engines.affinity import engine_core_cpus, pin_descendants
from cluster.engines.cores import bind_this_node, replica_slot
from cluster.engines.forkserver import engine_core_forked, start_engine_core_server
from cluster.engines.import_gc import import_with_collector_paused
from cluster.engines.logs import LogPlace, describe_failure, mark, own_log_files
from cluster.engines.placement import ExecutorKind
from cluster.engines.reload_check import ReloadCheck
from cluster.engines.settings import EngineSettings, auto_dtype_here, cpu_kv_cache_args, engine_args, serving
from cluster.forwarded_env import ForwardedEnv
from cluster.models.checkpoints import MergedFrom, SwapKind, adapter_not_here
from cluster.models.default import default_model_here
from evaluators.failures import FailureKind
from sharding.requests import Adapter, Completion, GenerationRequest, PromptGroup, continuation_logprob

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineInfo:
    name: str
    node_id: str
    pid: int
    start_s: float
    max_num_seqs: int
    max_model_len: int
    vllm_version: str
    max_num_batched_tokens: int = 0
    async_scheduling: bool = False
    chunked_prefill: bool = True
    engine_core_cpus: tuple[int, ...] = ()  # where its engine core was pinned; empty: not pinned
    dtype: str = ""  # the weights' dtype the engine was built with (what `auto` became)
    # what `--dtype auto` becomes on its node (CPU engines: bfloat16 where the CPU computes it natively, else
    # float32); empty where vLLM decides it from the model (GPU)
    auto_dtype: str = ""
    log_files: tuple[str, ...] = ()  # the actor's stdout / stderr files on its node: the engine's full log
    node_ip: str = ""  # the address of its node, the machine its log files and cores are on
    cpu_binding: str = ""  # CPU engines: the cores its threads are bound to, chosen on its own node
    executor: str = ExecutorKind.SINGLE.value  # how its workers run (placement.ExecutorKind)
    nodes: tuple[str, ...] = ()  # the Ray node of each bundle of its placement group, in bundle order
    model: str = ""  # the checkpoint it serves now
    loaded_by: str = "start"  # how that checkpoint got there: start, or a swap's SwapKind (reload, rebuild)
    # where an engine's start goes beyond `start_s` (the engine's own build): when the actor began its work
    # (wall clock; the driver launched it a placement group and a Ray worker's start earlier), and the seconds
    # its first start spent importing vLLM before the build
    actor_created_at: float = 0.0
    import_s: float = 0.0
    load_note: str = ""  # why it moved that way (a reload that failed its check and was rebuilt says so)


def bundle_nodes() -> tuple[str, ...]:
    """The node id of each bundle of the calling actor's placement group; empty outside one."""
    group = ray.util.get_current_placement_group()
    if group is None:
        return ()
    placed = ray.util.placement_group_table(group).get("bundles_to_node_id", {})
    return tuple(placed[index] for index in sorted(placed))


ENGINE_STOP_GRACE_S = 0.5


class EngineDead(RuntimeError):
    """The vLLM engine inside the actor has died; the caller treats the replica as lost. The message is the
    engine's root error, read back from its log, and where that log is."""


class EngineStartFailed(RuntimeError):
    """The vLLM engine could not be built; the message is its root error and where its full log is."""


# `alive` has a concurrency group of its own: a replica whose default group is full (a run's window can pass
# Ray's 1,000 calls an async actor runs at once, on a GPU where an engine batches 1,024 sequences) still
# answers another run's check at once, instead of being taken for dead behind the queue
@ray.remote(max_restarts=0, concurrency_groups={"health": 1, "adapters": 2})
class EngineActor:
    def __init__(self, name: str, settings: EngineSettings, env: dict[str, str]) -> None:
        self.created_at = time.time()  # when this actor's process began its work (after Ray started it)
        self.import_s = 0.0
        os.environ.update(env)
        self.name = name
        self.settings = settings
        # the embedded default's folder as the planning machine gave it (this node's own may lie elsewhere)
        self.default_model_given = settings.model if settings.embedded_default else ""
        self.node_ip = ray.util.get_node_ip_address()
        # CPU engines bind their threads among this node's cores, before the forkserver and vLLM read them
        workers = settings.tensor_parallel_size * settings.pipeline_parallel_size
        self.cpu_env = bind_this_node(workers) if settings.device == "cpu" else {}
        self.engine: Any = None
        self.info: EngineInfo | None = None
        self.tokenizer: Any = None
        self.stats_logging: asyncio.Task[None] | None = None
        self.log_files = own_log_files()
        self.since_start: list[LogPlace] = []  # the logs from the engine's first request on
        self.death_cause: str | None = None
        self.lora_ids: dict[str, int] = {}  # adapter identity -> the engine's LoRA id (1, 2, ...)
        self.adapters = AdapterFolders()  # where on this node each LoRA adapter's files are
        self.reload_check = ReloadCheck()
        # A one-worker CPU engine's core is forked from a server that imports it while this actor imports vLLM
        # (cluster.engines.forkserver): the two imports at once instead of one after the other.
        self.core_server = (
            settings.executor is ExecutorKind.SINGLE
            and settings.device == "cpu"
            and start_engine_core_server()
        )

    async def start(self, env: ForwardedEnv | None = None) -> EngineInfo:
        """Build the engine, with the variables the run's coordinator handed over (a hub token: this node's
        environment is not the coordinator's) set first; a failure raises EngineStartFailed with the root
        error from the engine's log."""
        if env is not None:
            env.apply()
        before = mark(self.log_files)
        try:
            return await self._start()
        except Exception as exc:
            raise EngineStartFailed(self._failure(f"{type(exc).__name__}: {exc}", before)) from None

    def _failure(self, message: str, places: list[LogPlace]) -> str:
        return describe_failure(message, places, self.node_ip)

    async def load_checkpoint(
        self, path: str, how: SwapKind | None = None, merged_from: MergedFrom | None = None
    ) -> EngineInfo:
        """Serve the full checkpoint at `path` from now on, in this same process: vLLM reloads the weights in
        place where the checkpoints allow it, else a new engine replaces the old one (`how`, by default what
        `cluster.models.swap_kind` decides). A reload is checked (`reload_check`); an engine that fails the
        check is rebuilt, and `EngineInfo.load_note` says so. Call it only while no request is in flight.
        `merged_from`: `path` is a merged checkpoint, which this node merges for itself where it lacks it."""
        from pathlib import Path

        from cluster.models import swap_kind

        label, path = path, await self._checkpoint_here(path, merged_from)
        kind, why = swap_kind(Path(self.settings.model), Path(path)) if how is None else (how, "asked for")
        if how is None and self.info is not None and self.info.loaded_by == SwapKind.PUSH.value:
            # weights a trainer pushed are in no folder: neither "nothing to do" nor a checked reload holds
            kind, why = SwapKind.REBUILD, "the engine serves weights pushed in memory, which no folder holds"
        if kind is SwapKind.NONE:
            return self.info
        began = time.perf_counter()
        before = mark(self.log_files)
        log.info("%s: %s -> %s by %s (%s)", self.name, self.settings.model, path, kind, why)
        try:
            if kind is SwapKind.RELOAD:
                kind, why = await self._reload(path, why, merged_from)
            else:
                self.settings = serving(self.settings, path, path == self.default_model_given, merged_from)
                await self.shutdown()
                await self._start()
        except Exception as exc:
            raise EngineStartFailed(self._failure(f"{type(exc).__name__}: {exc}", before)) from None
        self.info = replace(
            self.info, model=label, loaded_by=kind.value, load_note=why, start_s=time.perf_counter() - began
        )
        return self.info

    async def push_weights(self, blobs: list[Any], label: str) -> EngineInfo:
        """Load the packed tensors of `blobs` (`cluster.engines.pushed_weights.pack`, checked against the model
        by the sender) into the engine in place, and serve them as `label` from now on; call it only while no
        request is in flight. A failure raises EngineStartFailed with the engine's root error."""
        from cluster.engines.pushed_weights import stage_blobs, unstage

        began = time.perf_counter()
        before = mark(self.log_files)
        # workers on this node map the buffers from shared memory; workers on other nodes get them in the message
        staged = stage_blobs(blobs) if self.settings.executor is not ExecutorKind.RAY else None
        try:
            if staged is not None:
                loaded = await self.engine.collective_rpc("load_pushed_files", args=(staged,))
            else:
                loaded = await self.engine.collective_rpc("load_pushed_weights", args=(blobs,))
            await self.engine.reset_prefix_cache()  # cached KV was computed with the old weights
        except Exception as exc:
            raise EngineStartFailed(self._failure(f"{type(exc).__name__}: {exc}", before)) from None
        finally:
            unstage(staged or [])
        how = "through shared memory" if staged is not None else "in the engine's message"
        note = (f"{loaded[0]} tensors ({sum(map(len, blobs)) / 1e6:.0f} MB) pushed in memory, loaded by the engine "
                f"{how} in {time.perf_counter() - began:.2f} s")  # fmt: skip
        self.info = replace(self.info, model=label, loaded_by=SwapKind.PUSH.value, load_note=note,
                            start_s=time.perf_counter() - began)  # fmt: skip
        return self.info

    def stage_files(self, folder: str, files: dict[str, bytes]) -> str:
        """Write `files` into `folder` on this replica's node (a pushed LoRA adapter, which vLLM loads from a
        folder), unless it holds them already; returns the node's address."""
        from cluster.engines.pushed_weights import write_files

        write_files(folder, files)
        return self.node_ip

    async def _checkpoint_here(self, path: str, merged_from: MergedFrom | None) -> str:
        """`path` on this node: itself, or for a merged checkpoint this node lacks, its own copy (merged here
        before, or now from the adapter the pool staged here and this node's base model)."""
        if merged_from is None:
            return path
        from cluster.models.merge import merged_copy_here, merged_folder_here

        if (found := merged_folder_here(path)) is not None:
            return found
        folder = await self.adapters.folder(merged_from.adapter)
        if folder is None:
            raise adapter_not_here(merged_from.adapter, self.node_ip)
        return await asyncio.to_thread(merged_copy_here, path, merged_from, folder)

    @ray.method(concurrency_group="adapters")
    async def holds_checkpoint(self, path: str) -> bool:
        """Whether this node has the merged checkpoint `path` (made on another node), or its own copy of it."""
        from cluster.models.merge import merged_folder_here

        return merged_folder_here(path) is not None

    @ray.method(concurrency_group="adapters")  # answered beside a full window of requests
    async def has_adapter(self, adapter: Adapter) -> bool:
        """Whether this node holds the adapter's very files (at its path or in a staged copy)."""
        return await self.adapters.folder(adapter) is not None

    @ray.method(concurrency_group="adapters")
    async def stage_adapter(self, adapter: Adapter, files: list[ray.ObjectRef]) -> str:
        """Write the adapter's files (`files[0]`, in the object store; boxed in a list so that Ray does not
        fetch them for a call that finds them here) into this node's copy; returns the node's address."""
        if await self.adapters.folder(adapter) is None:
            await self.adapters.stage(adapter, await files[0])
        return self.node_ip

    async def _reload(self, path: str, why: str, merged_from: MergedFrom | None) -> tuple[SwapKind, str]:
        """Reload the weights in place and check the engine against the checkpoint; rebuild it where the check
        fails. Returns how the checkpoint got there and why."""
        from pathlib import Path

        from cluster.models import model_family

        dtype = self.info.dtype if self.info is not None else "float32"
        calibration = await self.reload_check.calibrate(
            model_family(Path(path)), self.engine, self.tokenizer, self.settings.model, dtype
        )
        self.settings = serving(self.settings, path, path == self.default_model_given, merged_from)
        await self.engine.collective_rpc("reload_weights", kwargs={"weights_path": path})
        await self.engine.reset_prefix_cache()  # cached KV was computed with the old weights
        problem = await self.reload_check.problem(calibration, self.engine, self.tokenizer, path, dtype)
        if problem is None:
            return SwapKind.RELOAD, f"{why}; the reload check passed"
        log.warning(
            "%s: the reload of %s failed its check (%s); rebuilding the engine", self.name, path, problem
        )
        await self.shutdown()
        await self._start()
        return SwapKind.REBUILD, f"the reload check failed: {problem}"

    async def _start(self) -> EngineInfo:
        importing = time.perf_counter()
        # as the engine-core server imports them (cluster.engines.core_preload); lean_imports before vLLM:
        # transformers then skips scikit-learn
        import_with_collector_paused("cluster.engines.lean_imports", "vllm", "vllm.v1.engine.async_llm")
        import vllm
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        began = time.perf_counter()
        self.import_s = self.import_s or began - importing  # the first start imports vLLM in this process
        asked = self.settings.model  # what the run named (EngineInfo.model), as every node reports it
        if self.settings.embedded_default:  # this node's own copy, built here where it has none (once)
            self.settings = replace(self.settings, model=default_model_here(self.settings.model))
        here = await self._checkpoint_here(self.settings.model, self.settings.merged_from)
        self.settings = replace(self.settings, model=here)
        s = self.settings
        config = self._engine_config()
        with engine_core_forked() if self.core_server else contextlib.nullcontext():
            self.engine = AsyncLLM.from_vllm_config(
                config, usage_context=UsageContext.LLM_CLASS, disable_log_stats=not s.log_stats
            )
        tokenizer = self.engine.get_tokenizer()  # a coroutine in older vLLM releases
        self.tokenizer = await tokenizer if inspect.isawaitable(tokenizer) else tokenizer
        pinned_to = self._pin_engine_core()
        self.info = EngineInfo(
            name=self.name,
            node_id=ray.get_runtime_context().get_node_id(),
            pid=os.getpid(),
            start_s=time.perf_counter() - began,
            max_num_seqs=config.scheduler_config.max_num_seqs,
            max_num_batched_tokens=config.scheduler_config.max_num_batched_tokens,
            async_scheduling=bool(getattr(config.scheduler_config, "async_scheduling", False)),
            chunked_prefill=bool(config.scheduler_config.enable_chunked_prefill),
            max_model_len=config.model_config.max_model_len,
            vllm_version=vllm.__version__,
            engine_core_cpus=tuple(pinned_to),
            dtype=str(config.model_config.dtype).removeprefix("torch."),
            auto_dtype=auto_dtype_here(s),
            log_files=tuple(self.log_files),
            node_ip=self.node_ip,
            cpu_binding=self.cpu_env.get("VLLM_CPU_OMP_THREADS_BIND", ""),
            executor=s.executor.value,
            nodes=bundle_nodes(),
            model=asked,
            actor_created_at=self.created_at,
            import_s=round(self.import_s, 3),
        )
        self.since_start = mark(self.log_files)
        if s.log_stats:  # AsyncLLM only logs its stats when asked; vLLM's API server asks on a timer too
            self.stats_logging = asyncio.create_task(self._log_stats_forever())
        return self.info

    def _engine_config(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext

        s = self.settings
        args = AsyncEngineArgs(**engine_args(s), **(cpu_kv_cache_args() if s.device == "cpu" else {}))
        # An evaluation is offline batch work: take vllm.LLM's scheduler defaults, not the engine-context
        # ones (max_num_batched_tokens 2048 instead of 16384 on an H100 starves prefill, docs/BENCHMARKS.md).
        config = args.create_engine_config(UsageContext.LLM_CLASS)
        if s.executor is ExecutorKind.SINGLE and s.device == "cpu":
            # vLLM's CPU platform puts even a single worker in a process of its own (its mp executor), to give
            # that process its OpenMP environment. The pool sets the same variables for this actor, which the
            # engine core inherits, so the worker runs inside the engine core as on GPUs: one process fewer to
            # spawn and import vLLM and torch into (8 of an engine start's 21 s on two cores), at the same
            # generation speed and with the same outputs (docs/BENCHMARKS.md).
            config.parallel_config.distributed_executor_backend = "uni"
        if s.executor is ExecutorKind.RAY:
            self._hand_over_placement_group(config)
        return config

    async def _lora_request(self, adapter: Adapter | None) -> Any:
        """vLLM's LoRARequest for the adapter, one stable id per adapter for the engine's life (its LoRA cache
        keeps the most recent `max_loras` loaded). Named by its identity (name and digest): vLLM keys adapters
        by name too, and two adapters in folders of the same name (candidates of one round, each
        `<workspace>/adapter`) crashed the engine under their folder name."""
        if adapter is None:
            return None
        from vllm.lora.request import LoRARequest

        folder = await self.adapters.folder(adapter)
        if folder is None:
            raise adapter_not_here(adapter, self.node_ip)
        lora_id = self.lora_ids.setdefault(adapter.identity, len(self.lora_ids) + 1)
        return LoRARequest(adapter.identity, lora_id, folder)

    @staticmethod
    def _hand_over_placement_group(config: Any) -> None:
        """vLLM's Ray executor runs in the engine core, a subprocess of this actor: it gets this replica's
        placement group through the config (it would otherwise make its own) and joins this cluster through
        RAY_ADDRESS (else a plain `ray.init()` there starts a new local cluster beside a rayeval-started one)."""
        config.parallel_config.placement_group = ray.util.get_current_placement_group()
        os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address

    def _pin_engine_core(self) -> list[int]:
        """GPU replicas: vLLM's engine core process onto cores of its own among the node's replicas (the
        pool says which of how many this replica is on its node)."""
        if self.settings.device != "gpu" or not self.settings.pin_engine_core:
            return []
        try:  # a speed-up only: whatever goes wrong here must not fail the replica
            index, count = replica_slot()
            cpus = engine_core_cpus(index, count, sorted(os.sched_getaffinity(0)))
            return cpus if pin_descendants(os.getpid(), cpus) else []
        except (OSError, ValueError) as error:
            log.warning("%s: engine core left unpinned: %s", self.name, error)
            return []

    async def _log_stats_forever(self) -> None:
        from vllm import envs

        while self.engine is not None:
            await asyncio.sleep(envs.VLLM_LOG_STATS_INTERVAL)
            if self.engine is not None:
                await self.engine.do_log_stats()

    @ray.method(concurrency_group="health")
    async def alive(self) -> list[LogPlace]:
        """Answers while the actor lives, with where its log files stand now, read here on its node: a warm
        pool's replicas are checked before a run uses them, and where their logs stood when a run last found
        them well is where the root error of a later death is looked for."""
        return mark(self.log_files)

    async def generate(self, group: PromptGroup) -> list[Completion]:
        """Run every request of the group; a request that fails is returned as a failed completion."""
        return list(await asyncio.gather(*(self._one(r) for r in group.requests)))

    async def _one(self, request: GenerationRequest) -> Completion:
        from vllm import TokensPrompt
        from vllm.v1.engine.exceptions import EngineDeadError

        began = time.perf_counter()
        prompt: Any = (
            request.prompt
            if request.prompt_token_ids is None
            else TokensPrompt(prompt_token_ids=list(request.prompt_token_ids))
        )
        final = None
        try:
            params = sampling_params(request)
            # The engine id must be unique among in-flight requests; the stable id stays in the Completion.
            engine_id = f"{request.request_id}-{uuid.uuid4().hex[:8]}"
            lora = await self._lora_request(request.adapter)
            async for output in self.engine.generate(prompt, params, request_id=engine_id, lora_request=lora):
                final = output
        except EngineDeadError as exc:
            if self.death_cause is None:  # every in-flight request sees the death; read the log once
                self.death_cause = self._failure(str(exc), self.since_start)
            raise EngineDead(self.death_cause) from None
        except Exception as exc:  # noqa: BLE001 - a bad request is a failed sample, never a dead run
            return Completion(
                request_id=request.request_id,
                latency_s=time.perf_counter() - began,
                replica=self.name,
                error=f"{type(exc).__name__}: {exc}",
            )
        if final is None or not final.outputs:
            return Completion(
                request.request_id,
                replica=self.name,
                error=FailureKind.EMPTY_OUTPUT.error("the engine returned nothing"),
            )
        latency = time.perf_counter() - began
        prompt_tokens = len(final.prompt_token_ids or [])
        if request.kind == "loglikelihood":
            logprob, is_greedy = scored_prompt(request, final.prompt_logprobs)
            return Completion(
                request_id=request.request_id,
                prompt_tokens=prompt_tokens,
                latency_s=latency,
                replica=self.name,
                logprob=logprob,
                is_greedy=is_greedy,
            )
        out = final.outputs[0]
        text = out.text if params.detokenize else self._decode(out.token_ids, params.skip_special_tokens)
        return Completion(
            request_id=request.request_id,
            text=text,
            prompt_tokens=prompt_tokens,
            output_tokens=len(out.token_ids),
            finish_reason=out.finish_reason,
            latency_s=latency,
            replica=self.name,
        )

    def _decode(self, token_ids: Any, skip_special_tokens: bool) -> str:
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    async def shutdown(self) -> None:
        """Stop the engine and its processes. The engine core gets ENGINE_STOP_GRACE_S after SIGTERM (vLLM
        waits 5 s by default): it holds nothing to save, and the run's files wait for this."""
        if self.stats_logging is not None:
            self.stats_logging.cancel()
        if self.engine is not None:
            self.engine.shutdown(timeout=ENGINE_STOP_GRACE_S)
            self.engine = None


def scored_prompt(request: GenerationRequest, prompt_logprobs: Any) -> tuple[float, bool]:
    """A log-likelihood request's continuation read from vLLM's prompt logprobs (per position, token id ->
    Logprob, the actual token and the top-1)."""
    tokens = request.prompt_token_ids or ()
    positions = range(request.continuation_start, len(tokens))
    return continuation_logprob(
        tokens[request.continuation_start :],
        [{token: entry.logprob for token, entry in prompt_logprobs[p].items()} for p in positions],
    )


def sampling_params(request: GenerationRequest) -> Any:
    """vLLM's SamplingParams for one request: final outputs only, text only where stop strings need it."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    if request.kind == "loglikelihood":
        # Prompt log-probabilities only: one token is generated because vLLM must generate something.
        return SamplingParams(
            temperature=0,
            prompt_logprobs=1,
            max_tokens=1,
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
    spec = request.sampling
    options = {"detokenize": not defer_detokenization(spec.stop)}
    return SamplingParams(
        n=1,
        temperature=spec.temperature,
        top_p=spec.top_p,
        max_tokens=spec.max_tokens,
        stop=list(spec.stop) or None,
        seed=request.seed,
        output_kind=RequestOutputKind.FINAL_ONLY,
        **(options | dict(spec.engine_options)),
    )


def defer_detokenization(stop: tuple[str, ...]) -> bool:
    """Whether the output is decoded once at the end rather than token by token inside vLLM.

    vLLM detokenizes incrementally in its front-end process, for every sequence at every step; that work is
    only needed to find stop strings (we ask for final outputs only). Without stop strings one decode of
    the finished tokens gives the same text for less work in the engine actor's process.
    """
    return not stop
