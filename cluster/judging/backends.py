"""The two kinds of judge behind one interface: a judge model on the cluster's own engine replicas, or an
OpenAI-compatible API called by judge actors under one cluster-wide rate limiter.

Both turn a judged task's chat messages into requests for the dispatcher (`make_request`) and hand it
`Replica`s to feed (`start`); the request id hashes the judge's identity and the full judge prompt, so the
judge cache is keyed by (judge model, judge prompt, inputs). `is_transient` tells the judge runner which
failed judgments deserve a second pass at the end of judging.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from cluster.config import JudgeOptions, RunConfig
from cluster.engines import EngineSettings, ReplicaPlan
from cluster.models import PromptRenderer, ResolvedModel, resolve_model
from evaluators.tasks.base import ChatMessage, Prompt
from sharding.dispatcher import Replica
from sharding.requests import Completion, GenerationRequest, SamplingSpec, make_request

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JudgeIdentity:
    spec: str  # what the cache key hashes: kind, model and (for APIs) the endpoint
    name: str  # for tables and records
    slug: str  # folder name under <run>/judges/


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:80] or "judge"


class JudgeBackend(Protocol):
    identity: JudgeIdentity

    def make_request(
        self, messages: tuple[ChatMessage, ...], sampling: SamplingSpec
    ) -> GenerationRequest: ...

    def start(self) -> list[Replica]: ...

    def is_transient(self, completion: Completion) -> bool:
        """Whether a failed judgment failed on faults that may pass (a second pass may answer it)."""
        ...

    def stats(self) -> dict[str, Any]: ...

    def shutdown(self) -> None: ...


def judge_engine_settings(config: RunConfig, model_path: str, device: str) -> EngineSettings:
    """A local judge's engines: built as the model's (dtype, parallelism, eager...) with the judge's context,
    without what belongs to the model under test alone: its revision (a hub id's branch or commit, which
    the judge model need not have) and its adapter's LoRA layers (slower, and a key no judge pool has)."""
    from cluster.engines import engine_settings

    settings = engine_settings(config.model, model_path, device, max_model_len=config.judge.max_model_len)
    return replace(settings, revision=None, max_lora_rank=0, max_loras=1)


class LocalJudgeBackend:
    """A judge model hosted on its own engine replicas: the same engine actor as the model under test."""

    def __init__(
        self,
        config: RunConfig,
        device: str,
        replica: ReplicaPlan,
        verbose: bool,
        core_slots: tuple[int, int] | None,
    ) -> None:
        self.options = config.judge
        self.config = config
        self.device = device
        self.replica = replica
        self.verbose = verbose
        self.core_slots = core_slots
        self.model: ResolvedModel = resolve_model(self.options.target)
        self.renderer = PromptRenderer(self.model, chat_template=None)
        # a hub id is named whole (orgA/X and orgB/X are two judges); a folder by its name (`own_identity`
        # tells two folders of one name apart within a run, `compare` by their specs)
        shown = self.model.path if not Path(self.model.path).is_absolute() else self.model.name
        self.identity = JudgeIdentity(
            spec=f"local:{self.model.path}",
            name=f"local:{shown}",
            slug=_slug(f"local-{shown}"),
        )
        self._pool: Any = None

    def make_request(self, messages: tuple[ChatMessage, ...], sampling: SamplingSpec) -> GenerationRequest:
        text = "\n\n".join(m.content for m in messages)
        prompt = self.renderer.render(Prompt(messages=messages, text=text))
        return make_request(self.identity.spec, prompt, sampling, seed=0, sample_index=0)

    def start(self) -> list[Replica]:
        """The judge's replicas from its generation source: a warm pool with its settings, or its own."""
        from cluster.sources import SourceRequest, choose

        settings = judge_engine_settings(self.config, self.model.path, self.device)
        cluster_options = self.config.cluster
        self._pool = choose(
            SourceRequest(
                config=self.config,
                settings=settings,
                plan=self.replica,
                count=self.options.replicas,
                run_id=f"{self.config.run_id or 'run'}-judge",
                verbose=self.verbose,
                core_slots=self.core_slots,
                name_prefix="judge",
                warm_pools=cluster_options.warm_pools,
                keep_warm_s=cluster_options.kept_warm_s,
            )
        )
        log.info("judge replicas of %s from %s", self.model.name, self._pool.kind.value)
        started = self._pool.start()
        for info in started.engines:
            log.info("%s ready in %.1f s", info.name, info.start_s)
        return started.replicas

    def is_transient(self, completion: Completion) -> bool:
        # An engine's failures (a prompt over max_model_len, say) recur; dead replicas stay dead.
        return False

    def stats(self) -> dict[str, Any]:
        source = self._pool.describe() if self._pool is not None else {}
        return {"kind": "local", "replicas": self.options.replicas, "engines": source}

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.close({})  # the judge's requests are not counted
            self._pool = None


class ApiJudgeBackend:
    """An OpenAI-compatible API behind judge actors that share one cluster-wide rate limiter."""

    def __init__(self, options: JudgeOptions) -> None:
        from cluster.endpoints import ApiSettings

        self.options = options
        self.settings = ApiSettings.from_options(options)
        endpoint = options.base_url or "api.openai.com"
        self.identity = JudgeIdentity(
            spec=f"openai:{options.target}@{endpoint}",
            name=f"openai:{options.target}",
            slug=_slug(f"openai-{options.target}"),
        )
        self._pool: Any = None

    def make_request(self, messages: tuple[ChatMessage, ...], sampling: SamplingSpec) -> GenerationRequest:
        payload = json.dumps([{"role": m.role, "content": m.content} for m in messages], ensure_ascii=False)
        return make_request(self.identity.spec, payload, sampling, seed=0, sample_index=0, kind="chat")

    def start(self) -> list[Replica]:
        from cluster.endpoints import start_api_clients

        self._pool = start_api_clients(self.settings, self.options.replicas)
        return self._pool.replicas()

    def is_transient(self, completion: Completion) -> bool:
        from cluster.endpoints import is_transient

        return is_transient(completion)

    def stats(self) -> dict[str, Any]:
        if self._pool is None:
            return {"kind": "openai"}
        return {
            "kind": "openai",
            "actors": self.options.replicas,
            **asdict(self._pool.stats()),
            "limiter": asdict(self._pool.limiter_stats()),
        }

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


def build_judge_backend(
    config: RunConfig,
    device: str,
    replica: ReplicaPlan,
    verbose: bool,
    core_slots: tuple[int, int] | None = None,
) -> JudgeBackend:
    if config.judge.kind == "local":
        return LocalJudgeBackend(config, device, replica, verbose, core_slots)
    return ApiJudgeBackend(config.judge)
