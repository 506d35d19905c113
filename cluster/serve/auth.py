"""The API key of `rayeval serve --api-key-env VAR`.

The key is read where `rayeval serve` runs and goes no further: the cluster gets its SHA-256 digest only, as
an argument of the ingress (Ray keeps actors' arguments and runtime environments in its state API and logs,
so the key itself is neither). On the ingress, `BearerKeyCheck` hashes the key each request presents and
compares the digests in constant time. A digest stands in for the key only as well as the key resists
guessing: a long random key cannot be found from it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from evaluators.errors import EvalInputError

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]

REFUSED = json.dumps(
    {
        "error": {
            "message": "Missing or incorrect API key: this server requires Authorization: Bearer KEY, the key "
            "of the variable its `rayeval serve --api-key-env` named.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
).encode()
POLICY_VIOLATION = 1008  # the WebSocket close code for a refused connection


def key_digest(key: str) -> str:
    """The hex SHA-256 digest of a key, as the ingress is given it."""
    return hashlib.sha256(key.encode()).hexdigest()


def key_digest_from_env(name: str) -> str:
    """The digest of the key in the environment variable `name`; a clear error when it is unset or empty."""
    value = os.environ.get(name, "").strip()
    if not value:
        state = "is empty" if name in os.environ else "is not set"
        raise EvalInputError(
            f"--api-key-env {name}: the variable {state}. Put the key the server should require in it where "
            f"`rayeval serve` runs (e.g. export {name}=$(openssl rand -hex 32)), or leave --api-key-env out "
            "to serve without a key."
        )
    return key_digest(value)


class BearerKeyCheck:
    """ASGI middleware: every HTTP request (and WebSocket) must carry `Authorization: Bearer <key>` whose
    SHA-256 digest is `sha256`; any other gets a 401 with an OpenAI-style error body, and never reaches the
    app. Lifespan events pass through, and so do GET requests for `open_paths` (a health probe's)."""

    def __init__(self, app: Asgi, *, sha256: str, open_paths: tuple[str, ...] = ()) -> None:
        self.app = app
        self._digest = bytes.fromhex(sha256)
        self._open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" or self._is_open(scope) or self._carries_key(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": POLICY_VIOLATION})
        else:
            headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": REFUSED})

    def _is_open(self, scope: Scope) -> bool:
        return (
            scope["type"] == "http" and scope.get("method") == "GET" and scope.get("path") in self._open_paths
        )

    def _carries_key(self, scope: Scope) -> bool:
        presented = b""
        for name, value in scope.get("headers", ()):
            if name.lower() == b"authorization":
                scheme, _, token = value.partition(b" ")
                presented = token.strip() if scheme.lower() == b"bearer" else b""
        return hmac.compare_digest(hashlib.sha256(presented).digest(), self._digest)
