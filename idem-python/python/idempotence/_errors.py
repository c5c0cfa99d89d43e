"""The exceptions idempotent calls raise: idem-core's errors, by class."""

from __future__ import annotations

from typing import Any


class IdempotencyError(Exception):
    """Base class of every error this package raises."""


class InvalidKey(IdempotencyError, ValueError):
    """The key breaks the rules (1 to 255 visible ASCII characters).

    Nothing was touched and the function did not run.
    """


class Mismatch(IdempotencyError):
    """The key was first used with different arguments.

    Use a new key for a new request. The function did not run.
    """


class InProgress(IdempotencyError):
    """Another call holds the key and is running the function now.

    ``retry_after`` is the time left on its lease, in seconds.
    """

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after: float = retry_after


class StoreError(IdempotencyError):
    """The store failed.

    ``work_ran`` says whether the function had run: ``False`` means nothing
    happened and a retry is safe; ``True`` means its side effect happened but
    its outcome may not be recorded (the key stays held until its lease
    lapses).
    """

    def __init__(self, message: str, work_ran: bool) -> None:
        super().__init__(message)
        self.work_ran: bool = work_ran


class LeaseLost(IdempotencyError):
    """The function ran, but its lease lapsed and another call took the key
    over (or the store lost the record); this call's outcome was not
    recorded."""


class EncodeError(IdempotencyError, TypeError):
    """The arguments or the return value are not JSON.

    For arguments nothing was claimed and the function did not run. For a
    return value nothing was recorded and the key was released.
    """


class DecodeError(IdempotencyError):
    """A recorded outcome is not valid JSON: the record is damaged."""


class Remembered(IdempotencyError):
    """An earlier call under this key failed with an exception it was told to
    remember, of a class this decorator does not name (another program, or a
    renamed class, recorded it). ``value`` is the recorded JSON."""

    def __init__(self, message: str, value: Any) -> None:
        super().__init__(message)
        self.value: Any = value
