#!/usr/bin/env bash
# Runs bench.py against the release build of the extension, in a virtual
# environment under target/ made from requirements.txt. Needs Redis on
# 127.0.0.1:6379. Not run in CI. Arguments go to bench.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p idem-python
site=target/python-bench/site
rm -rf "$site" && mkdir -p "$site/idempotence"
cp idem-python/python/idempotence/*.py "$site/idempotence/"
cp target/release/libidempotence.so "$site/idempotence/_native.abi3.so"
venv=target/python-bench/venv
if [[ ! -x $venv/bin/python ]]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q -r dev/idem-python-bench/requirements.txt
fi
PYTHONPATH=$(cd "$site" && pwd) "$venv/bin/python" dev/idem-python-bench/bench.py "$@"
