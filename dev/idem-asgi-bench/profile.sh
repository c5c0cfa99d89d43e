#!/usr/bin/env bash
# Profiles one row's server under wrk (first executions or replays): perf
# over the whole process (every thread, Python's and tokio's, by shared
# object and symbol) and py-spy over its Python thread. Run run.sh once
# first (it builds and assembles target/asgi-bench). Not run in CI.
#   profile.sh ROW first|replay [SECONDS]      output in target/asgi-bench/profile/
set -euo pipefail
row=${1:?row}; mode=${2:?first or replay}; seconds=${3:-8}
cd "$(dirname "$0")/../.."
bench=$(pwd)/dev/idem-asgi-bench
out=target/asgi-bench/profile/$row-$mode
mkdir -p "$out"
venv=$(pwd)/target/asgi-bench/venv
site=$(cd target/asgi-bench/site && pwd)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
rport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --loglevel warning >/dev/null &
redis=$!
sleep 0.5
(cd "$bench" && ASGI_BENCH_ROW=$row ASGI_BENCH_REDIS=redis://127.0.0.1:$rport PYTHONPATH=$site:$bench \
    exec "$venv/bin/python" -m uvicorn app:app --host 127.0.0.1 --port "$port" --loop uvloop \
    --http httptools --no-access-log --log-level warning) &
server=$!
trap 'kill $server $redis 2>/dev/null; wait $server $redis 2>/dev/null || true' EXIT
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
prefix=p$$
if [[ $mode == replay ]]; then
    # The keys replayed: recorded once by a short run that cycles over them.
    wrk -t1 -c1 -d3s -s "$bench/keys.lua" "http://127.0.0.1:$port/pay" -- replay "$prefix" 200 >/dev/null
fi
wrk -t2 -c32 -d$((seconds * 2 + 4))s -s "$bench/keys.lua" "http://127.0.0.1:$port/pay" -- "$mode" "$prefix" 200 \
    >"$out/wrk.txt" &
wrkpid=$!
sleep 2
perf record -F 499 -g -p "$server" -o "$out/perf.data" -- sleep "$seconds" 2>/dev/null
"$venv/bin/py-spy" record --pid "$server" --duration "$seconds" --rate 250 --format raw \
    --output "$out/py-spy.txt" >/dev/null 2>&1 || true
wait $wrkpid
report() { perf report -i "$out/perf.data" --no-children --stdio -g none "$@" 2>/dev/null | grep -v '^#' | grep -v '^$' || true; }
report --sort comm,dso | head -30 >"$out/by-dso.txt"
report --sort dso,sym | head -80 >"$out/by-symbol.txt"
# py-spy's collapsed stacks: the share of samples under each frame (total).
python3 - "$out/py-spy.txt" >"$out/py-frames.txt" <<'PY'
import collections, sys
total, under = 0, collections.Counter()
for line in open(sys.argv[1]):
    stack, _, count = line.rstrip().rpartition(" ")
    count = int(count); total += count
    for frame in set(stack.split(";")):
        under[frame] += count
for frame, n in under.most_common(60):
    print(f"{n / total * 100:5.1f}%  {frame}")
PY
grep "Requests/sec" "$out/wrk.txt"
echo "profile in $out"
