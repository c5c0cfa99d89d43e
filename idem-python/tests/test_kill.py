"""A worker killed with SIGKILL in the middle of a call: its key is not run
again while the lease it renewed is live, and runs again once it lapses."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

from idempotence import InProgress, idempotent, open_store

from test_processes import shared_url  # noqa: F401  (the fixture)


def _killed_worker(url: str, namespace: str, effects, started) -> None:
    store = open_store(url)

    @idempotent(store, key="key", namespace=namespace, lease=1.5)
    def charge(key: str) -> str:
        with effects.get_lock():
            effects.value += 1
        started.set()
        time.sleep(600)  # killed here
        return "never"

    charge("kill-1")


def test_a_worker_killed_mid_call_blocks_its_key_until_the_lease_lapses(shared_url, namespace):
    context = multiprocessing.get_context("fork")
    effects, started = context.Value("i", 0), context.Event()
    worker = context.Process(target=_killed_worker, args=(shared_url, namespace, effects, started))
    worker.start()
    assert started.wait(60)
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(60)
    assert worker.exitcode == -signal.SIGKILL

    store = open_store(shared_url)

    @idempotent(store, key="key", namespace=namespace, lease=1.5)
    def charge(key: str) -> str:
        with effects.get_lock():
            effects.value += 1
        return "charged"

    # The lease the dead worker renewed is live: no second run.
    with pytest.raises(InProgress) as refused:
        charge("kill-1")
    assert 0 < refused.value.retry_after <= 1.5
    assert effects.value == 1
    # Once it lapses, as long as the store said, the key runs again.
    retry_after, deadline = refused.value.retry_after, time.monotonic() + 30
    while True:
        time.sleep(retry_after)
        try:
            assert charge("kill-1") == "charged"
            break
        except InProgress as again:
            # Renewed just before the kill: the store says how much is left.
            assert time.monotonic() < deadline
            retry_after = again.retry_after
    assert effects.value == 2
    assert charge("kill-1") == "charged"
    assert effects.value == 2
