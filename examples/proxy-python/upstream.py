#!/usr/bin/env python3
"""A payments service on Python's standard library alone, to run behind
idem-proxy. It knows nothing of idempotency: the proxy in front of it runs
each keyed POST once and replays the answer to retries.

    python3 upstream.py --port 3000
    idem-proxy --listen 127.0.0.1:8080 --upstream http://127.0.0.1:3000

It counts its effects (`GET /effects`) and logs each run with its key and
time (`GET /runs`), which idem's tests read. `POST /charges` is the
upstream that records the key the proxy passes on (`Idempotency-Key`) and
refuses to charge twice under it (with `x-gate: 1` it answers only after a
`POST /gate`); the other routes are the HTTP behaviour
suite's: `/payments`, `/other`, `/binary`, `/gated` (waits for a
`POST /gate`), `/flaky`, `/big`, `/broken`, `/panic` and `/slow`;
`/headers` answers the request's headers. Under `/demo` it is the payments
API `idem-demo storm` drives (`GET /demo/healthz`, `POST /demo/payments`,
`GET /demo/payments`), charging once per request it receives:

    idem-proxy --upstream http://127.0.0.1:3000/demo --listen 127.0.0.1:8080
    idem-demo storm --url http://127.0.0.1:8080
"""

import argparse
import json
import secrets
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

lock = threading.Lock()
runs = []  # (path, key, time) of each run, in order
gate = threading.Semaphore(0)
charged = {}  # key -> the body answered under it
ledger = []  # the demo API's charges


def run(path, key):
    """Counts one run and returns its number (1 for the first)."""
    with lock:
        runs.append((path, key, time.time()))
        return len(runs)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the proxy's pool expects

    def log_message(self, *args):
        pass

    def body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length)

    def answer(self, status, body, content_type="text/plain", headers=()):
        if isinstance(body, str):
            body = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path in ("/payments", "/effects"):
            with lock:
                count = len(runs)
            self.answer(200, str(count))
        elif self.path == "/headers":
            self.answer(200, json.dumps(dict(self.headers.items())), "application/json")
        elif self.path == "/demo/healthz":
            self.answer(200, '{"status":"ok"}', "application/json")
        elif self.path == "/demo/payments":
            with lock:
                charges = list(ledger)
            self.answer(200, json.dumps({"charges": charges}), "application/json")
        elif self.path == "/runs":
            with lock:
                listed = [list(r) for r in runs]
            self.answer(200, json.dumps(listed), "application/json")
        else:
            self.answer(404, "not found")

    def do_PATCH(self):
        self.do_POST()

    def do_POST(self):
        body = self.body()
        key = self.headers.get("Idempotency-Key")
        path = self.path.split("?")[0]
        if path in ("/payments", "/other"):
            n = run(path, key)
            tenant = self.headers.get("x-tenant", "-")
            payment = '{"run":%d,"tenant":"%s","echo":%d}' % (n, tenant, len(body))
            self.answer(201, payment, "application/json", [
                ("Set-Cookie", "session=s%d; HttpOnly" % n),
                ("x-multi", "a"),
                ("x-multi", "b"),
                ("x-run", str(n)),
            ])
        elif path == "/charges":
            with lock:
                if key is not None and key in charged:
                    answer = charged[key]
                else:
                    runs.append((path, key, time.time()))
                    answer = '{"charge":%d}' % len(runs)
                    if key is not None:
                        charged[key] = answer
            if self.headers.get("x-gate"):
                gate.acquire()
            self.answer(201, answer, "application/json")
        elif path == "/headers":
            run(path, key)
            self.answer(201, json.dumps(dict(self.headers.items())), "application/json")
        elif path == "/demo/payments":
            self.demo_payment(body, key)
        elif path == "/binary":
            n = run(path, key)
            self.answer(202, bytes(range(256)) + bytes([n % 256]), "application/octet-stream")
        elif path == "/gated":
            n = run(path, key)
            gate.acquire()
            self.answer(201, "run %d" % n)
        elif path == "/gate":
            gate.release()
            self.answer(204, b"")
        elif path == "/flaky":
            n = run(path, key)
            if n == 1:
                self.answer(503, "try again")
            else:
                self.answer(201, "run %d" % n)
        elif path == "/big":
            run(path, key)
            self.answer(200, b"x" * 4096, "application/octet-stream")
        elif path == "/broken":
            # Half a response, then the connection drops.
            run(path, key)
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"half a response")
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
        elif path == "/panic":
            # The process fails mid-request: no answer at all.
            run(path, key)
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
        elif path == "/slow":
            n = run(path, key)
            time.sleep(float(self.headers.get("x-delay", "1")))
            self.answer(201, "run %d" % n)
        else:
            self.answer(404, "not found")

    def demo_payment(self, body, key):
        """A charge for every request that arrives: the proxy in front is
        what makes a retry a replay."""
        try:
            payment = json.loads(body)
            amount, currency = int(payment["amount"]), str(payment["currency"])
        except (ValueError, KeyError, TypeError):
            self.answer(400, '{"title":"bad payment"}', "application/json")
            return
        if key is None or amount <= 0:
            self.answer(400, '{"title":"bad payment"}', "application/json")
            return
        # The key may come as a structured-field string: "order-7f3a".
        if len(key) >= 2 and key[0] == key[-1] == '"':
            key = key[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        charge = {
            "id": "ch_" + secrets.token_hex(8),
            "amount": amount,
            "currency": currency,
            "idempotency_key": key,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        with lock:
            ledger.append(charge)
            runs.append(("/demo/payments", key, time.time()))
        self.answer(201, json.dumps(charge), "application/json")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=3000)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print("listening on 127.0.0.1:%d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
