"""The ASGI middleware over real sockets: the HTTP behaviour suite's FastAPI
app (dev/idem-http-suite/src/fastapi_app.py) served by uvicorn in a child
process, on every store, driven by a plain HTTP client."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

from conftest import STORES, server_url
from idempotence import FingerprintPolicy, IdempotencyMiddleware, open_store

APP = Path(__file__).resolve().parents[2] / "dev" / "idem-http-suite" / "src" / "fastapi_app.py"
BODY = b'{"amount":1250,"currency":"EUR"}'
STREAM_BODY = 3 * 1024 * 1024 + 17


class Server:
    """The app in a child process; `stop` ends it."""

    def __init__(self, store_url: str, options: Dict, scope: str = "") -> None:
        env = dict(os.environ)
        env.update(
            IDEM_STORE_URL=store_url,
            IDEM_OPTIONS=json.dumps(options),
            IDEM_SCOPE=scope,
        )
        self.process = subprocess.Popen(
            [sys.executable, str(APP)], env=env, stdout=subprocess.PIPE, text=True
        )
        line = self.process.stdout.readline()
        assert line.startswith("listening on "), f"the app printed {line!r}"
        self.address = line.split()[-1]

    def request(
        self,
        path: str,
        key: Optional[str] = None,
        body: bytes = BODY,
        headers: Optional[Dict[str, str]] = None,
        method: str = "POST",
    ) -> Tuple[int, List[Tuple[str, str]], bytes]:
        host, port = self.address.split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        sent = {"content-type": "application/json"}
        if key is not None:
            sent["idempotency-key"] = key
        sent.update(headers or {})
        connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        answer = (response.status, response.getheaders(), response.read())
        connection.close()
        return answer

    def runs(self) -> int:
        return int(self.request("/effects", method="GET", body=b"")[2])

    def open_gate(self) -> None:
        assert self.request("/gate")[0] == 204

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def replayable(headers: List[Tuple[str, str]]) -> List[Tuple[str, str]]:
    """The headers a replay repeats, by name (each name's values in order)."""
    skip = {"date", "set-cookie", "idempotent-replayed", "content-length", "server"}
    kept = [(n.lower(), v) for n, v in headers if n.lower() not in skip]
    return sorted(kept, key=lambda pair: pair[0])


def header(headers: List[Tuple[str, str]], name: str) -> Optional[str]:
    return next((v for n, v in headers if n.lower() == name), None)


def problem(answer: Tuple[int, List[Tuple[str, str]], bytes], status: int) -> str:
    """The problem's name (the last segment of its type), checked."""
    got, headers, body = answer
    assert got == status, answer
    assert header(headers, "content-type") == "application/problem+json"
    document = json.loads(body)
    assert document["status"] == status
    return document["type"].rsplit("/", 1)[-1]


@pytest.fixture(scope="module", params=STORES)
def shared_server(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Server]:
    """One app per store for the tests of this module: starting one costs
    more than its tests. Each test uses keys of its own."""
    if request.param == "memory":
        url = "memory"
    elif request.param == "sqlite":
        url = f"sqlite:{tmp_path_factory.mktemp('asgi') / 'idem.db'}"
    else:
        url = server_url(request.param)
    started = Server(url, {"namespace": f"py-asgi-{uuid.uuid4().hex}"})
    yield started
    started.stop()


class Keyed:
    """The shared app as one test sees it: its keys made its own by a
    prefix, its runs counted from the test's start."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.prefix = uuid.uuid4().hex[:12]
        self.before = server.runs()

    def request(self, path: str, key: Optional[str] = None, **kwargs):
        if key is not None and key != "a b c":
            key = f"{self.prefix}-{key}"
        return self.server.request(path, key=key, **kwargs)

    def runs(self) -> int:
        return self.server.runs() - self.before

    def open_gate(self) -> None:
        self.server.open_gate()


@pytest.fixture
def server(shared_server: Server) -> Keyed:
    return Keyed(shared_server)


def test_a_retry_is_replayed_byte_for_byte_and_runs_nothing(server: Keyed) -> None:
    for path in ["/payments", "/binary"]:
        first = server.request(path, key=path)
        again = server.request(path, key=path)
        assert first[0] in (201, 202)
        assert header(first[1], "idempotent-replayed") is None
        assert header(again[1], "idempotent-replayed") == "true"
        assert again[0] == first[0]
        assert replayable(again[1]) == replayable(first[1])
        assert again[2] == first[2]
    assert server.runs() == 2
    # Set-Cookie went to the first caller only.
    assert header(server.request("/payments", key="/payments")[1], "set-cookie") is None


def test_another_request_under_a_used_key_is_422(server: Keyed) -> None:
    assert server.request("/payments", key="k")[0] == 201
    assert problem(server.request("/payments", key="k", body=b'{"amount":1}'), 422) == "mismatch"
    assert problem(server.request("/other", key="k"), 422) == "mismatch"
    # The same JSON serialised otherwise is the same request.
    reordered = b'{ "currency": "EUR", "amount": 1250 }'
    assert header(server.request("/payments", key="k", body=reordered)[1], "idempotent-replayed") == "true"
    assert server.runs() == 1


def test_a_duplicate_while_the_first_runs_is_409_and_a_waiting_one_gets_its_answer(
    server: Keyed,
) -> None:
    answers: List = []
    first = threading.Thread(target=lambda: answers.append(server.request("/gated", key="g")))
    first.start()
    deadline = time.monotonic() + 10
    while server.runs() < 1:
        assert time.monotonic() < deadline, "the gated handler runs"
        time.sleep(0.01)
    busy = server.request("/gated", key="g")
    assert problem(busy, 409) == "in-progress"
    assert int(header(busy[1], "retry-after")) >= 1
    waiter = threading.Thread(
        target=lambda: answers.append(server.request("/gated", key="g", headers={"prefer": "wait=10"}))
    )
    waiter.start()
    time.sleep(0.2)
    server.open_gate()
    first.join()
    waiter.join()
    assert [a[0] for a in answers] == [201, 201]
    assert answers[0][2] == answers[1][2], "the waiter got the first request's answer"
    assert server.runs() == 1


def test_a_streamed_body_reaches_its_client_and_replays_byte_for_byte(server: Keyed) -> None:
    first = server.request("/stream", key="s")
    assert first[0] == 200 and len(first[2]) == STREAM_BODY
    again = server.request("/stream", key="s", headers={"prefer": "wait=10"})
    assert header(again[1], "idempotent-replayed") == "true"
    assert again[2] == first[2]
    assert server.runs() == 1


def test_an_exception_before_the_response_releases_the_key(server: Keyed) -> None:
    assert server.request("/panic", key="p")[0] == 500
    assert server.request("/panic", key="p")[0] == 500
    assert server.runs() == 2, "the key was released, so the retry ran again"
    # After its response started, the key is executed but not replayable.
    assert problem(server.request("/broken", key="b"), 500) == "internal"
    assert problem(server.request("/broken", key="b"), 409) == "not-replayable"
    assert server.runs() == 3


def test_a_request_without_a_key_or_with_get_passes_through(server: Keyed) -> None:
    for _ in range(2):
        assert header(server.request("/payments")[1], "idempotent-replayed") is None
    assert server.runs() == 2
    assert problem(server.request("/payments", key="a b c"), 400) == "invalid-key"
    assert server.request("/payments", key="a b c", method="GET", body=b"")[0] == 200


def test_the_scope_callable_keeps_tenants_apart(tmp_path) -> None:
    server = Server(f"sqlite:{tmp_path / 'idem.db'}", {}, scope="tenant-header")
    try:
        a = server.request("/payments", key="shared", headers={"x-tenant": "a"})
        b = server.request("/payments", key="shared", headers={"x-tenant": "b"})
        assert b'"tenant":"a"' in a[2] and b'"tenant":"b"' in b[2]
        again = server.request("/payments", key="shared", headers={"x-tenant": "a"})
        assert header(again[1], "idempotent-replayed") == "true"
        assert again[2] == a[2]
        assert server.runs() == 2
    finally:
        server.stop()


def test_options_reach_idem_http(tmp_path) -> None:
    options = {"require_key": True, "max_request_body": 1024, "record_server_errors": True}
    server = Server(f"sqlite:{tmp_path / 'idem.db'}", options)
    try:
        assert problem(server.request("/payments"), 400) == "missing-key"
        assert problem(server.request("/payments", key="big", body=b"x" * 2048), 413) == "body-too-large"
        assert server.request("/flaky", key="f")[0] == 503
        again = server.request("/flaky", key="f")
        assert again[0] == 503 and header(again[1], "idempotent-replayed") == "true"
        assert server.runs() == 1
    finally:
        server.stop()


def test_a_route_policy_replays_retries_that_differ_only_in_what_it_leaves_out() -> None:
    import asyncio

    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    runs = []

    async def pay(request):
        runs.append(await request.body())
        return PlainTextResponse("run %d" % len(runs), status_code=201)

    app = IdempotencyMiddleware(
        Starlette(routes=[Route("/payments", pay, methods=["POST"]), Route("/other", pay, methods=["POST"])]),
        store=open_store("memory"),
        routes={"/payments": FingerprintPolicy(exclude=["/client_ts"], ignore_query_params=["attempt"])},
    )

    async def call(path: str, body: bytes) -> Tuple[int, Dict[bytes, bytes], bytes]:
        raw_path, _, query = path.partition("?")
        scope = {
            "type": "http", "method": "POST", "path": raw_path, "raw_path": raw_path.encode(),
            "query_string": query.encode(), "root_path": "", "scheme": "http", "http_version": "1.1",
            "headers": [(b"content-type", b"application/json"), (b"idempotency-key", b"p-1")],
        }
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        sent: List = []

        async def receive():
            if messages:
                return messages.pop()
            await asyncio.Event().wait()

        async def send(message):
            sent.append(message)

        await app(scope, receive, send)
        start = sent[0]
        return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent[1:])

    async def scenario() -> None:
        first = await call("/payments?attempt=1", b'{"amount":1250,"client_ts":1}')
        retry = await call("/payments?attempt=2", b'{ "client_ts": 2, "amount": 1250 }')
        assert first[0] == 201 and retry[0] == 201
        assert retry[1][b"idempotent-replayed"] == b"true" and retry[2] == first[2]
        changed = await call("/payments?attempt=3", b'{"amount":1251,"client_ts":1}')
        assert changed[0] == 422
        other = await call("/other", b'{"amount":1,"client_ts":1}')
        assert other[0] == 422, "the key's record is /payments'"
        assert len(runs) == 1

    asyncio.run(scenario())


def test_a_bad_policy_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="JSON Pointer"):
        FingerprintPolicy(exclude=["client_ts"])
    with pytest.raises(ValueError, match="not both"):
        FingerprintPolicy(include=["/a"], exclude=["/b"])
    with pytest.raises(ValueError, match="route"):
        IdempotencyMiddleware(lambda *a: None, store=open_store("memory"), routes={"no-slash": FingerprintPolicy()})
