"""The decorator on every store: replays, mismatches, calls in progress,
exceptions, bad input and store failures, for def and async def."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import threading

import pydantic
import pytest

from idempotence import (
    EncodeError,
    InProgress,
    InvalidKey,
    Mismatch,
    StoreError,
    idempotent,
    open_store,
)


class Declined(Exception):
    """A final answer worth remembering."""


def test_a_retry_replays_the_outcome_and_another_body_is_a_mismatch(store_url, namespace):
    store = open_store(store_url)
    runs = []

    @idempotent(store, key="key", namespace=namespace)
    def charge(key: str, amount: int, currency: str) -> dict:
        runs.append(amount)
        return {"charge": f"ch_{len(runs)}", "amount": amount}

    first = charge("order-1", 1250, "EUR")
    again = charge("order-1", 1250, currency="EUR")
    assert first == {"charge": "ch_1", "amount": 1250}
    assert again == first
    with pytest.raises(Mismatch):
        charge("order-1", 9999, "EUR")
    assert runs == [1250]


def test_async_calls_replay_and_mismatch_too(store_url, namespace):
    store = open_store(store_url)
    runs = []

    @idempotent(store, key="key", namespace=namespace)
    async def send(key: str, to: str) -> list:
        runs.append(to)
        await asyncio.sleep(0)
        return [to, len(runs)]

    async def main() -> None:
        assert await send("mail-1", "a@example.com") == ["a@example.com", 1]
        assert await send("mail-1", "a@example.com") == ["a@example.com", 1]
        with pytest.raises(Mismatch):
            await send("mail-1", "b@example.com")

    asyncio.run(main())
    assert runs == ["a@example.com"]


def test_a_call_in_progress_says_how_long_to_wait(store_url, namespace):
    store = open_store(store_url)
    started, finish = threading.Event(), threading.Event()

    @idempotent(store, key="key", namespace=namespace, lease=30)
    def slow(key: str) -> str:
        started.set()
        assert finish.wait(30)
        return "done"

    results = []
    owner = threading.Thread(target=lambda: results.append(slow("slow-1")))
    owner.start()
    try:
        assert started.wait(30)
        with pytest.raises(InProgress) as refused:
            slow("slow-1")
        assert 0 < refused.value.retry_after <= 30
    finally:
        finish.set()
        owner.join(30)
    assert results == ["done"]
    assert slow("slow-1") == "done"


def test_a_waiting_caller_gets_the_outcome_of_the_call_in_progress(store_url, namespace):
    store = open_store(store_url)
    started, finish = threading.Event(), threading.Event()
    runs = []

    @idempotent(store, key="key", namespace=namespace, wait=30)
    def slow(key: str) -> int:
        runs.append(1)
        started.set()
        assert finish.wait(30)
        return 7

    owner = threading.Thread(target=slow, args=("wait-1",))
    owner.start()
    assert started.wait(30)
    waited = []
    waiter = threading.Thread(target=lambda: waited.append(slow("wait-1")))
    waiter.start()
    finish.set()
    owner.join(30)
    waiter.join(30)
    assert waited == [7]
    assert runs == [1]


def test_async_calls_in_progress_are_refused_without_blocking_the_loop(store_url, namespace):
    store = open_store(store_url)

    async def main() -> None:
        started, release = asyncio.Event(), asyncio.Event()

        @idempotent(store, key="key", namespace=namespace)
        async def slow(key: str) -> str:
            started.set()
            await release.wait()
            return "done"

        owner = asyncio.ensure_future(slow("async-1"))
        # The owner holds the key while it awaits; the loop, not blocked by
        # the store, runs this task beside it.
        await asyncio.wait_for(started.wait(), 30)
        with pytest.raises(InProgress) as refused:
            await slow("async-1")
        assert refused.value.retry_after > 0
        release.set()
        assert await asyncio.wait_for(owner, 30) == "done"
        assert await slow("async-1") == "done"

    asyncio.run(main())


def test_an_exception_releases_the_key(store_url, namespace):
    store = open_store(store_url)
    runs = []

    @idempotent(store, key="key", namespace=namespace)
    def flaky(key: str) -> str:
        runs.append(1)
        if len(runs) == 1:
            raise ConnectionError("gateway timed out")
        return "ok"

    with pytest.raises(ConnectionError):
        flaky("flaky-1")
    assert flaky("flaky-1") == "ok"
    assert flaky("flaky-1") == "ok"
    assert len(runs) == 2


def test_async_exceptions_release_the_key(store_url, namespace):
    store = open_store(store_url)
    runs = []

    @idempotent(store, key="key", namespace=namespace)
    async def flaky(key: str) -> str:
        runs.append(1)
        if len(runs) == 1:
            raise ConnectionError("gateway timed out")
        return "ok"

    async def main() -> None:
        with pytest.raises(ConnectionError):
            await flaky("flaky-1")
        assert await flaky("flaky-1") == "ok"
        assert await flaky("flaky-1") == "ok"

    asyncio.run(main())
    assert len(runs) == 2


def test_remembered_exceptions_are_raised_again_without_running(store_url, namespace):
    store = open_store(store_url)
    runs = []

    @idempotent(store, key="key", namespace=namespace, remember=[Declined])
    def pay(key: str, amount: int) -> str:
        runs.append(amount)
        raise Declined("insufficient funds", amount)

    with pytest.raises(Declined) as first:
        pay("pay-1", 10)
    with pytest.raises(Declined) as replayed:
        pay("pay-1", 10)
    assert replayed.value.args == first.value.args == ("insufficient funds", 10)
    assert runs == [10]


def test_a_return_value_that_is_not_json_releases_the_key(store_url, namespace):
    store = open_store(store_url)
    runs = []

    @idempotent(store, key="key", namespace=namespace)
    def make(key: str) -> object:
        runs.append(1)
        return object() if len(runs) == 1 else {"made": len(runs)}

    with pytest.raises(EncodeError, match="return value is not JSON.*released"):
        make("make-1")
    assert make("make-1") == {"made": 2}
    assert make("make-1") == {"made": 2}
    assert len(runs) == 2


def test_a_key_too_long_is_invalid_and_nothing_runs(store_url, namespace):
    store = open_store(store_url)
    runs = []

    @idempotent(store, key="key", namespace=namespace)
    def work(key: str) -> int:
        runs.append(1)
        return 1

    with pytest.raises(InvalidKey):
        work("k" * 256)
    with pytest.raises(InvalidKey):
        work("has space")
    assert runs == []


@dataclasses.dataclass
class Order:
    amount: int
    currency: str


class Customer(pydantic.BaseModel):
    name: str
    tags: list[str]


def test_dataclasses_and_pydantic_models_fingerprint_as_their_fields(store_url, namespace):
    store = open_store(store_url)
    runs = []

    @idempotent(store, key="key", namespace=namespace)
    def place(key: str, order: Order, customer: Customer) -> Order:
        runs.append(1)
        return order

    order, customer = Order(5, "EUR"), Customer(name="Ada", tags=["a"])
    assert place("place-1", order, customer) == order
    # A replay returns the JSON form.
    assert place("place-1", Order(5, "EUR"), Customer(name="Ada", tags=["a"])) == {
        "amount": 5,
        "currency": "EUR",
    }
    with pytest.raises(Mismatch):
        place("place-1", Order(6, "EUR"), customer)
    assert runs == [1]


def test_arguments_that_are_not_json_are_refused_before_anything_runs(namespace):
    store = open_store("memory")
    runs = []

    @idempotent(store, key="key", namespace=namespace)
    def work(key: str, thing: object) -> int:
        runs.append(1)
        return 1

    with pytest.raises(EncodeError, match="did not run"):
        work("k-1", object())
    with pytest.raises(EncodeError):
        work("k-1", {1: "int key"})
    with pytest.raises(EncodeError):
        work("k-1", float("nan"))
    assert runs == []


def test_a_store_down_before_the_work_says_it_did_not_run(namespace):
    # Port 1: nothing listens, so opening the store fails at once. (The SQL
    # stores' pools retry a refused connection until their acquire timeout.)
    store = open_store("redis://127.0.0.1:1")
    runs = []

    @idempotent(store, key="key", namespace=namespace)
    def work(key: str) -> int:
        runs.append(1)
        return 1

    with pytest.raises(StoreError) as failed:
        work("down-1")
    assert failed.value.work_ran is False

    async def main() -> None:
        @idempotent(store, key="key", namespace=namespace)
        async def work_async(key: str) -> int:
            runs.append(1)
            return 1

        with pytest.raises(StoreError) as failed:
            await work_async("down-1")
        assert failed.value.work_ran is False

    asyncio.run(main())
    assert runs == []


def test_the_key_may_come_from_a_callable_and_the_body_from_chosen_arguments(namespace):
    store = open_store("memory")
    runs = []

    @idempotent(
        store,
        key=lambda request, trace_id: request["id"],
        body="request",
        scope=lambda request, trace_id: request["tenant"],
        namespace=namespace,
    )
    def handle(request: dict, trace_id: str) -> int:
        runs.append(1)
        return len(runs)

    assert handle({"id": "r-1", "tenant": "t1"}, trace_id="a") == 1
    # The trace id is not part of the body: a retry with another replays.
    assert handle({"id": "r-1", "tenant": "t1"}, trace_id="b") == 1
    # Another tenant's key of the same name is another record.
    assert handle({"id": "r-1", "tenant": "t2"}, trace_id="a") == 2


def test_unknown_store_urls_are_refused_without_echoing_them():
    with pytest.raises(ValueError) as refused:
        open_store("mongodb://user:secret@h/db")
    assert "secret" not in str(refused.value)
    assert open_store("redis://u:secret@127.0.0.1:6379").url == "redis://u:***@127.0.0.1:6379"


def test_a_near_cache_replays_from_the_process(tmp_path, namespace):
    """With `near_cache`, a settled record once read is replayed from
    memory: the table's rows deleted behind the store's back, the call
    still replays, where a store without the cache runs it again."""
    for near, runs_after_delete in [(True, 1), (False, 2)]:
        path = tmp_path / f"idem-{near}.db"
        store = open_store(f"sqlite:{path}", near_cache=near)
        assert store.near_cache is near
        runs = []

        @idempotent(store, key="key", namespace=f"{namespace}-{near}")
        def charge(key: str, amount: int) -> dict:
            runs.append(amount)
            return {"charge": len(runs)}

        assert charge("order-1", 1250) == {"charge": 1}
        assert charge("order-1", 1250) == {"charge": 1}  # kept by the cache
        with sqlite3.connect(path) as db:
            assert db.execute("DELETE FROM idem_records").rowcount == 1
        assert charge("order-1", 1250)["charge"] == runs_after_delete
        assert len(runs) == runs_after_delete
    assert "near_cache=True" in repr(open_store("memory", near_cache=True))
