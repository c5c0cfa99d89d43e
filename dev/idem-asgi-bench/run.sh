#!/usr/bin/env bash
# Runs bench.py against the release build of the extension, in a virtual
# environment under target/ made from requirements.txt (again when it
# changes). Needs wrk (Debian: apt-get install wrk) and redis-server on the
# PATH; the run starts its own Redis. Not run in CI. Arguments go to
# bench.py, e.g. `--markdown BENCHMARKS.md`.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p idem-python
site=target/asgi-bench/site
rm -rf "$site" && mkdir -p "$site/idempotence"
cp idem-python/python/idempotence/*.py "$site/idempotence/"
cp target/release/libidempotence.so "$site/idempotence/_native.abi3.so"
venv=target/asgi-bench/venv
requirements=dev/idem-asgi-bench/requirements.txt
if ! cmp -s "$requirements" "$venv/requirements.txt" 2>/dev/null; then
    python3 -m venv --clear "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$venv/requirements.txt"
fi
PYTHONPATH=$(cd "$site" && pwd) "$venv/bin/python" dev/idem-asgi-bench/bench.py "$@"
