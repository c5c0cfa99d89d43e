"""The ``@idempotent`` decorator: Python's side moves arguments and results;
claiming, fingerprinting, recording and replaying happen in Rust."""

from __future__ import annotations

import datetime
import functools
import inspect
import logging
from typing import Any, Callable, Iterable, Optional, Sequence, Type, TypeVar, Union

from . import _native

F = TypeVar("F", bound=Callable[..., Any])
Seconds = Union[float, int, datetime.timedelta]
_log = logging.getLogger("idempotence")


def _seconds(value: Seconds) -> float:
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return float(value)


def idempotent(
    store: _native.Store,
    *,
    key: Union[str, Callable[..., str]],
    body: Union[None, str, Sequence[str], Callable[..., Any]] = None,
    namespace: str = "",
    scope: Union[str, Callable[..., str]] = "",
    lease: Seconds = 60.0,
    retention: Seconds = 24 * 3600.0,
    wait: Optional[Seconds] = None,
    remember: Iterable[Type[BaseException]] = (),
) -> Callable[[F], F]:
    """Runs the decorated function once per idempotency key and replays its
    outcome to every retry with the same key and arguments.

    Works on ``def`` and ``async def`` functions. A synchronous call
    releases the GIL while it waits on the store; an ``async def`` call
    awaits the store on tokio without blocking the event loop.

    Args:
        store: where outcomes are kept, from ``open_store``.
        key: the name of the argument that holds the key, or a callable
            given the call's arguments that returns it.
        body: what makes the request, fingerprinted as canonical JSON by
            idem-core: by default every argument but the key's, as a dict
            of name to value; the name of one argument (its value is the
            body, as a Rust caller's ``execute(key, &body, …)`` has it); a
            list of names (a dict of those); or a callable given the call's
            arguments.
        namespace: separates applications sharing one store.
        scope: the tenant or principal owning the key, or a callable given
            the call's arguments that returns it.
        lease: seconds (or a ``timedelta``) a crashed call blocks its key;
            renewed every third of it while the function runs.
        retention: how long an outcome is replayed.
        wait: if set, a call that finds the key in progress waits up to this
            long for the outcome instead of raising ``InProgress``.
        remember: exception classes recorded and raised again to every
            retry. Any other ``Exception`` releases the key, so a retry
            runs the function again; a ``BaseException`` that is not an
            ``Exception`` (a cancellation) leaves the key held until its
            lease lapses, because the side effect may have happened.

    The return value is recorded as JSON (dicts, lists, str, int, float,
    bool, None, dataclasses, pydantic models). The first call returns the
    function's own value; a replay returns its JSON form.

    Raises:
        InvalidKey, Mismatch, InProgress, StoreError, LeaseLost,
        EncodeError, Remembered: see each class.
    """
    remembered = tuple(remember)
    for cls in remembered:
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            raise TypeError(f"remember takes Exception subclasses, not {cls!r}")
    guard = _native.Guard(
        store,
        namespace=namespace,
        lease=_seconds(lease),
        retention=_seconds(retention),
        wait=None if wait is None else _seconds(wait),
        remember=remembered,
    )

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)
        if isinstance(key, str) and key not in signature.parameters:
            raise TypeError(f"{fn.__qualname__} has no argument {key!r} to take the key from")
        names = [body] if isinstance(body, str) else body
        if names is not None and not callable(names):
            for name in names:
                if name not in signature.parameters:
                    raise TypeError(f"{fn.__qualname__} has no argument {name!r} for the body")

        def request(args: tuple, kwargs: dict) -> tuple:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = bound.arguments
            the_key = arguments[key] if isinstance(key, str) else key(*args, **kwargs)
            the_scope = scope(*args, **kwargs) if callable(scope) else scope
            if body is None:
                the_body = {n: v for n, v in arguments.items() if n != key}
            elif isinstance(body, str):
                the_body = arguments[body]
            elif callable(body):
                the_body = body(*args, **kwargs)
            else:
                the_body = {n: arguments[n] for n in body}
            return the_key, the_scope, the_body

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                replayed, found = await guard.begin_async(*request(args, kwargs))
                if replayed:
                    return found
                try:
                    result = await fn(*args, **kwargs)
                except BaseException as error:
                    problem = await found.fail_async(error)
                    if problem:
                        _log.warning("could not settle the key after %s raised: %s", fn.__qualname__, problem)
                    raise
                return await found.complete_async(result)

            return run_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            replayed, found = guard.begin(*request(args, kwargs))
            if replayed:
                return found
            try:
                result = fn(*args, **kwargs)
            except BaseException as error:
                problem = found.fail(error)
                if problem:
                    _log.warning("could not settle the key after %s raised: %s", fn.__qualname__, problem)
                raise
            return found.complete(result)

        return run  # type: ignore[return-value]

    return decorate
