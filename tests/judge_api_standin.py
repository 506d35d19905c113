"""A loopback OpenAI-compatible chat API for tests of the API judges.

It stands in for an external judge API (OpenAI or another hosted endpoint) that the tests cannot reach
from here. It answers `POST /v1/chat/completions` on 127.0.0.1 from a daemon thread, can misbehave on a
schedule (429 with Retry-After, 500, answers slower than the client's timeout, answers without a
verdict, a 200 whose body is an HTML page or broken JSON, a 200 without choices, 400 and 401 errors) or
through an outage (`Outage`: every request fails for a while, then the server recovers), and records
every request it received so tests can check what the clients really sent. With `echo_auth` every error
body and HTML page quotes the request's Authorization header, as a misbehaving server or proxy might.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

Messages = list[dict[str, Any]]
Answer = Callable[[Messages], str]
Schedule = Callable[[str, int], str]  # (request key, attempt of that key from 1) -> action
Route = Callable[[Messages], str | None]  # an action chosen by what a request asks, or None: the schedule's
ACTIONS = (
    "ok",
    "429",
    "500",
    "timeout",
    "garbage",  # a 200 whose answer holds no verdict
    "html",  # a 200 whose body is an HTML page (text/html), as a proxy in front of the API may send
    "bad_json",  # a 200 that says application/json but whose body is not JSON
    "no_choices",  # a 200 chat completion without the `choices` field
    "empty_choices",  # a 200 chat completion with `choices: []`
    "400",  # a client error: the request itself is wrong
    "401",  # the key is rejected
)
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
    settings: dict[str, Any] = field(default_factory=dict)  # the body's other fields (sampling, seed...)


def message_key(messages: Messages) -> str:
    """A stable key of a request: the hash of its messages."""
    return hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:16]


def always_ok(key: str, attempt: int) -> str:
    return "ok"


class Outage:
    """A schedule: every request fails with `action` while the server is down, then `then` decides.

    The server is down for the first `seconds` after the first request arrives, or for the first `requests`
    requests, whichever is given (both: down while either holds). It is called under the stand-in's lock.
    """

    def __init__(
        self,
        seconds: float | None = None,
        requests: int | None = None,
        action: str = "500",
        then: Schedule = always_ok,
    ) -> None:
        self.seconds = seconds
        self.requests = requests
        self.action = action
        self.then = then
        self.began: float | None = None  # time.time() of the first request
        self.count = 0

    def down(self, now: float) -> bool:
        if self.began is None:
            self.began = now
        self.count += 1
        by_time = self.seconds is not None and now - self.began < self.seconds
        return by_time or (self.requests is not None and self.count <= self.requests)

    def __call__(self, key: str, attempt: int) -> str:
        return self.action if self.down(time.time()) else self.then(key, attempt)


def dealt(actions: list[str], first_attempt_only: bool = False) -> Schedule:
    """A schedule that deals the actions out to requests in the order their keys first arrive, so that each
    action is met (given as many keys), whatever the keys hash to. `first_attempt_only`: later attempts of a
    key get "ok"."""
    action_of: dict[str, str] = {}

    def schedule(key: str, attempt: int) -> str:
        action = action_of.setdefault(key, actions[len(action_of) % len(actions)])
        return action if attempt == 1 or not first_attempt_only else "ok"

    return schedule


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
        echo_auth: bool = False,
        route: Route | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.host, self.port = host, port  # a test's own network namespace may give another address
        self.answer = answer
        self.schedule = schedule
        self.retry_after_s = retry_after_s
        self.timeout_sleep_s = timeout_sleep_s
        self.latency_s = latency_s
        self.garbage_text = garbage_text
        self.api_key = api_key  # when set, other bearer tokens get a 401
        self.echo_auth = echo_auth
        self.route = route  # asked before the schedule, for tests that must fault one particular judgment
        self.echoed = 0  # answers that quoted the Authorization header back
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
        return f"http://{self.host}:{self._server.server_address[1]}/v1"

    def start(self) -> str:
        self._server = ThreadingHTTPServer((self.host, self.port), _handler_for(self))
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

    def _arrive(
        self, messages: Messages, model: str, replica: str, settings: dict[str, Any] | None = None
    ) -> Served:
        key = message_key(messages)
        with self._lock:
            attempt = self._attempts.get(key, 0) + 1
            self._attempts[key] = attempt
            self._in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self._in_flight)
            action = (self.route(messages) if self.route is not None else None) or self.schedule(key, attempt)
            if action not in ACTIONS:
                raise ValueError(f"schedule returned {action!r}, not one of {ACTIONS}")
            served = Served(
                time.time(), key, attempt, action, model, replica, self._in_flight, settings or {}
            )
            self.served.append(served)
        return served

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _latency(self, key: str) -> float:
        return self.latency_s(key) if callable(self.latency_s) else self.latency_s

    def _quote(self, authorization: str) -> str:
        """What an error body or HTML page says of the request: its Authorization header, with echo_auth."""
        if not self.echo_auth:
            return ""
        with self._lock:
            self.echoed += 1
        return f" (your request had Authorization: {authorization})"


Reply = tuple[int, bytes, str, dict[str, str]]  # status, body, content type, further headers


def _json_reply(status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> Reply:
    return status, json.dumps(payload).encode(), "application/json", headers or {}


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


def _rejected_key(standin: JudgeApiStandin, authorization: str) -> Reply:
    given = authorization.removeprefix("Bearer ")
    # Worded as OpenAI words it, ends of the key included, so leaks would show in tests.
    message = f"Incorrect API key provided: {given[:4]}***{given[-4:]}.{standin._quote(authorization)}"
    return _json_reply(401, _error_body(message, "invalid_request_error"))


def _fault(standin: JudgeApiStandin, action: str, authorization: str) -> Reply | None:
    """The answer of an action that fails at once, or None for those that answer after a while."""
    if action == "429":
        message = f"Rate limit reached for requests.{standin._quote(authorization)}"
        return _json_reply(
            429, _error_body(message, "requests"), {"Retry-After": f"{standin.retry_after_s:g}"}
        )
    if action == "500":
        message = f"The server had an error processing your request.{standin._quote(authorization)}"
        return _json_reply(500, _error_body(message, "server_error"))
    if action == "400":
        message = f"Invalid value for 'temperature'.{standin._quote(authorization)}"
        return _json_reply(400, _error_body(message, "invalid_request_error"))
    if action == "401":
        return _rejected_key(standin, authorization)
    if action == "html":
        page = (
            "<html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1>"
            f"<p>The upstream server did not answer.{standin._quote(authorization)}</p></body></html>"
        )
        return 200, page.encode(), "text/html; charset=utf-8", {}
    if action == "bad_json":
        return 200, b'{"id": "chatcmpl-standin", "choices": [{"index": 0, "mess', "application/json", {}
    return None


def _answer(standin: JudgeApiStandin, served: Served, messages: Messages, model: str) -> Reply:
    """The answer of an action that comes after the latency (or, for "timeout", after the client gave up)."""
    time.sleep(standin.timeout_sleep_s if served.action == "timeout" else standin._latency(served.key))
    text = standin.garbage_text if served.action == "garbage" else standin.answer(messages)
    body = _completion_body(model, text, messages)
    if served.action == "no_choices":
        del body["choices"]
    elif served.action == "empty_choices":
        body["choices"] = []
    return _json_reply(200, body)


def _handler_for(standin: JudgeApiStandin) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the OpenAI client's connection pool expects

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            authorization = self.headers.get("Authorization") or ""
            if standin.api_key is not None and authorization != f"Bearer {standin.api_key}":
                self._send(_rejected_key(standin, authorization))  # before the route, as an API checks keys
                return
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._send(_json_reply(404, _error_body(f"no route {self.path}", "invalid_request_error")))
                return
            request = json.loads(body)
            messages = request.get("messages", [])
            model = str(request.get("model", ""))
            settings = {k: v for k, v in request.items() if k not in ("messages", "model")}
            served = standin._arrive(messages, model, self.headers.get(REPLICA_HEADER, ""), settings)
            try:
                reply = _fault(standin, served.action, authorization) or _answer(
                    standin, served, messages, model
                )
            finally:
                # Leave before answering: once the answer is out the client may send its next request, which
                # must not find this one still counted as in flight.
                standin._leave()
            self._send(reply)

        def _send(self, reply: Reply) -> None:
            status, data, content_type, headers = reply
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client gave up (its timeout) before the answer came

    return Handler


def standin_answer(messages: list[dict]) -> str:
    """A well-formed verdict for whichever of the judged tasks' judge prompts `messages` is."""
    system = messages[0]["content"]
    if "criteria_met" in system:
        return '{"explanation": "The response does this.", "criteria_met": true}'
    if "[[A>>B]]" in system:
        return "My answer: ... Assistant B is a little better. [[B>A]]"
    if "Rating: [[X]]" in system:
        return "Clear and on topic.\nRating: [[8]]"
    return "Output A follows the instruction better.\n[[A]]"


def serve_standin_until_stopped() -> None:
    """`python -m tests.judge_api_standin HOST PORT`: the stand-in with `standin_answer`, accepting only the key
    in $STANDIN_API_KEY, in a process of its own (a test's separate host runs it there); prints its base URL,
    then one line per request it served, and stops on SIGTERM."""
    import os
    import signal
    import sys

    host, port = sys.argv[1], int(sys.argv[2])
    standin = JudgeApiStandin(standin_answer, api_key=os.environ["STANDIN_API_KEY"], host=host, port=port)
    print(standin.start(), flush=True)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    shown = 0
    while not stopped.wait(0.2):
        for served in standin.log()[shown:]:
            print(json.dumps({"action": served.action, "model": served.model}), flush=True)
            shown += 1
    standin.stop()


if __name__ == "__main__":
    serve_standin_until_stopped()
