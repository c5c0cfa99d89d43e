#!/usr/bin/env bash
# Profiles one server of the benchmark under wrk: `profile.sh SUBJECT
# first|replay [SECONDS]`. Prints the CPU each thread used per request
# (/proc/PID/task), then the perf samples (cpu-clock: this host's VM has no
# hardware counters) by thread and library and the hottest symbols, JIT
# frames named by --perf-basic-prof; writes node's own --cpu-prof profile
# and summarises it with profile-summary.js. Run after run.sh (release
# addon, node_modules). Output in $PROFILE_DIR (default /tmp/idem-node-profile).
set -euo pipefail
cd "$(dirname "$0")"
subject=$1 workload=$2 seconds=${3:-5}
out=${PROFILE_DIR:-/tmp/idem-node-profile}/$subject-$workload
rm -rf "$out" && mkdir -p "$out"
export IDEM_NODE_ADDON=${IDEM_NODE_ADDON:-$(cd ../../target/release && pwd)/libidem_node.so}
port=$((20000 + RANDOM % 20000))
prefix=prof-$subject-$RANDOM
node --perf-basic-prof --logfile="$out/v8.log" --no-logfile-per-isolate --cpu-prof --cpu-prof-dir="$out" server.js "$subject" "$port" "$prefix" >"$out/server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
until grep -q ready "$out/server.log"; do sleep 0.2; done
url=http://127.0.0.1:$port/pay
# Warm-up; for replays it also records the keys replay.lua cycles through
# (at 1 connection, so no key is in flight twice).
IDEM_WRK_PREFIX=$prefix-warm wrk -t1 -c32 -d1s -s ../idem-bench/wrk/first.lua "$url" >/dev/null
if [[ $workload == replay ]]; then
    script=replay.lua
    IDEM_WRK_PREFIX=$prefix-r wrk -t1 -c1 -d3s -s ../idem-bench/wrk/replay.lua "$url" >/dev/null
else
    script=first.lua
fi
# Per thread: id, name (the event loop's thread is "main"), CPU ticks.
threads() {
    for t in /proc/$pid/task/*; do
        name=$(tr ' ' _ <"$t/comm")
        [[ ${t##*/} == "$pid" ]] && name=main
        echo "${t##*/} $name $(awk '{print $14 + $15}' "$t/stat")"
    done | sort
}
threads >"$out/before"
perf record -q -e cpu-clock -F 999 -g -p $pid -o "$out/perf.data" -- sleep "$seconds" 2>/dev/null &
perf_pid=$!
IDEM_WRK_PREFIX=$prefix-r wrk -t2 -c32 -d${seconds}s -s ../idem-bench/wrk/$script "$url" >"$out/wrk.txt"
wait $perf_pid
threads >"$out/after"
requests=$(awk '/requests in/ {print $1}' "$out/wrk.txt")
tick=$(getconf CLK_TCK)
echo "== $subject $workload: $requests requests; CPU µs per request by thread"
join "$out/before" "$out/after" | awk -v n="$requests" -v t="$tick" \
    '{ d[$2] += $5 - $3 } END { for (k in d) if (d[k] > 0) printf "  %-16s %6.0f\n", k, d[k] / t / n * 1e6 }'
echo "== perf: samples by thread and library"
perf report -i "$out/perf.data" --no-children --sort comm,dso --stdio -g none 2>/dev/null >"$out/libraries.txt" || true
grep -v '^#' "$out/libraries.txt" | grep -v '^$' | head -10 || true
echo "== perf: hottest symbols"
perf report -i "$out/perf.data" --no-children --sort comm,sym --stdio -g none 2>/dev/null >"$out/symbols.txt" || true
grep -v '^#' "$out/symbols.txt" | grep -v '^$' | head -40 || true
kill -TERM $pid && wait $pid || true
trap - EXIT
echo "== node --cpu-prof (main thread)"
node profile-summary.js "$out"/*.cpuprofile 25
