"""idem for Python: make any function safe to retry.

    from idempotence import idempotent, open_store

    store = open_store("redis://127.0.0.1:6379")

    @idempotent(store, key="idempotency_key")
    def charge(idempotency_key: str, amount: int, currency: str) -> dict:
        return {"charge": make_charge(amount, currency)}

The same key and arguments run the function once; every retry gets the
recorded outcome. `IdempotencyMiddleware` does the same for an ASGI app
(FastAPI, Starlette) over the `Idempotency-Key` header. The records are
idem's: a Rust service on the same store and namespace answers the same
retries. Every decision is made in Rust by idem-core and idem-http.
"""

from ._asgi import IdempotencyMiddleware
from ._decorator import idempotent
from ._errors import (
    DecodeError,
    EncodeError,
    IdempotencyError,
    InProgress,
    InvalidKey,
    LeaseLost,
    Mismatch,
    Remembered,
    StoreError,
)
from ._native import FingerprintPolicy, Store, open_store

__all__ = [
    "DecodeError",
    "EncodeError",
    "FingerprintPolicy",
    "IdempotencyError",
    "IdempotencyMiddleware",
    "InProgress",
    "InvalidKey",
    "LeaseLost",
    "Mismatch",
    "Remembered",
    "Store",
    "StoreError",
    "idempotent",
    "open_store",
]
