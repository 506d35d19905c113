"""The ingress of `rayeval serve`: Ray's OpenAI ingress with local LoRA adapters by name (`lora.LoraIngress`),
vLLM's `GET /health` (200 while every served model's engine passes its health check, 503 otherwise; open
without the key, as vLLM's, for the probes of load balancers and scripts waiting for the server) and, when the
server has a key, the key check on every other request (`auth.BearerKeyCheck`).

Ray builds the ingress's FastAPI app where the application is deployed and ships it to the ingress replica;
the replica then calls the deployment's `__serve_build_asgi_app__` for the app it serves, before the app
starts. That is where the check goes in front of every route: on the replica, from the digest the replica was
given, so neither the app Ray ships nor anything Ray records holds more than the digest.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import Response
from fastapi.responses import JSONResponse

from cluster.serve.auth import BearerKeyCheck
from cluster.serve.lora import LoraIngress

log = logging.getLogger(__name__)
HEALTH_PATH = "/health"
HEALTH_TIMEOUT_S = 10.0  # an engine that has not answered its health check by then counts as down


class ServeIngress(LoraIngress):
    def __init__(self, *args: Any, api_key_sha256: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._key_sha256 = api_key_sha256
        # the model servers by model id: Ray's ingress takes them first (llm_deployments)
        self._servers: dict[str, Any] = dict(args[0] if args else kwargs["llm_deployments"])

    async def __serve_build_asgi_app__(self) -> Any:
        app = self.app  # the shipped FastAPI app, set on the replica by Serve's ASGI wrapper
        app.add_api_route(HEALTH_PATH, self.health, methods=["GET"], include_in_schema=False)
        if self._key_sha256:
            app.add_middleware(BearerKeyCheck, sha256=self._key_sha256, open_paths=(HEALTH_PATH,))
        return app

    async def health(self) -> Response:
        """200 with no body (as vLLM answers) once a replica of every served model passes its engine's health
        check; 503 naming the model and the kind of failure otherwise (a dead engine, or none answering in
        time). The probe needs no key, so the error's text (a remote traceback, paths, addresses) goes to the
        replica's log only."""
        for model, server in self._servers.items():
            try:
                await asyncio.wait_for(server.check_health.remote(), HEALTH_TIMEOUT_S)
            except TimeoutError:
                return _unavailable(
                    f"{model}: its engine did not answer its health check in {HEALTH_TIMEOUT_S:g} s"
                )
            except Exception as exc:  # noqa: BLE001 - any failure is the answer
                log.warning("GET %s: %s failed its health check: %r", HEALTH_PATH, model, exc)
                return _unavailable(f"{model}: its engine failed its health check ({type(exc).__name__})")
        return Response(status_code=200)


def _unavailable(message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "ServiceUnavailable"}}, status_code=503)
