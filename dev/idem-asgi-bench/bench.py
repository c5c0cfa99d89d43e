"""The ASGI middleware's throughput and CPU per request beside the peers',
on one FastAPI handler (`app.py`: `POST /pay`, a small JSON body, one
Redis `INCR`) served by uvicorn (one worker, one loop), in one run.

Every row's server runs at once, each its own uvicorn process, on one Redis
of the run's own (a `redis-server` on a free port, nothing saved). wrk
drives one server at a time with `keys.lua`: first executions (a fresh key
each request) and replays (the keys recorded before the first round, in
turn). Each round runs every row once, in an order rotated by the round;
a row's figure is the median of its rounds. CPU per request is the server
process's CPU time (all its threads, from /proc) over the requests wrk
completed; Redis's is beside it. Not run in CI: `run.sh [options]`.

`--rows …,idem-nocheck` adds idem without idem-http's unscoped-record
read; `--base-site DIR --rows none,idem,idem-base` runs idem twice, the
`-base` row importing idempotence from DIR (a change measured in one
run); `--from-json` prints a saved run again. `profile.sh` profiles a row.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
ROWS = {
    "none": "no idempotency",
    "idem": "idem",
    "idem-near": "idem, near cache",
    "idem-nocheck": "idem, no unscoped check",
    "idemkit": "idemkit",
    "setnx": "`SETNX` recipe",
    "powertools": "Powertools",
}
PEERS = ("idemkit", "setnx", "powertools")
BODY = b'{"amount":1250,"currency":"EUR"}'
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, process: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{what} exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{what} did not listen on {port} in 30 s")


def cpu_seconds(pid: int) -> float:
    """The process's user and system time, all threads, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def post(port: int, key: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request(
        "POST", "/pay", BODY, {"Content-Type": "application/json", "Idempotency-Key": key}
    )
    response = connection.getresponse()
    result = response.status, response.read()
    connection.close()
    return result


def record(port: int, prefix: str, count: int) -> None:
    """Runs keys `prefix-0 .. prefix-(count-1)` once each, so that a replay
    round finds them completed; a second call of one must replay it."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for i in range(count):
        connection.request(
            "POST", "/pay", BODY,
            {"Content-Type": "application/json", "Idempotency-Key": f"{prefix}-{i}"},
        )
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise SystemExit(f"recording {prefix}-{i}: {response.status} {body[:200]!r}")
    connection.close()
    first = post(port, f"{prefix}-0")
    again = post(port, f"{prefix}-0")
    if prefix.startswith("rep-none-"):
        return  # no idempotency: the handler runs again
    if first != again:
        raise SystemExit(f"{prefix}-0 did not replay: {first!r} then {again!r}")


def wrk(args, port: int, mode: str, prefix: str, duration: str) -> dict:
    command = [
        args.wrk, f"-t{args.threads}", f"-c{args.connections}", f"-d{duration}",
        "-s", str(HERE / "keys.lua"), f"http://127.0.0.1:{port}/pay",
        "--", mode, prefix, str(args.keys),
    ]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    done = int(re.search(r"(\d+) requests in", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    return {
        "requests": done,
        "rate": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "bad": int(bad.group(1)) if bad else 0,
        "errors": errors.group(1).strip() if errors else "",
    }


def measure(args, server, redis_pid, mode, prefix, duration) -> dict:
    cpu = cpu_seconds(server.pid)
    rcpu = cpu_seconds(redis_pid)
    result = wrk(args, server.port, mode, prefix, duration)
    result["cpu_us"] = (cpu_seconds(server.pid) - cpu) / max(result["requests"], 1) * 1e6
    result["redis_us"] = (cpu_seconds(redis_pid) - rcpu) / max(result["requests"], 1) * 1e6
    if result["bad"] or result["errors"]:
        print(f"  {server.row} {mode}: {result['bad']} non-2xx, socket errors {result['errors']!r}", file=sys.stderr)
    return result


def table(rows, first, replay) -> list[str]:
    def med(samples, row, field):
        return statistics.median(s[field] for s in samples[row])

    base_first = med(first, "none", "rate")
    base_replay = med(replay, "none", "rate")
    lines = [
        "| | " + " | ".join(ROWS[r] for r in rows) + " |",
        "|---|" + "---:|" * len(rows),
    ]
    for label, samples, base in (("first executions, req/s", first, base_first), ("replays, req/s", replay, base_replay)):
        lines.append(f"| {label} | " + " | ".join(
            f"{med(samples, r, 'rate'):,.0f} ({med(samples, r, 'rate') / base:.2f}×)" for r in rows) + " |")
    for label, samples in (("CPU µs/req, first", first), ("CPU µs/req, replay", replay)):
        lines.append(f"| {label} | " + " | ".join(f"{med(samples, r, 'cpu_us'):.0f}" for r in rows) + " |")
    return lines


def card(rows, first, replay) -> list[str]:
    """BENCHMARKS.md's table: req/s (÷ no idempotency) and CPU µs/req."""

    def cell(samples, row, base):
        rate = statistics.median(s["rate"] for s in samples[row])
        cpu = statistics.median(s["cpu_us"] for s in samples[row])
        return f"{rate:,.0f} ({rate / base:.2f}×), {cpu:.0f} µs"

    base = {w: statistics.median(s["rate"] for s in samples["none"])
            for w, samples in (("first", first), ("replay", replay))}
    return [
        "| req/s (÷ none), CPU/req | " + " | ".join(ROWS[r] for r in rows) + " |",
        "|---|" + "---:|" * len(rows),
        "| first execution | " + " | ".join(cell(first, r, base["first"]) for r in rows) + " |",
        "| replay | " + " | ".join(cell(replay, r, base["replay"]) for r in rows) + " |",
    ]


