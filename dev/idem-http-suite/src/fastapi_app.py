"""The HTTP behaviour suite's routes as a FastAPI app behind idem's ASGI
middleware (`idempotence.IdempotencyMiddleware`), served by uvicorn (one
worker) on a free port of 127.0.0.1. It prints `listening on HOST:PORT`
once it accepts connections.

Configured by environment, as the suite's `Adapter::FastApi` starts it:

* `IDEM_STORE_URL`: the store, as `open_store` takes it; `IDEM_STORE_NAME`
  its key prefix or table.
* `IDEM_OPTIONS`: the middleware's options, a JSON object of its keyword
  arguments (`namespace`, `require_key`, `max_wait`, …).
* `IDEM_SCOPE`: `tenant-header` takes the scope from `x-tenant`.

`GET /effects` answers how many times a handler has run; `POST /gate`
lets one request waiting at `/gated` or `/gated-events` through.

With `--zygote` it forks one app per configuration read from stdin (one
JSON object of those names a line) and answers `PID 127.0.0.1:PORT` for
each.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import signal
import socket
import sys

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import PlainTextResponse, StreamingResponse

from idempotence import IdempotencyMiddleware, open_store

BIG_BODY = 4096
STREAM_BODY = 3 * 1024 * 1024 + 17
STREAM_FRAME = 10_007
EVENTS = 2_000
GATED_EVENTS = 10

runs = 0
gate = asyncio.Semaphore(0)
_stream_body = None


def run() -> int:
    """Counts one run and returns its number (1 for the first)."""
    global runs
    runs += 1
    return runs


def stream_body() -> bytes:
    global _stream_body
    if _stream_body is None:
        _stream_body = bytes(((i % 251) ^ (i // 251)) & 0xFF for i in range(STREAM_BODY))
    return _stream_body


def event(i: int) -> bytes:
    return ('id: %d\nevent: token\ndata: {"n":%d,"text":"word %d"}\n\n' % (i, i, i)).encode()


app = FastAPI()


async def payment(request: Request) -> Response:
    body = await request.body()
    n = run()
    tenant = request.headers.get("x-tenant", "-")
    response = Response(
        '{"run":%d,"tenant":"%s","echo":%d}' % (n, tenant, len(body)),
        status_code=201,
        media_type="application/json",
    )
    response.raw_headers += [
        (b"set-cookie", b"session=s%d; HttpOnly" % n),
        (b"x-multi", b"a"),
        (b"x-multi", b"b"),
        (b"x-run", str(n).encode()),
    ]
    return response


app.add_api_route("/payments", payment, methods=["POST", "PATCH"])
app.add_api_route("/other", payment, methods=["POST"])


@app.get("/payments")
@app.get("/effects")
async def count() -> Response:
    return PlainTextResponse(str(runs))


@app.post("/gate")
async def open_gate() -> Response:
    gate.release()
    return Response(status_code=204)


@app.post("/binary")
async def binary() -> Response:
    n = run()
    return Response(bytes(range(256)) + bytes([n % 256]), status_code=202, media_type="application/octet-stream")


@app.post("/gated")
async def gated() -> Response:
    n = run()
    await gate.acquire()
    return PlainTextResponse("run %d" % n, status_code=201)


@app.post("/flaky")
async def flaky() -> Response:
    n = run()
    if n == 1:
        return PlainTextResponse("try again", status_code=503)
    return PlainTextResponse("run %d" % n, status_code=201)


@app.post("/big")
async def big() -> Response:
    run()
    return Response(b"x" * BIG_BODY, media_type="application/octet-stream")


@app.post("/broken")
async def broken() -> Response:
    run()

    async def frames():
        yield b"half a response"
        raise RuntimeError("the stream broke")

    return StreamingResponse(frames())


@app.post("/stream")
async def stream() -> Response:
    run()
    body = stream_body()

    async def frames():
        for sent, at in enumerate(range(0, len(body), STREAM_FRAME)):
            if sent and sent % 16 == 0:
                await asyncio.sleep(0.001)
            yield body[at : at + STREAM_FRAME]

    return StreamingResponse(frames())


@app.post("/events")
async def events() -> Response:
    run()

    async def frames():
        for i in range(EVENTS):
            if i and i % 100 == 0:
                await asyncio.sleep(0.001)
            yield event(i)

    # Set as a header: as media_type, Starlette would add a charset.
    return StreamingResponse(frames(), headers={"content-type": "text/event-stream"})


@app.post("/gated-events")
async def gated_events() -> Response:
    run()

    async def frames():
        for i in range(2 * GATED_EVENTS):
            if i == GATED_EVENTS:
                await gate.acquire()
            yield event(i)

    # Set as a header: as media_type, Starlette would add a charset.
    return StreamingResponse(frames(), headers={"content-type": "text/event-stream"})


@app.post("/panic")
async def panic() -> Response:
    run()
    raise RuntimeError("the handler fails on purpose")


def tenant(scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"x-tenant":
            return value.decode("latin-1")
    return None


def serve(config: dict, report) -> None:
    """Serves the app as `config` says (the environment's names, as
    described above); `report(port)` is called once it listens."""
    options = json.loads(config.get("IDEM_OPTIONS") or "{}")
    store = open_store(config["IDEM_STORE_URL"], name=config.get("IDEM_STORE_NAME") or None)
    scope = tenant if config.get("IDEM_SCOPE") == "tenant-header" else None
    app.add_middleware(IdempotencyMiddleware, store=store, scope=scope, **options)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    report(listener.getsockname()[1])
    config = uvicorn.Config(app, log_level="warning", server_header=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[listener])


def zygote() -> None:
    """Forks one app per line of JSON config read from stdin, answering
    `PID 127.0.0.1:PORT` for each: the imports (most of an app's start)
    are paid once, and each app is a process that forked after importing
    `idempotence`, as a pre-fork server's workers are. Ends at EOF."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reap themselves
    for line in sys.stdin:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            # The app dies with the zygote (prctl PR_SET_PDEATHSIG, SIGKILL).
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            sys.stdin.close()

            def report(port: int) -> None:
                os.write(write, b"%d" % port)
                os.close(write)

            serve(json.loads(line), report)
            os._exit(0)
        os.close(write)
        port = os.read(read, 16).decode()
        os.close(read)
        print("%d 127.0.0.1:%s" % (pid, port), flush=True)


def main() -> None:
    if sys.argv[1:] == ["--zygote"]:
        zygote()
        return
    serve(dict(os.environ), lambda port: print("listening on 127.0.0.1:%d" % port, flush=True))


if __name__ == "__main__":
    main()
