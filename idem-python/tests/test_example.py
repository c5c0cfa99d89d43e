"""examples/fastapi-payments, run as its README says: uvicorn on Redis."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from conftest import server_url

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fastapi-payments"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def call(port: int, method: str, body: bytes = b"", headers=None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request(method, "/payments", body=body, headers=headers or {})
    response = connection.getresponse()
    answer = (response.status, dict(response.getheaders()), response.read())
    connection.close()
    return answer


def test_the_payments_example_charges_once_per_key() -> None:
    url = server_url("redis")
    port = free_port()
    env = dict(os.environ, IDEM_REDIS_URL=url)
    app = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app:app", "--port", str(port), "--log-level", "warning"],
        cwd=EXAMPLE,
        env=env,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert app.poll() is None, "uvicorn exited"
                assert time.monotonic() < deadline, "uvicorn listens within 30 s"
                time.sleep(0.05)
        key = f"order-{uuid.uuid4().hex}"
        headers = {"idempotency-key": key, "content-type": "application/json"}
        first = call(port, "POST", b'{"amount":1250,"currency":"EUR","client_ts":1}', headers)
        retry = call(port, "POST", b'{"client_ts":2,"currency":"EUR","amount":1250}', headers)
        other = call(port, "POST", b'{"amount":1,"currency":"EUR"}', headers)
        keyless = call(port, "POST", b'{"amount":1,"currency":"EUR"}', {"content-type": "application/json"})
        assert first[0] == 201 and "idempotent-replayed" not in first[1]
        assert retry[0] == 201 and retry[1]["idempotent-replayed"] == "true"
        assert retry[2] == first[2]
        assert other[0] == 422 and keyless[0] == 400
        charges = json.loads(call(port, "GET")[2])["charges"]
        assert [c["id"] for c in charges] == [json.loads(first[2])["id"]]
    finally:
        app.kill()
        app.wait()
