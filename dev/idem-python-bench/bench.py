"""The @idempotent decorator's cost per call beside AWS Powertools'
idempotency utility (its Redis persistence layer) and idemkit's
`idempotent_sync`, on one function and one Redis, in one run.

Each round times, for every library in turn, CALLS first executions (new
keys) and then CALLS replays (the same keys again); a row is the median of
the rounds' per-call times. The plain function is its own row: the
overhead is a row minus it. Not run in CI: `run.sh [--rounds N] [--calls N]` builds the release
extension and runs this.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import redis

REDIS = "redis://127.0.0.1:6379"


def plain(key: str, order: dict) -> dict:
    return {"charge": key, "amount": order["amount"]}


def make_idem():
    from idempotence import idempotent, open_store

    store = open_store(REDIS)
    return idempotent(store, key="key", namespace=f"bench-{uuid.uuid4().hex[:8]}")(plain)


def make_powertools():
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
        RedisCachePersistenceLayer,
    )

    layer = RedisCachePersistenceLayer(client=redis.Redis.from_url(REDIS))
    config = IdempotencyConfig(event_key_jmespath="key")

    @idempotent_function(data_keyword_argument="order", persistence_store=layer, config=config)
    def charge(order: dict) -> dict:
        return plain(order["key"], order)

    return lambda key, order: charge(order={**order, "key": key})


def make_idemkit():
    import redis.asyncio as aredis
    from idemkit import MethodConfig, RedisBackend
    from idemkit.adapters.ai import idempotent_sync

    backend = RedisBackend(aredis.Redis.from_url(REDIS), namespace=f"bench-{uuid.uuid4().hex[:8]}")
    return idempotent_sync(backend=backend, config=MethodConfig(key_fields=["key"]))(plain)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    subjects = {
        "plain function": plain,
        "idempotence (idem)": make_idem(),
        "aws-lambda-powertools": make_powertools(),
        "idemkit": make_idemkit(),
    }
    first: dict = {name: [] for name in subjects}
    replay: dict = {name: [] for name in subjects}
    order = {"amount": 1250, "currency": "EUR"}
    for round_ in range(args.rounds + 1):  # round 0 warms up, not counted
        for name, fn in subjects.items():
            keys = [f"r{round_}-{uuid.uuid4().hex}" for _ in range(args.calls)]
            start = time.perf_counter()
            for key in keys:
                fn(key, order)
            ran = time.perf_counter() - start
            start = time.perf_counter()
            for key in keys:
                fn(key, order)
            replayed = time.perf_counter() - start
            if round_:
                first[name].append(ran / args.calls * 1e6)
                replay[name].append(replayed / args.calls * 1e6)
    print(f"{args.rounds} rounds x {args.calls} calls, medians, microseconds per call")
    print(f"{'':24} {'first run':>10} {'replay':>10}")
    for name in subjects:
        print(f"{name:24} {statistics.median(first[name]):10.1f} {statistics.median(replay[name]):10.1f}")


if __name__ == "__main__":
    main()
