"""The benchmark's FastAPI service: one handler (`POST /pay`, a small JSON
body, one Redis `INCR`), with the idempotency of the row named by
`ASGI_BENCH_ROW`, on the Redis at `ASGI_BENCH_REDIS`. Every row is set up
as its library's README says; `bench.py` serves each with uvicorn.
"""

from __future__ import annotations

import json
import os
import uuid
import warnings

import redis
import redis.asyncio as aredis
from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

# A row ending in "-base" is the same row on another build of idempotence
# (bench.py's --base-site), to measure a change in one run.
ROW = os.environ.get("ASGI_BENCH_ROW", "none").removesuffix("-base")
REDIS = os.environ.get("ASGI_BENCH_REDIS", "redis://127.0.0.1:6379")
COUNTER = "asgi-bench:charges"
# The records of one run are apart from any other's.
NAMESPACE = f"asgi-bench-{uuid.uuid4().hex[:8]}"
ROWS = ("none", "idem", "idem-near", "idem-nocheck", "powertools", "idemkit", "setnx")


class Order(BaseModel):
    amount: int
    currency: str


app = FastAPI()
client = aredis.Redis.from_url(REDIS)


async def charge(order: Order) -> dict:
    return {"charge": await client.incr(COUNTER), "amount": order.amount, "currency": order.currency}


if ROW in ("none", "idem", "idem-near", "idem-nocheck", "idemkit"):
    # The middleware rows wrap the very handler of the row without one.

    @app.post("/pay")
    async def pay(order: Order) -> dict:
        return await charge(order)

    if ROW.startswith("idem-") or ROW == "idem":
        from idempotence import IdempotencyMiddleware, open_store

        # idem-nocheck (not a default row): without idem-http's read of an
        # unscoped record on each first execution (`check_unscoped_records`).
        store = open_store(REDIS, near_cache=True) if ROW == "idem-near" else open_store(REDIS)
        app.add_middleware(
            IdempotencyMiddleware,
            store=store,
            namespace=NAMESPACE,
            check_unscoped_records=ROW != "idem-nocheck",
        )
    elif ROW == "idemkit":
        from idemkit import HttpConfig, IdempotencyMiddleware, RedisBackend

        app.add_middleware(
            IdempotencyMiddleware,
            backend=RedisBackend.from_url(REDIS, namespace=NAMESPACE),
            config=HttpConfig(scope=lambda req: req.headers.get("x-user-id", "anonymous")),
        )

elif ROW == "powertools":
    # Powertools' utility is synchronous (no async support): the wrapped
    # function uses redis-py's blocking client, and the handler is a `def`,
    # which FastAPI runs in its thread pool.
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
        RedisCachePersistenceLayer,
    )

    # Outside Lambda there is no context to tell the time left; the
    # utility warns about it once, which is all it does.
    warnings.filterwarnings("ignore", message="Couldn't determine the remaining time")
    blocking = redis.Redis.from_url(REDIS)
    layer = RedisCachePersistenceLayer(client=blocking)
    config = IdempotencyConfig(event_key_jmespath="key")

    @idempotent_function(data_keyword_argument="request", persistence_store=layer, config=config)
    def charge_once(request: dict) -> dict:
        return {"charge": blocking.incr(COUNTER), "amount": request["amount"], "currency": request["currency"]}

    @app.post("/pay")
    def pay(order: Order, idempotency_key: str = Header()) -> dict:
        return charge_once(request={"key": idempotency_key, **order.model_dump()})

elif ROW == "setnx":
    # The hand-written recipe of many blog posts: claim the key with
    # SET NX, run, store the response; a claimed key replays what is
    # stored, or answers 409 while it is empty (in progress).

    @app.post("/pay")
    async def pay(order: Order, idempotency_key: str = Header()) -> Response:
        key = f"{NAMESPACE}:{idempotency_key}"
        if not await client.set(key, b"", nx=True, ex=86_400):
            stored = await client.get(key)
            if not stored:
                return JSONResponse({"detail": "a request with this key is in progress"}, status_code=409)
            return Response(stored, media_type="application/json")
        try:
            result = await charge(order)
        except BaseException:
            await client.delete(key)
            raise
        body = json.dumps(result).encode()
        await client.set(key, body, ex=86_400)
        return Response(body, media_type="application/json")

else:
    raise SystemExit(f"ASGI_BENCH_ROW must be one of {', '.join(ROWS)}, not {ROW!r}")
