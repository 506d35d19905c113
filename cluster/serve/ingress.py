"""The ingress of `rayeval serve`: Ray's OpenAI ingress with local LoRA adapters by name (`lora.LoraIngress`)
and, when the server has a key, the key check on every request (`auth.BearerKeyCheck`).

Ray builds the ingress's FastAPI app where the application is deployed and ships it to the ingress replica;
the replica then calls the deployment's `__serve_build_asgi_app__` for the app it serves, before the app
starts. That is where the check goes in front of every route: on the replica, from the digest the replica was
given, so neither the app Ray ships nor anything Ray records holds more than the digest.
"""

from __future__ import annotations

from typing import Any

from cluster.serve.auth import BearerKeyCheck
from cluster.serve.lora import LoraIngress


class ServeIngress(LoraIngress):
    def __init__(self, *args: Any, api_key_sha256: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._key_sha256 = api_key_sha256

    async def __serve_build_asgi_app__(self) -> Any:
        app = self.app  # the shipped FastAPI app, set on the replica by Serve's ASGI wrapper
        if self._key_sha256:
            app.add_middleware(BearerKeyCheck, sha256=self._key_sha256)
        return app
