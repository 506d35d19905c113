"""A loopback OpenAI-compatible chat API for tests of the API judges.

It stands in for an external judge API (OpenAI or another hosted endpoint) that the tests cannot reach
from here. It answers `POST /v1/chat/completions` on 127.0.0.1 from a daemon thread, can misbehave on a
schedule (429 with Retry-After, 500, answers slower than the client's timeout, answers without a
verdict), and records every request it received so tests can check what the clients really sent.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

Messages = list[dict[str, Any]]
Answer = Callable[[Messages], str]
Schedule = Callable[[str, int], str]  # (request key, attempt of that key from 1) -> action
ACTIONS = ("ok", "429", "500", "timeout", "garbage")
REPLICA_HEADER = "X-Rayeval-Replica"


@dataclass(frozen=True)
class Served:
    """One request as the server saw it; times are time.time()."""

    arrival: float
    key: str
    attempt: int
    action: str
    model: str
    replica: str  # the client's X-Rayeval-Replica header, "" when absent
    in_flight: int  # requests being handled at arrival, this one included


def message_key(messages: Messages) -> str:
    """A stable key of a request: the hash of its messages."""
    return hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:16]


def always_ok(key: str, attempt: int) -> str:
    return "ok"


def echo_last(messages: Messages) -> str:
    return f"Verdict: [[A]] ({len(messages[-1].get('content', ''))} chars judged)"


class JudgeApiStandin:
    """The server; `start()` gives its base URL (http://127.0.0.1:PORT/v1)."""

    def __init__(
        self,
        answer: Answer = echo_last,
        schedule: Schedule = always_ok,
        *,
        retry_after_s: float = 0.3,
        timeout_sleep_s: float = 2.0,
        latency_s: Callable[[str], float] | float = 0.0,
        garbage_text: str = "I think both are fine.",
        api_key: str | None = None,
    ) -> None:
        self.answer = answer
        self.schedule = schedule
        self.retry_after_s = retry_after_s
        self.timeout_sleep_s = timeout_sleep_s
        self.latency_s = latency_s
        self.garbage_text = garbage_text
        self.api_key = api_key  # when set, other bearer tokens get a 401
        self.served: list[Served] = []
        self.peak_in_flight = 0
        self._attempts: dict[str, int] = {}
        self._in_flight = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("the stand-in is not running")
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> str:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="judge-api-standin", daemon=True
        )
        self._thread.start()
        return self.base_url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> JudgeApiStandin:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def log(self) -> list[Served]:
        with self._lock:
            return list(self.served)

    def _arrive(self, messages: Messages, model: str, replica: str) -> Served:
        key = message_key(messages)
        with self._lock:
            attempt = self._attempts.get(key, 0) + 1
            self._attempts[key] = attempt
            self._in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self._in_flight)
            action = self.schedule(key, attempt)
            if action not in ACTIONS:
                raise ValueError(f"schedule returned {action!r}, not one of {ACTIONS}")
            served = Served(time.time(), key, attempt, action, model, replica, self._in_flight)
            self.served.append(served)
        return served

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _latency(self, key: str) -> float:
        return self.latency_s(key) if callable(self.latency_s) else self.latency_s


def _completion_body(model: str, text: str, messages: Messages) -> dict[str, Any]:
    prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
    output_tokens = len(text.split())
    return {
        "id": f"chatcmpl-standin-{time.time_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": output_tokens,
            "total_tokens": prompt_tokens + output_tokens,
        },
    }


def _error_body(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def _handler_for(standin: JudgeApiStandin) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the OpenAI client's connection pool expects

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._send(404, _error_body(f"no route {self.path}", "invalid_request_error"))
                return
            if (
                standin.api_key is not None
                and self.headers.get("Authorization") != f"Bearer {standin.api_key}"
            ):
                given = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                # Worded as OpenAI words it, ends of the key included, so leaks would show in tests.
                message = f"Incorrect API key provided: {given[:4]}***{given[-4:]}."
                self._send(401, _error_body(message, "invalid_request_error"))
                return
            request = json.loads(body)
            messages = request.get("messages", [])
            model = str(request.get("model", ""))
            served = standin._arrive(messages, model, self.headers.get(REPLICA_HEADER, ""))
            try:
                status, payload, headers = self._act(served, messages, model)
            finally:
                # Leave before answering: once the answer is out the client may send its next request, which
                # must not find this one still counted as in flight.
                standin._leave()
            self._send(status, payload, headers)

        def _act(
            self, served: Served, messages: Messages, model: str
        ) -> tuple[int, dict[str, Any], dict[str, str]]:
            if served.action == "429":
                retry_after = {"Retry-After": f"{standin.retry_after_s:g}"}
                return 429, _error_body("Rate limit reached for requests", "requests"), retry_after
            if served.action == "500":
                return (
                    500,
                    _error_body("The server had an error processing your request.", "server_error"),
                    {},
                )
            time.sleep(
                standin.timeout_sleep_s if served.action == "timeout" else standin._latency(served.key)
            )
            text = standin.garbage_text if served.action == "garbage" else standin.answer(messages)
            return 200, _completion_body(model, text, messages), {}

        def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client gave up (its timeout) before the answer came

    return Handler
