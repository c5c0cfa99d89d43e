'use strict';
// Across processes: a stampede of duplicates in several Node processes,
// and Rust's `execute` and Python's `@idempotent` on the same records.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const { fork, execFileSync } = require('node:child_process');
const { openStore, makeIdempotent, idempotentHandler, MismatchError, InProgressError } = require('..');
const { SHARED, storeUrl, namespace, scratch } = require('./stores');

const target = process.env.CARGO_TARGET_DIR || path.join(__dirname, '..', '..', 'target');
const INTEROP = process.env.IDEM_NODE_INTEROP || path.join(target, 'debug', 'examples', 'interop');
const RECORD = process.env.IDEM_NODE_RECORD || path.join(target, 'debug', 'examples', 'record');
const PYTHON = process.env.IDEM_PYTHON || path.join(target, 'python', 'venv', 'bin', 'python');
const PYTHON_SITE = process.env.IDEM_PYTHON_SITE || path.join(target, 'python', 'site');

/** `file`, or a skip (a failure under CI) when the build has not made it. */
function needed(t, file, what) {
  if (fs.existsSync(file)) return true;
  const reason = `no ${what} at ${file}; build the workspace first (cargo test --no-run)`;
  if (process.env.CI) throw new Error(`${reason} (CI is set, so this fails instead of skipping)`);
  t.skip(reason);
  return false;
}

function worker(args) {
  return new Promise((resolve, reject) => {
    const child = fork(path.join(__dirname, 'fixtures', 'stampede-worker.js'), args);
    let answers;
    child.on('message', (message) => {
      answers = message;
    });
    child.on('error', reject);
    child.on('exit', (code) => (code === 0 && answers ? resolve(answers) : reject(new Error(`worker exited ${code}`))));
  });
}

for (const kind of SHARED) {
  test(`200 keys x 20 duplicates in 4 processes run 200 times [${kind}]`, async (t) => {
    const url = await storeUrl(t, kind);
    if (url === null) return;
    const keys = 200;
    const processes = 4;
    const duplicates = 5;
    const ns = namespace();
    const effects = path.join(scratch(), 'effects');
    fs.writeFileSync(effects, '');
    const all = await Promise.all(
      Array.from({ length: processes }, () => worker([url, ns, String(keys), String(duplicates), effects])),
    );
    const ran = fs.readFileSync(effects, 'utf8').split('\n').filter(Boolean);
    assert.equal(ran.length, keys, 'one execution per key');
    assert.equal(new Set(ran).size, keys);
    // Every duplicate in every process got the one outcome of its key, or
    // a refusal before the work from a store that did not answer in time.
    const refused = all.reduce((sum, one) => sum + one.refused, 0);
    if (refused > 0) t.diagnostic(`${refused} of ${keys * processes * duplicates} calls refused by the store before the work`);
    const answers = new Map();
    for (const { answers: byKey } of all) {
      assert.equal(byKey.error, undefined, JSON.stringify(byKey.error));
      for (const [key, values] of Object.entries(byKey)) {
        for (const value of values) (answers.get(key) || answers.set(key, new Set()).get(key)).add(value);
      }
    }
    assert.equal(answers.size, keys);
    for (const [key, values] of answers) assert.equal(values.size, 1, `${key}: ${[...values]}`);
  });
}

for (const kind of SHARED) {
  test(`a process killed mid-call: no second run while its lease lives [${kind}]`, async (t) => {
    const url = await storeUrl(t, kind);
    if (url === null) return;
    const ns = namespace();
    const effects = path.join(scratch(), 'effects');
    fs.writeFileSync(effects, '');
    const child = fork(path.join(__dirname, 'fixtures', 'killed-worker.js'), [url, ns, effects]);
    await new Promise((resolve, reject) => {
      child.once('message', resolve);
      child.once('exit', (code) => reject(new Error(`worker exited ${code} before running`)));
    });
    const gone = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGKILL');
    await gone;
    let runs = 0;
    const retry = makeIdempotent(async () => ++runs, { store: openStore(url), key: 0, namespace: ns });
    const error = await retry('k').catch((e) => e);
    assert.ok(error instanceof InProgressError, String(error));
    assert.ok(error.retryAfter > 0 && error.retryAfter <= 30, String(error.retryAfter));
    assert.equal(runs, 0);
    assert.equal(fs.readFileSync(effects, 'utf8'), 'ran\n');
  });
}

for (const kind of SHARED) {
  test(`a server killed mid-request: no second run while its lease lives [${kind}]`, async (t) => {
    const url = await storeUrl(t, kind);
    if (url === null) return;
    const ns = namespace();
    const effects = path.join(scratch(), 'effects');
    fs.writeFileSync(effects, '');
    const child = fork(path.join(__dirname, 'fixtures', 'killed-server.js'), [url, ns, effects]);
    const gone = new Promise((resolve) => child.once('exit', resolve));
    const messages = [];
    let arrived;
    child.on('message', (message) => {
      messages.push(message);
      if (arrived) arrived();
    });
    const message = async () => {
      while (messages.length === 0) await new Promise((resolve) => (arrived = resolve));
      return messages.shift();
    };
    const request = (port) =>
      fetch(`http://127.0.0.1:${port}/payments`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': 'k' },
        body: '{"amount":1250}',
      });
    try {
      const port = await message();
      // The first request never gets an answer: its server dies.
      const first = request(port).catch((error) => error);
      assert.equal(await message(), 'running');
      child.kill('SIGKILL');
      await gone;
      assert.ok((await first) instanceof Error);
    } finally {
      child.kill('SIGKILL');
    }
    // Another server on the same store: the retry finds the dead
    // server's lease and runs nothing.
    let runs = 0;
    const server = http.createServer(
      idempotentHandler({ store: openStore(url), namespace: ns, lease: 30 }, (req, res) => {
        runs += 1;
        res.end('ran again');
      }),
    );
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const retry = await request(server.address().port);
      assert.equal(retry.status, 409);
      assert.match((await retry.json()).type, /in-progress/);
      const after = Number(retry.headers.get('retry-after'));
      assert.ok(after > 0 && after <= 30, String(after));
      assert.equal(runs, 0);
      assert.equal(fs.readFileSync(effects, 'utf8'), 'ran\n');
    } finally {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    }
  });
}

