#!/usr/bin/env bash
# Runs the Node package's tests against the addon the workspace's debug
# build made (target/debug/deps/libidem_node.so, found by lib/native.js):
# no second build. Test dependencies are installed by `npm ci` from the
# lockfile into target/node, again only when package-lock.json changes.
# Arguments go to `node --test`.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
export CARGO_TARGET_DIR=$(cd "$target" && pwd)
if [[ ! -f $target/debug/libidem_node.so && ! -f $target/debug/deps/libidem_node.so ]]; then
    echo "no libidem_node.so in $target/debug: build the workspace first (cargo test --no-run)" >&2
    exit 1
fi

# The lockfile's packages, kept under target/ and linked as node_modules.
modules=$target/node
if ! cmp -s idem-node/package-lock.json "$modules/package-lock.json" 2>/dev/null; then
    rm -rf "$modules"
    mkdir -p "$modules"
    cp idem-node/package.json idem-node/package-lock.json "$modules/"
    (cd "$modules" && npm ci --no-audit --no-fund --loglevel=error --cache "$PWD/.npm-cache")
    mkdir -p "$modules/node_modules"
fi
ln -sfn "$(cd "$modules" && pwd)/node_modules" idem-node/node_modules

# The Rust side of the interop tests, as the workspace build made them.
export IDEM_NODE_INTEROP=${IDEM_NODE_INTEROP:-$CARGO_TARGET_DIR/debug/examples/interop}
export IDEM_NODE_RECORD=${IDEM_NODE_RECORD:-$CARGO_TARGET_DIR/debug/examples/record}
export IDEM_PYTHON_SITE=${IDEM_PYTHON_SITE:-$CARGO_TARGET_DIR/python/site}
export IDEM_PYTHON=${IDEM_PYTHON:-$CARGO_TARGET_DIR/python/venv/bin/python}
(cd idem-node && node --test "$@" test/*.test.js)

# The HTTP behaviour suite (dev/idem-http-suite) on the Express app behind
# the middleware, as the workspace's test build made it: cargo names the
# binary (no build when it is fresh). Then its cross test, where axum,
# FastAPI (when idem-python/ci.sh has made its environment) and Express
# services on one store replay each other's responses byte for byte.
# IDEM_NODE_HTTP_SUITE=skip leaves it out.
if [[ ${IDEM_NODE_HTTP_SUITE:-} != skip ]]; then
    suite=$(cargo test --workspace --locked --no-run --message-format=json 2>/dev/null |
        node -e '
let input = "";
process.stdin.on("data", (chunk) => (input += chunk));
process.stdin.on("end", () => {
    for (const line of input.split("\n")) {
        if (!line.startsWith("{")) continue;
        const m = JSON.parse(line);
        if (m.reason === "compiler-artifact" && m.executable &&
                m.package_id.includes("idem-http-suite") && m.target.name === "http") {
            console.log(m.executable);
        }
    }
});')
    if [[ -z $suite ]]; then
        echo "the HTTP suite's test binary was not built" >&2
        exit 1
    fi
    export IDEM_HTTP_SUITE_NODE=$(command -v node)
    IDEM_HTTP_SUITE_ADAPTERS=express "$suite" -q --skip cross::
    adapters=express
    if [[ -x $IDEM_PYTHON && -d $IDEM_PYTHON_SITE ]]; then
        adapters=express,fastapi
        export IDEM_HTTP_SUITE_PYTHON=$IDEM_PYTHON
        export PYTHONPATH=$(cd "$IDEM_PYTHON_SITE" && pwd)
    elif [[ -n ${CI:-} ]]; then
        echo "no Python environment at $IDEM_PYTHON for the cross test: run idem-python/ci.sh first" >&2
        exit 1
    fi
    IDEM_HTTP_SUITE_ADAPTERS=$adapters "$suite" -q cross::
fi