def targets(rows, first, replay) -> list[str]:
    def med(samples, row):
        return statistics.median(s["rate"] for s in samples[row])

    peers = [p for p in PEERS if p in rows]
    out = []
    if not peers or "idem" not in rows:
        return out
    best_first = max(peers, key=lambda p: med(first, p))
    best_replay = max(peers, key=lambda p: med(replay, p))
    checks = [
        ("first ÷ no idempotency", med(first, "idem") / med(first, "none"), 0.75),
        (f"first ÷ best peer ({best_first})", med(first, "idem") / med(first, best_first), 1.25),
        (f"replays ÷ best peer ({best_replay})", med(replay, "idem") / med(replay, best_replay), 1.2),
    ]
    if "idem-near" in rows:
        checks.append((f"replays, near cache ÷ best peer ({best_replay})",
                       med(replay, "idem-near") / med(replay, best_replay), 2.0))
        checks.append(("first, near cache ÷ no idempotency",
                       med(first, "idem-near") / med(first, "none"), 0.75))
    for what, ratio, target in checks:
        out.append(f"{what}: {ratio:.2f}× (target ≥ {target}×, {'met' if ratio >= target else 'missed'})")
    return out


class Server:
    def __init__(self, args, row: str, redis_url: str):
        self.row = row
        self.port = free_port()
        site = args.base_site if row.endswith("-base") else os.environ.get("PYTHONPATH", "")
        env = dict(os.environ, ASGI_BENCH_ROW=row, ASGI_BENCH_REDIS=redis_url, PYTHONPATH=os.pathsep.join(
            p for p in (str(HERE), site) if p))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "app:app", "--host", "127.0.0.1", "--port", str(self.port),
             "--loop", args.loop, "--http", args.http, "--no-access-log", "--log-level", "warning"],
            env=env, cwd=HERE,
        )
        self.pid = self.process.pid
        wait_port(self.port, self.process, f"the {row} server")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", default="5s", help="of each wrk run")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2, help="wrk's")
    parser.add_argument("--keys", type=int, default=1000, help="recorded for the replays")
    parser.add_argument("--rows", default=",".join(r for r in ROWS if r != "idem-nocheck"),
                        help=f"of {', '.join(ROWS)}")
    parser.add_argument("--loop", default="uvloop")
    parser.add_argument("--http", default="httptools")
    parser.add_argument("--wrk", default="wrk")
    parser.add_argument("--base-site", help="where rows named ROW-base import idempotence from")
    parser.add_argument("--markdown", help="a file whose idem-asgi-bench block gets the table")
    parser.add_argument("--json", help="write every sample here")
    parser.add_argument("--from-json", help="print (and --markdown) a run saved by --json; run nothing")
    args = parser.parse_args()
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        first, replay, load = saved["first"], saved["replay"], saved["load"]
        rows = [r for r in first if r in ROWS]
        report(args, rows, first, replay, load)
        return
    rows = [r for r in args.rows.split(",") if r]
    for r in rows:
        if r.endswith("-base") and r.removesuffix("-base") in ROWS and args.base_site:
            ROWS[r] = ROWS[r.removesuffix("-base")] + " (base build)"
        elif r not in ROWS:
            raise SystemExit(f"unknown row {r!r}")

    redis_port = free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--loglevel", "warning"],
        stdout=subprocess.DEVNULL,
    )
    servers = []
    try:
        wait_port(redis_port, redis, "redis-server")
        redis_url = f"redis://127.0.0.1:{redis_port}"
        servers = [Server(args, row, redis_url) for row in rows]
        run = f"{os.getpid()}-{int(time.time())}"
        for server in servers:
            record(server.port, f"rep-{server.row}-{run}", args.keys)
        first = {r: [] for r in rows}
        replay = {r: [] for r in rows}
        for round_ in range(args.rounds + 1):  # round 0 warms up, not counted
            order = servers[round_ % len(servers):] + servers[:round_ % len(servers)]
            duration = "1s" if round_ == 0 else args.duration
            for server in order:
                f = measure(args, server, redis.pid, "first", f"f{round_}-{server.row}-{run}", duration)
                r = measure(args, server, redis.pid, "replay", f"rep-{server.row}-{run}", duration)
                if round_:
                    first[server.row].append(f)
                    replay[server.row].append(r)
                print(f"round {round_} {server.row:10} first {f['rate']:8.0f} req/s {f['cpu_us']:6.0f} µs/req"
                      f"  replay {r['rate']:8.0f} req/s {r['cpu_us']:6.0f} µs/req", file=sys.stderr, flush=True)
    finally:
        for server in servers:
            server.process.terminate()
        for server in servers:
            server.process.wait()
        redis.terminate()
        redis.wait()

    load = Path("/proc/loadavg").read_text().split()[:3]
    if args.json:
        Path(args.json).write_text(json.dumps({"first": first, "replay": replay, "load": load}, indent=1))
    report(args, rows, first, replay, load)


