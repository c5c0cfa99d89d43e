"""The exception paths a caller must be able to tell apart: the store lost
after the work ran, and arguments fingerprinted by their fields, whatever
their Python type or order."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import time

import pydantic
import pytest

from idempotence import Mismatch, StoreError, idempotent, open_store


@pytest.fixture
def own_redis():
    """A Redis server of this test's own, which the test may kill."""
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("no redis-server to start (CI is set, so this fails instead of skipping)")
        pytest.skip("no redis-server to start")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.01)
    yield f"redis://127.0.0.1:{port}", server
    server.kill()
    server.wait()


def test_a_store_lost_after_the_work_says_the_work_ran(own_redis, namespace):
    url, server = own_redis
    store = open_store(url)
    effects = []

    @idempotent(store, key="key", namespace=namespace)
    def send(key: str) -> str:
        effects.append(key)
        server.kill()  # the store goes away while the work runs
        server.wait()
        return "sent"

    with pytest.raises(StoreError) as failed:
        send("lost-1")
    assert failed.value.work_ran is True
    assert effects == ["lost-1"]
    # With the store still down, a retry is refused before anything runs.
    with pytest.raises(StoreError) as refused:
        send("lost-1")
    assert refused.value.work_ran is False
    assert effects == ["lost-1"]


@dataclasses.dataclass
class Order:
    amount: int
    currency: str
    lines: list


class OrderModel(pydantic.BaseModel):
    currency: str
    lines: list
    amount: int


def test_dataclasses_models_and_dicts_of_the_same_fields_are_one_request(store_url, namespace):
    store = open_store(store_url)
    runs = []

    @idempotent(store, key="key", body="order", namespace=namespace)
    def place(key: str, order) -> int:
        runs.append(1)
        return len(runs)

    assert place("o-1", Order(5, "EUR", [{"sku": "a", "n": 1}])) == 1
    # The same fields in another order and another type: one request.
    assert place("o-1", {"lines": [{"n": 1, "sku": "a"}], "currency": "EUR", "amount": 5}) == 1
    assert place("o-1", OrderModel(currency="EUR", lines=[{"n": 1, "sku": "a"}], amount=5)) == 1
    with pytest.raises(Mismatch):
        place("o-1", Order(5, "EUR", [{"sku": "a", "n": 2}]))
    assert runs == [1]
