"""A payments API in FastAPI on Redis, made safe to retry by idem's ASGI
middleware instead of a hand-written `SETNX` recipe.

    pip install idempotence fastapi uvicorn
    IDEM_REDIS_URL=redis://127.0.0.1:6379 uvicorn app:app --port 8000

A keyed `POST /payments` charges once; a retry with the same key and body
gets the recorded answer byte for byte (`Idempotent-Replayed: true`), a
concurrent duplicate gets 409, the same key with another body 422. Keys
belong to the caller: the `Authorization` header, hashed. The records are
idem's, so a Rust service on the same Redis and namespace answers the
same retries.
"""

from __future__ import annotations

import os
import secrets
import time
from typing import Optional

from fastapi import FastAPI
from pydantic import BaseModel, Field

from idempotence import FingerprintPolicy, IdempotencyMiddleware, open_store

app = FastAPI(title="payments")
ledger: list = []  # the charges made, in order; a real service calls its bank


class Payment(BaseModel):
    amount: int = Field(gt=0)
    currency: str = Field(min_length=3, max_length=3)
    client_ts: Optional[int] = None  # when the client built the request


@app.post("/payments", status_code=201)
async def pay(payment: Payment) -> dict:
    charge = {
        "id": "ch_" + secrets.token_hex(8),
        "amount": payment.amount,
        "currency": payment.currency,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    ledger.append(charge)
    return charge


@app.get("/payments")
async def charges() -> dict:
    return {"charges": ledger}


app.add_middleware(
    IdempotencyMiddleware,
    store=open_store(os.environ.get("IDEM_REDIS_URL", "redis://127.0.0.1:6379")),
    namespace="payments",
    require_key=True,
    # A client timestamp does not make a new payment.
    routes={"/payments": FingerprintPolicy(exclude=["/client_ts"])},
)
