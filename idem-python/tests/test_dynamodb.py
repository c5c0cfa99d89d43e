"""The decorator on DynamoDB, through the emulator .ci/run starts (moto on
127.0.0.1:5000, or IDEM_DYNAMODB_ENDPOINT): the store URL is idem-stores'
own, so Python opens every store Rust does."""

from __future__ import annotations

import os
import socket
import urllib.parse
import uuid

import pytest

from idempotence import Mismatch, idempotent, open_store


@pytest.fixture
def dynamodb_url(monkeypatch) -> str:
    endpoint = os.environ.get("IDEM_DYNAMODB_ENDPOINT", "http://127.0.0.1:5000")
    parsed = urllib.parse.urlsplit(endpoint)
    try:
        socket.create_connection((parsed.hostname, parsed.port or 80), timeout=2).close()
    except OSError as error:
        reason = f"no DynamoDB emulator at {endpoint} ({error}); run dev/moto/start"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI is set, so this fails instead of skipping)")
        pytest.skip(reason)
    # The emulator takes any credentials; the store reads them from the
    # environment, as on Lambda.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    query = urllib.parse.urlencode({"region": "us-east-1", "endpoint": endpoint})
    return f"dynamodb://py_{uuid.uuid4().hex[:12]}?{query}"


def test_a_function_runs_once_on_dynamodb_and_another_body_is_a_mismatch(dynamodb_url):
    # The URL's table is created when missing, as the SQL stores migrate.
    store = open_store(dynamodb_url)
    runs = []

    @idempotent(store, key="key", namespace="payments")
    def charge(key: str, amount: int) -> dict:
        runs.append(amount)
        return {"charge": f"ch_{len(runs)}", "amount": amount}

    first = charge("order-1", 1250)
    assert charge("order-1", 1250) == first
    assert runs == [1250]
    with pytest.raises(Mismatch):
        charge("order-1", 9999)
    assert runs == [1250]
