"""Where `rayeval serve` says its API is, and the ingress's key check, as pure Python: the URL and notes from
the HTTP options in effect, the refusal of another host than the running Serve's, and the ASGI middleware
driven with requests of every kind (no Ray, no engine; the served model's own test drives it for real)."""

from __future__ import annotations

import asyncio
import json

import pytest

from cluster.serve.address import HttpPlace, api_url, check_running_host, placement_notes
from cluster.serve.auth import BearerKeyCheck, key_digest
from evaluators.errors import EvalInputError

KEY = "sk-test-0123456789abcdef"


def test_the_url_names_the_address_listened_on_or_the_nodes_for_every_interface() -> None:
    assert api_url(HttpPlace("127.0.0.1", 8000), "10.0.0.5") == "http://127.0.0.1:8000/v1"
    assert api_url(HttpPlace("0.0.0.0", 8000), "10.0.0.5") == "http://10.0.0.5:8000/v1"
    assert api_url(HttpPlace("::", 9000), "fd00::5") == "http://[fd00::5]:9000/v1"
    assert api_url(HttpPlace("10.0.0.7", 8000), "10.0.0.5") == "http://10.0.0.7:8000/v1"


def test_a_running_serve_on_another_host_refuses_the_deploy_and_another_port_is_told() -> None:
    running = HttpPlace("0.0.0.0", 8000)
    with pytest.raises(EvalInputError) as refused:
        check_running_host(HttpPlace("127.0.0.1", 8000), running)
    assert "--host 127.0.0.1: Serve already runs on this cluster and listens on 0.0.0.0:8000" in str(
        refused.value
    )
    assert "(open to the network)" in str(refused.value) and "Pass --host 0.0.0.0" in str(refused.value)
    check_running_host(HttpPlace("0.0.0.0", 9000), running)  # the same host: deployed onto it
    notes = placement_notes(HttpPlace("0.0.0.0", 9000), running, on_cluster=True, keyed=False)
    assert notes[0].startswith("--port 9000 was not applied: Serve already ran on this cluster on port 8000")
    assert "open to the network, to anyone who reaches it, without a key" in notes[1]
    local = placement_notes(
        HttpPlace("127.0.0.1", 8000), HttpPlace("127.0.0.1", 8000), on_cluster=True, keyed=True
    )
    assert local == (
        "the API listens on 127.0.0.1 of the cluster's nodes (the head node's proxy); from another machine reach "
        "it through an SSH tunnel: ssh -N -L 8000:127.0.0.1:8000 HEAD",
    )
    assert (
        placement_notes(
            HttpPlace("127.0.0.1", 8000), HttpPlace("127.0.0.1", 8000), on_cluster=False, keyed=False
        )
        == ()
    )


def call(scope: dict, open_paths: tuple[str, ...] = ()) -> tuple[list[dict], list[str]]:
    """Drive the key check of KEY (and `open_paths`), in front of an app, with one ASGI event: what it sent
    back, and the scope types the app behind it was given."""
    sent: list[dict] = []
    reached: list[str] = []

    async def app(scope: dict, receive, send) -> None:
        reached.append(scope["type"])

    async def receive() -> dict:
        return {"type": "http.request", "body": b""}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(BearerKeyCheck(app, sha256=key_digest(KEY), open_paths=open_paths)(scope, receive, send))
    return sent, reached


def http(authorization: bytes | None) -> dict:
    headers = [(b"content-type", b"application/json")]
    return {
        "type": "http",
        "path": "/v1/models",
        "headers": headers + ([(b"authorization", authorization)] if authorization else []),
    }


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        b"Bearer",
        b"Bearer wrong",
        b"Basic " + KEY.encode(),
        KEY.encode(),
        b"Bearer " + KEY[:-1].encode(),
    ],
)
def test_a_request_without_the_key_gets_a_401_and_never_reaches_the_app(authorization: bytes | None) -> None:
    sent, reached = call(http(authorization))
    assert reached == []
    assert sent[0]["status"] == 401 and (b"www-authenticate", b"Bearer") in sent[0]["headers"]
    error = json.loads(sent[1]["body"])["error"]
    assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"


def test_the_key_passes_in_any_scheme_case_and_lifespan_events_always_pass() -> None:
    for authorization in (b"Bearer " + KEY.encode(), b"bearer " + KEY.encode()):
        assert call(http(authorization)) == ([], ["http"])
    assert call({"type": "lifespan"}) == ([], ["lifespan"])


def test_a_websocket_without_the_key_is_closed_as_a_policy_violation() -> None:
    scope = {"type": "websocket", "path": "/v1/x", "headers": []}
    sent, reached = call(scope)
    assert reached == [] and sent == [{"type": "websocket.close", "code": 1008}]


def test_a_health_probe_needs_no_key_and_opens_nothing_else() -> None:
    """GET /health passes without the key (a load balancer's probe carries none, as vLLM leaves its /health
    open); another method on it, another path, and the API's own paths are refused as before."""
    probe = {"type": "http", "method": "GET", "path": "/health", "headers": []}
    assert call(probe, ("/health",)) == ([], ["http"])
    for refused in (
        {**probe, "method": "POST"},
        {**probe, "path": "/healthz"},
        {**probe, "path": "/v1/models"},
    ):
        sent, reached = call(refused, ("/health",))
        assert reached == [] and sent[0]["status"] == 401, refused
    assert call(probe)[0][0]["status"] == 401  # a check with no open path opens none
