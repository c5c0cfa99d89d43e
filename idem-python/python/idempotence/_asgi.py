"""The ASGI middleware: Python moves the request's body and the response's
bytes; idem-http (Rust) decides what every request gets."""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import Any, Awaitable, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from . import _native

Scope = Dict[str, Any]
Message = Dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Seconds = Union[float, int, datetime.timedelta]
_log = logging.getLogger("idempotence")


def _seconds(value: Optional[Seconds]) -> Optional[float]:
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return None if value is None else float(value)


def _target(scope: Scope) -> bytes:
    """The request's path and query as the client sent them."""
    path = scope.get("raw_path")
    if not path:
        path = scope.get("root_path", "").encode() + scope["path"].encode()
    query = scope.get("query_string", b"")
    return path + b"?" + query if query else path


class IdempotencyMiddleware:
    """Makes an ASGI application (FastAPI, Starlette, any other) answer
    ``Idempotency-Key`` requests exactly as idem's Rust adapters do: a keyed
    ``POST`` or ``PATCH`` runs once, a retry gets its recorded response
    byte for byte (streamed responses too), a concurrent duplicate gets 409,
    a reused key with another request 422, and so on. The records are
    idem's: a Rust service on the same store and namespace answers the
    same retries.

        app = FastAPI()
        app.add_middleware(IdempotencyMiddleware, store=open_store("redis://127.0.0.1"))

    A pure ASGI middleware: the request body is read (up to
    ``max_request_body``) only for a protected request, and the
    application's response is handed to the recording while it is sent, so
    a streamed body reaches its client at once.

    Args:
        app: the application.
        store: where responses are kept, from ``open_store``.
        scope: a callable given the ASGI scope that returns whose key it is
            (the authenticated principal), or ``None`` to use the caller
            (the ``Authorization`` header, hashed) as idem-http does.
        routes: a fingerprint policy per path pattern (``{id}`` is one
            segment, a last ``**`` the rest), first match first.
        policy: the fingerprint policy of every other request.
        namespace, lease, retention, header, require_key, methods,
        max_request_body, max_response_body, max_streamed_body,
        record_server_errors, fail_open, store_timeout, max_wait,
        shared_across_callers, check_unscoped_records, key_pointer:
            idem-http's options of the same names; unset, its defaults.
            Durations are seconds or ``timedelta``; ``key_pointer`` reads
            the key from a JSON Pointer into the body instead of a header.

    An exception from the application before its response starts releases
    the key (a retry runs it again) and propagates; one after the response
    started cuts the response short and leaves the key executed without a
    replayable response (409 ``not-replayable``).
    """

    def __init__(
        self,
        app: ASGIApp,
        store: _native.Store,
        *,
        scope: Optional[Callable[[Scope], Optional[str]]] = None,
        routes: Union[None, Mapping[str, _native.FingerprintPolicy], Iterable[Tuple[str, _native.FingerprintPolicy]]] = None,
        policy: Optional[_native.FingerprintPolicy] = None,
        namespace: Optional[str] = None,
        lease: Optional[Seconds] = None,
        retention: Optional[Seconds] = None,
        header: Optional[str] = None,
        require_key: Optional[bool] = None,
        methods: Optional[Iterable[str]] = None,
        max_request_body: Optional[int] = None,
        max_response_body: Optional[int] = None,
        max_streamed_body: Optional[int] = None,
        record_server_errors: Optional[bool] = None,
        fail_open: Optional[bool] = None,
        store_timeout: Optional[Seconds] = None,
        max_wait: Optional[Seconds] = None,
        shared_across_callers: bool = False,
        check_unscoped_records: Optional[bool] = None,
        key_pointer: Optional[str] = None,
    ) -> None:
        self.app = app
        self._scope = scope
        if isinstance(routes, Mapping):
            routes = list(routes.items())
        self._options = _native.HttpOptions(
            store,
            namespace=namespace,
            lease=_seconds(lease),
            retention=_seconds(retention),
            header=header,
            require_key=require_key,
            methods=None if methods is None else [m.upper() for m in methods],
            max_request_body=max_request_body,
            max_response_body=max_response_body,
            max_streamed_body=max_streamed_body,
            record_server_errors=record_server_errors,
            fail_open=fail_open,
            store_timeout=_seconds(store_timeout),
            max_wait=_seconds(max_wait),
            shared_across_callers=shared_across_callers,
            check_unscoped_records=check_unscoped_records,
            key_pointer=key_pointer,
            policy=policy,
            routes=None if routes is None else list(routes),
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        options = self._options
        headers = scope["headers"]
        method = scope["method"]
        if not options.admits(method, headers):
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive, options.max_request_body)
        if body is None:
            return  # the client left before sending its body
        owner = None if self._scope is None else self._scope(scope)
        started = await options.start(method, _target(scope), headers, body, owner)
        if started is None:
            await self.app(scope, _replay_body(body, receive), send)
        elif isinstance(started, _native.Answer):
            await _send_answer(started, send)
        else:
            await self._run(started, scope, body, send)

    async def _run(self, run: _native.Run, scope: Scope, body: bytes, send: Send) -> None:
        """Runs the application, handing its response to `run`, while the
        answer the exchange decides on goes to the client."""
        responded = False

        async def to_exchange(message: Message) -> None:
            nonlocal responded
            kind = message["type"]
            if kind == "http.response.start":
                run.respond(message["status"], message.get("headers", []))
                responded = True
            elif kind == "http.response.body":
                chunk = message.get("body", b"")
                if chunk:
                    sent = run.send(chunk)
                    if not isinstance(sent, bool):
                        await sent  # the exchange's queue was full
                if not message.get("more_body", False):
                    run.end()

        async def application() -> None:
            try:
                # The application never hears of its client leaving: its
                # response is recorded to the end, for the retry.
                await self.app(scope, _replay_body(body, _never), to_exchange)
            except BaseException as error:
                if responded:
                    run.fail(f"the application raised {error!r}")
                else:
                    run.abort()
                raise
            if responded:
                run.end()
            else:
                run.abort()

        # A task of its own: a cancelled request does not stop the
        # application the exchange waits for.
        task = asyncio.ensure_future(application())
        answer = await run.answer()
        if answer is None:
            await task  # raises the application's error
            raise RuntimeError("the application returned without starting a response")
        try:
            await _send_answer(answer, send)
        except Exception:
            # A body that failed, cut short: the application's own error,
            # when it raised one, is the one to propagate.
            await task
            raise
        try:
            await task
        except Exception:
            # The client has its whole answer (a 500 problem when the body
            # failed): raised on, the server would drop the connection.
            _log.exception("the application raised after its response was answered")


async def _never() -> Message:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def _read_body(receive: Receive, limit: int) -> Optional[bytes]:
    """The request body, or its first `limit + 1` bytes when it is longer;
    `None` when the client disconnects first."""
    chunks: List[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        if chunk:
            chunks.append(chunk)
            size += len(chunk)
        if size > limit or not message.get("more_body", False):
            return b"".join(chunks)


def _replay_body(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the body already read, then `receive`'s own."""
    pending = [body]

    async def replay() -> Message:
        if pending:
            return {"type": "http.request", "body": pending.pop(), "more_body": False}
        return await receive()

    return replay


async def _send_answer(answer: _native.Answer, send: Send) -> None:
    headers = answer.headers
    whole = answer.whole
    if whole is not None:
        # A body in memory is sent with its length, as hyper sends an axum
        # app's, so a replay is framed alike behind either server.
        if not any(name == b"content-length" for name, _ in headers):
            headers.append((b"content-length", str(len(whole)).encode()))
        await send({"type": "http.response.start", "status": answer.status, "headers": headers})
        await send({"type": "http.response.body", "body": whole, "more_body": False})
        return
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    while True:
        frame = await answer.next()
        if frame is None:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await send({"type": "http.response.body", "body": frame, "more_body": True})
