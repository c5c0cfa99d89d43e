#!/usr/bin/env bash
# Runs bench.js against the release build of the addon (IDEM_NODE_ADDON
# points idem-node's loader at target/release), with this directory's
# lockfile installed by `npm ci`. Needs Redis on 127.0.0.1:6379 (or
# IDEM_REDIS_URL) and wrk. Not run in CI. Arguments go to bench.js, e.g.
# `run.sh --markdown BENCHMARKS.md` (7 rounds of 4 s by default).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p idem-node
target=${CARGO_TARGET_DIR:-target}
export IDEM_NODE_ADDON=$(cd "$target/release" && pwd)/libidem_node.so
bench=dev/idem-node-bench
# Installed again only when the lockfile changes.
if ! cmp -s "$bench/package-lock.json" "$bench/node_modules/.bench-lock" 2>/dev/null; then
    (cd "$bench" && npm ci --no-audit --no-fund --loglevel=error)
    cp "$bench/package-lock.json" "$bench/node_modules/.bench-lock"
fi
node "$bench/bench.js" "$@"
