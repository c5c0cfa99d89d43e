#!/usr/bin/env bash
# Runs the Python package's tests against the extension the workspace's
# debug build made: no second build. The package is assembled under
# target/python/site (the pure-Python files and the shared library as
# `_native.abi3.so`), pytest runs in a virtual environment under
# target/python/venv, made again only when requirements-test.txt changes.
# Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
# `cargo build` leaves the library in debug/; `cargo test` builds it for
# the examples and leaves it in debug/deps/. The newer one is this build's.
# `ls` fails when one of them is missing, so only those that exist are
# compared (a fresh clone's `cargo test --no-run` leaves only deps/).
library=
for candidate in "$target"/debug/libidempotence.so "$target"/debug/deps/libidempotence.so; do
    if [[ -f $candidate && ( -z $library || $candidate -nt $library ) ]]; then
        library=$candidate
    fi
done
if [[ -z $library ]]; then
    echo "no libidempotence.so in $target/debug: build the workspace first (cargo test --no-run)" >&2
    exit 1
fi
site=$target/python/site
rm -rf "$site"
mkdir -p "$site/idempotence"
cp idem-python/python/idempotence/*.py idem-python/python/idempotence/*.pyi \
    idem-python/python/idempotence/py.typed "$site/idempotence/"
cp "$library" "$site/idempotence/_native.abi3.so"

venv=$target/python/venv
requirements=idem-python/requirements-test.txt
if ! cmp -s "$requirements" "$venv/requirements-test.txt" 2>/dev/null; then
    python3 -m venv --clear "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$venv/requirements-test.txt"
fi

# The Rust side of the interop test, as the workspace build made it.
export IDEM_PYTHON_INTEROP=${IDEM_PYTHON_INTEROP:-$target/debug/examples/interop}
# pytest exits 5 when it collects no test; `set -e` fails the run then.
PYTHONPATH=$(cd "$site" && pwd) "$venv/bin/python" -m pytest idem-python/tests \
    -p no:cacheprovider -ra "$@"

# The HTTP behaviour suite (dev/idem-http-suite) on the FastAPI app behind
# the ASGI middleware, as the workspace's test build made it: cargo names
# the binary (no build when it is fresh). IDEM_PYTHON_HTTP_SUITE=skip
# leaves it out.
if [[ ${IDEM_PYTHON_HTTP_SUITE:-} != skip ]]; then
    suite=$(cargo test --workspace --locked --no-run --message-format=json 2>/dev/null |
        python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") \
            and "idem-http-suite" in m["package_id"] and m["target"]["name"] == "http":
        print(m["executable"])')
    if [[ -z $suite ]]; then
        echo "the HTTP suite's test binary was not built" >&2
        exit 1
    fi
    PYTHONPATH=$(cd "$site" && pwd) IDEM_HTTP_SUITE_PYTHON=$(cd "$venv/bin" && pwd)/python \
        IDEM_HTTP_SUITE_ADAPTERS=fastapi "$suite" -q
fi