def report(args, rows, first, replay, load) -> None:
    print(f"{args.rounds} rounds x {args.duration} per row and workload, wrk -t{args.threads} "
          f"-c{args.connections}, uvicorn --loop {args.loop} --http {args.http}; medians; "
          f"load average {' '.join(load)}")
    lines = table(rows, first, replay)
    print("\n".join(lines))
    print()
    print("Redis CPU µs/req, first / replay: " + ", ".join(
        f"{r} {statistics.median(s['redis_us'] for s in first[r]):.0f} / "
        f"{statistics.median(s['redis_us'] for s in replay[r]):.0f}" for r in rows))
    for line in targets(rows, first, replay):
        print(line)
    if args.markdown:
        path = Path(args.markdown)
        text = path.read_text()
        begin, end = "<!-- BEGIN idem-asgi-bench -->", "<!-- END idem-asgi-bench -->"
        if begin not in text or end not in text:
            raise SystemExit(f"{path} has no {begin} ... {end} block")
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        # The card keeps the rows; a diagnostic row stays in the note.
        shown = card([r for r in rows if r != "idem-nocheck" and not r.endswith("-base")], first, replay)
        path.write_text(head + begin + "\n" + "\n".join(shown) + "\n" + end + tail)


if __name__ == "__main__":
    main()