function rust(url, ns, key, body, outcome) {
  return execFileSync(INTEROP, [url, ns, key, JSON.stringify(body), JSON.stringify(outcome)], {
    encoding: 'utf8',
  }).trim();
}

function record(url, ns, key) {
  return execFileSync(RECORD, [url, ns, key], { encoding: 'utf8' }).trim();
}

const PY_CALL = `
import json, sys
from idempotence import Mismatch, idempotent, open_store
url, ns, key, body, outcome = sys.argv[1:]
ran = []
@idempotent(open_store(url), key="key", body="body", namespace=ns)
def work(key, body):
    ran.append(1)
    return json.loads(outcome)
try:
    value = work(key, json.loads(body))
    print(("ran " if ran else "replayed ") + json.dumps(value, separators=(",", ":"), sort_keys=True))
except Mismatch:
    print("mismatch")
`;

for (const kind of SHARED) {
  test(`makeIdempotent, Rust's execute and Python's @idempotent share one outcome [${kind}]`, async (t) => {
    const url = await storeUrl(t, kind);
    if (url === null) return;
    if (!needed(t, INTEROP, "the Rust caller (idem-python's interop example)")) return;
    if (!needed(t, RECORD, "the record reader (idem-node's record example)")) return;
    const ns = namespace();
    const body = { amount: 1250, currency: 'EUR', lines: [{ sku: 'a', n: 2 }], note: 'café' };
    const outcome = { id: 'ch_1', status: 'succeeded', amount: 12.5, tags: ['x'], ok: true, none: null };
    let runs = 0;
    const charge = makeIdempotent(
      async (key, request) => {
        runs += 1;
        return { ...outcome, by: 'node' };
      },
      { store: openStore(url), key: 0, body: 1, namespace: ns },
    );

    // Rust first: Node replays Rust's outcome.
    const fromRust = { ...outcome, by: 'rust' };
    assert.equal(rust(url, ns, 'rust-first', body, fromRust), `ran ${JSON.stringify(sortKeys(fromRust))}`);
    assert.deepEqual(await charge('rust-first', body), fromRust);
    assert.equal(runs, 0);
    // Node first: Rust replays Node's.
    assert.deepEqual(await charge('node-first', body), { ...outcome, by: 'node' });
    assert.equal(runs, 1);
    assert.equal(
      rust(url, ns, 'node-first', body, fromRust),
      `replayed ${JSON.stringify(sortKeys({ ...outcome, by: 'node' }))}`,
    );
    // The records are byte for byte what Rust's execute writes.
    assert.equal(
      record(url, ns, 'node-first'),
      `completed ${JSON.stringify(sortKeys({ ...outcome, by: 'node' }))}`,
    );
    assert.equal(record(url, ns, 'rust-first'), `completed ${JSON.stringify(sortKeys(fromRust))}`);
    // Another body is a mismatch, whichever language asks.
    assert.equal(rust(url, ns, 'node-first', { ...body, amount: 1 }, fromRust), 'mismatch');
    await assert.rejects(charge('rust-first', { ...body, amount: 1 }), MismatchError);

    if (!needed(t, PYTHON, 'the Python test environment (idem-python/ci.sh makes it)')) return;
    if (!needed(t, PYTHON_SITE, 'the Python package (idem-python/ci.sh assembles it)')) return;
    const python = (key, requestBody) =>
      execFileSync(PYTHON, ['-c', PY_CALL, url, ns, key, JSON.stringify(requestBody), '{"by":"python"}'], {
        encoding: 'utf8',
        env: { ...process.env, PYTHONPATH: PYTHON_SITE },
      }).trim();
    assert.equal(python('node-first', body), `replayed ${JSON.stringify(sortKeys({ ...outcome, by: 'node' }))}`);
    assert.equal(python('rust-first', body), `replayed ${JSON.stringify(sortKeys(fromRust))}`);
    assert.equal(python('node-first', { ...body, amount: 1 }), 'mismatch');
    assert.equal(python('python-first', body), 'ran {"by":"python"}');
    assert.deepEqual(await charge('python-first', body), { by: 'python' });
    assert.equal(runs, 1);
  });
}

/** `value` with every object's keys sorted, as serde_json writes a Value. */
function sortKeys(value) {
  if (Array.isArray(value)) return value.map(sortKeys);
  if (value && typeof value === 'object') {
    return Object.fromEntries(Object.keys(value).sort().map((k) => [k, sortKeys(value[k])]));
  }
  return value;
}
