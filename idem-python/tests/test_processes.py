"""Across processes: workers forked after import, a stampede of duplicates
in several processes, and a Rust caller on the same records."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import threading
import uuid

import pytest

from idempotence import Mismatch, StoreError, idempotent, open_store

SHARED = ["sqlite", "redis", "postgres", "mysql"]


@pytest.fixture(params=SHARED)
def shared_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A store that processes share (memory is one process's own)."""
    from conftest import server_url

    if request.param == "sqlite":
        return f"sqlite:{tmp_path / 'idem.db'}"
    return server_url(request.param)


KEYS, DUPLICATES, PROCESSES, THREADS = 200, 20, 4, 40


def _worker(url: str, namespace: str, runs, answers, go) -> None:
    # Forked after the parent opened and used the store: the child opens
    # its own store on its own runtime.
    store = open_store(url)

    @idempotent(store, key="key", namespace=namespace, wait=60)
    def work(key: str, n: int) -> str:
        with runs.get_lock():
            runs.value += 1
        return f"{key}@{os.getpid()}"

    # Each process calls every key DUPLICATES / PROCESSES times, in the same
    # order as the others: the duplicates of a key meet across threads and
    # processes at once.
    calls = [f"k-{k}" for k in range(KEYS) for _ in range(DUPLICATES // PROCESSES)]
    results: dict = {}
    failures: list = []
    lock = threading.Lock()

    def drain() -> None:
        while True:
            with lock:
                if not calls:
                    return
                key = calls.pop(0)
            try:
                value = work(key, 1)
            except Exception as error:  # reported to the parent, which fails
                failures.append(repr(error))
                continue
            with lock:
                results.setdefault(key, set()).add(value)

    threads = [threading.Thread(target=drain) for _ in range(THREADS)]
    go.wait()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    answers.put(({key: sorted(values) for key, values in results.items()}, failures))


def test_a_stampede_across_forked_processes_runs_each_key_once(shared_url, namespace):
    # The parent uses the store first, so the children inherit an opened
    # store and a started runtime, and must make their own.
    store = open_store(shared_url)

    @idempotent(store, key="key", namespace=namespace)
    def warm(key: str) -> int:
        return 1

    assert warm("warm") == 1
    context = multiprocessing.get_context("fork")
    runs = context.Value("i", 0)
    answers = context.Queue()
    go = context.Event()
    workers = [
        context.Process(target=_worker, args=(shared_url, namespace, runs, answers, go))
        for _ in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    go.set()
    outcomes = [answers.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    assert [failures for _, failures in outcomes] == [[]] * PROCESSES
    # DUPLICATES calls per key, one execution per key, one outcome per key.
    assert runs.value == KEYS
    for k in range(KEYS):
        seen = {value for outcome, _ in outcomes for value in outcome[f"k-{k}"]}
        assert len(seen) == 1, seen


def _forked_call(url: str, namespace: str, answers) -> None:
    store = open_store(url)

    @idempotent(store, key="key", namespace=namespace)
    def work(key: str) -> int:
        return os.getpid()

    answers.put((work("fork-1"), os.getpid()))


def test_a_store_opened_before_fork_works_in_the_child(namespace, tmp_path):
    # Imported and used (memory store, runtime started) before the fork.
    store = open_store("memory")

    @idempotent(store, key="key", namespace=namespace)
    def parent_work(key: str) -> int:
        return os.getpid()

    assert parent_work("fork-1") == os.getpid()
    context = multiprocessing.get_context("fork")
    answers = context.Queue()
    child = context.Process(target=_forked_call, args=(f"sqlite:{tmp_path / 'f.db'}", namespace, answers))
    child.start()
    result, pid = answers.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0
    assert result == pid != os.getpid()

    # A store object made in the parent and used there is reopened in a
    # child that uses it.
    def use_parent_store(answers) -> None:
        answers.put(parent_work("fork-2"))

    child = context.Process(target=use_parent_store, args=(answers,))
    child.start()
    assert answers.get(timeout=60) == child.pid
    child.join(60)
    assert child.exitcode == 0


def _interop() -> str:
    path = os.environ.get("IDEM_PYTHON_INTEROP", "target/debug/examples/interop")
    if not os.path.exists(path):
        if os.environ.get("CI"):
            pytest.fail(f"no {path}: the workspace build makes it")
        pytest.skip(f"no {path}; build it with cargo build -p idem-python --examples")
    return path


def test_rust_execute_and_python_share_one_outcome(shared_url, namespace):
    rust = _interop()

    def rust_call(key: str, body: dict, outcome) -> str:
        done = subprocess.run(
            [rust, shared_url, namespace, key, json.dumps(body), json.dumps(outcome)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    store = open_store(shared_url)
    runs = []

    @idempotent(store, key="key", body="order", namespace=namespace)
    def charge(key: str, order: dict) -> dict:
        runs.append(key)
        return {"charge": "ch_python", "amount": order["amount"]}

    order = {"amount": 1250, "currency": "EUR", "items": [1, 2.5, None, True]}
    # Python first; Rust replays Python's outcome, whatever the field order.
    assert charge("py-first", order) == {"charge": "ch_python", "amount": 1250}
    reordered = dict(reversed(list(order.items())))
    replayed = rust_call("py-first", reordered, {"charge": "ch_rust"})
    assert replayed.startswith("replayed ")
    assert json.loads(replayed.removeprefix("replayed ")) == {"charge": "ch_python", "amount": 1250}
    assert rust_call("py-first", {**order, "amount": 1}, {"charge": "x"}) == "mismatch"

    # Rust first; Python replays Rust's outcome without running.
    ran = rust_call("rust-first", order, {"charge": "ch_rust", "n": [1, {"b": 2, "a": 1}]})
    assert ran.startswith("ran ")
    assert charge("rust-first", order) == {"charge": "ch_rust", "n": [1, {"b": 2, "a": 1}]}
    with pytest.raises(Mismatch):
        charge("rust-first", {**order, "currency": "USD"})
    assert runs == ["py-first"]


def test_a_fork_while_a_call_runs_leaves_a_child_that_refuses_calls(namespace, tmp_path):
    # The parent's threads cannot be stopped while its call holds a lease,
    # so the child refuses to use a copy of them: an error, never a hang.
    url = f"sqlite:{tmp_path / 'busy.db'}"
    store = open_store(url)
    started, finish = threading.Event(), threading.Event()

    @idempotent(store, key="key", namespace=namespace)
    def slow(key: str) -> int:
        started.set()
        assert finish.wait(30)
        return 1

    owner = threading.Thread(target=slow, args=("busy-1",))
    owner.start()
    assert started.wait(30)
    context = multiprocessing.get_context("fork")
    answers = context.Queue()

    def child(answers) -> None:
        try:
            _forked_call(url, namespace, answers)
        except StoreError as error:
            answers.put(("refused", error.work_ran, str(error)))

    try:
        worker = context.Process(target=child, args=(answers,))
        worker.start()
        answer = answers.get(timeout=60)
        worker.join(60)
    finally:
        finish.set()
        owner.join(30)
    assert answer[:2] == ("refused", False), answer
    assert "forked while 1 idempotent call" in answer[2]
    # Once the call is done, a fork stops the threads first and the child
    # works.
    worker = context.Process(target=_forked_call, args=(url, namespace, answers))
    worker.start()
    result, pid = answers.get(timeout=60)
    worker.join(60)
    assert result == pid == worker.pid

