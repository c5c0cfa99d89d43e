'use strict';
// makeIdempotent on every store: replays, refusals, errors and their
// classes. Executions are counted by the function's own side effects.

const test = require('node:test');
const assert = require('node:assert/strict');
const {
  openStore,
  makeIdempotent,
  InvalidKeyError,
  MismatchError,
  InProgressError,
  StoreError,
  EncodeError,
  RememberedError,
} = require('..');
const { STORES, storeUrl, namespace } = require('./stores');

/** Defines `name` once per store kind, given an opened store. */
function each(name, body) {
  for (const kind of STORES) {
    test(`${name} [${kind}]`, async (t) => {
      const url = await storeUrl(t, kind);
      if (url === null) return;
      await body(openStore(url), namespace(), t);
    });
  }
}

each('a second call replays the first outcome and runs nothing', async (store, ns) => {
  let runs = 0;
  const charge = makeIdempotent(
    async (key, order) => {
      runs += 1;
      return { charged: order.amount, run: runs };
    },
    { store, key: 0, namespace: ns },
  );
  assert.deepEqual(await charge('k1', { amount: 5 }), { charged: 5, run: 1 });
  assert.deepEqual(await charge('k1', { amount: 5 }), { charged: 5, run: 1 });
  assert.deepEqual(await charge('k2', { amount: 5 }), { charged: 5, run: 2 });
  assert.equal(runs, 2);
});

each('another body under the key is a mismatch and runs nothing', async (store, ns) => {
  let runs = 0;
  const charge = makeIdempotent(async (key, amount) => ++runs, { store, key: 0, namespace: ns });
  await charge('k', 5);
  await assert.rejects(charge('k', 6), MismatchError);
  assert.equal(runs, 1);
});

each('the key and body from the first argument object', async (store, ns) => {
  let runs = 0;
  const send = makeIdempotent(async ({ to }) => ({ sent: to, n: ++runs }), {
    store,
    key: 'idempotencyKey',
    namespace: ns,
  });
  // The fingerprint is canonical JSON: the order of properties is not part
  // of the request.
  assert.deepEqual(await send({ idempotencyKey: 'e1', to: 'a', cc: 'b' }), { sent: 'a', n: 1 });
  assert.deepEqual(await send({ cc: 'b', to: 'a', idempotencyKey: 'e1' }), { sent: 'a', n: 1 });
  await assert.rejects(send({ idempotencyKey: 'e1', to: 'c', cc: 'b' }), MismatchError);
});

each('an invalid key touches nothing', async (store, ns) => {
  let runs = 0;
  const f = makeIdempotent(async () => ++runs, { store, key: 0, namespace: ns });
  await assert.rejects(f(''), InvalidKeyError);
  await assert.rejects(f('x'.repeat(256)), InvalidKeyError);
  await assert.rejects(f('tab\there'), InvalidKeyError);
  await assert.rejects(f(42), TypeError);
  assert.equal(runs, 0);
});

each('a call in progress is refused with the time left, or waited for', async (store, ns) => {
  let release;
  const gate = new Promise((resolve) => {
    release = resolve;
  });
  let runs = 0;
  const options = { store, key: 0, namespace: ns, lease: 30 };
  const slow = makeIdempotent(async () => {
    runs += 1;
    await gate;
    return 'done';
  }, options);
  const first = slow('k');
  // Until the first call holds the key, a duplicate may claim it itself.
  while (runs === 0) await new Promise((resolve) => setImmediate(resolve));
  const refused = await slow('k').catch((error) => error);
  assert.ok(refused instanceof InProgressError, String(refused));
  assert.ok(refused.retryAfter > 0 && refused.retryAfter <= 30, String(refused.retryAfter));
  const waiting = makeIdempotent(async () => 'never', { ...options, wait: 30 });
  const waited = waiting('k');
  release();
  assert.equal(await first, 'done');
  assert.equal(await waited, 'done');
  assert.equal(runs, 1);
});

each('a thrown error releases the key; a remembered one is replayed', async (store, ns) => {
  class Declined extends Error {}
  let runs = 0;
  const flaky = makeIdempotent(
    async (key, what) => {
      runs += 1;
      if (what === 'transient' && runs === 1) throw new Error('timeout');
      if (what === 'declined') throw new Declined('card declined');
      return 'ok';
    },
    { store, key: 0, namespace: ns, remember: [Declined] },
  );
  await assert.rejects(flaky('t', 'transient'), /timeout/);
  assert.equal(await flaky('t', 'transient'), 'ok');
  assert.equal(runs, 2);
  await assert.rejects(flaky('d', 'declined'), Declined);
  const again = await flaky('d', 'declined').catch((error) => error);
  assert.ok(again instanceof Declined);
  assert.equal(again.message, 'card declined');
  assert.equal(runs, 3);
  // A function that does not name the class gets the record as it is.
  const other = makeIdempotent(async () => 'never', { store, key: 0, namespace: ns });
  const foreign = await other('d', 'declined').catch((error) => error);
  assert.ok(foreign instanceof RememberedError);
  assert.deepEqual(foreign.value, { type: 'Declined', args: ['card declined'] });
});

each('arguments that are not JSON claim nothing', async (store, ns) => {
  let runs = 0;
  const f = makeIdempotent(async () => ++runs, { store, key: 0, namespace: ns });
  await assert.rejects(f('k', 10n), EncodeError);
  const cycle = {};
  cycle.self = cycle;
  await assert.rejects(f('k', cycle), EncodeError);
  assert.equal(runs, 0);
  assert.equal(await f('k', 1), 1);
});

each('a return value that is not JSON releases the key', async (store, ns) => {
  let runs = 0;
  const f = makeIdempotent(
    async () => {
      runs += 1;
      return runs === 1 ? { big: 1n } : { n: runs };
    },
    { store, key: 0, namespace: ns },
  );
  const error = await f('k').catch((e) => e);
  assert.ok(error instanceof EncodeError, String(error));
  assert.match(error.message, /released/);
  assert.deepEqual(await f('k'), { n: 2 });
  assert.deepEqual(await f('k'), { n: 2 });
});

each('scope and namespace keep keys apart', async (store, ns) => {
  let runs = 0;
  const work = async () => ++runs;
  const byUser = makeIdempotent(work, { store, key: 0, namespace: ns, scope: (key, user) => user });
  assert.equal(await byUser('k', 'alice'), 1);
  assert.equal(await byUser('k', 'bob'), 2);
  assert.equal(await byUser('k', 'alice'), 1);
  const elsewhere = makeIdempotent(work, { store, key: 0, body: () => null, namespace: `${ns}-2` });
  assert.equal(await elsewhere('k', 'alice'), 3);
});

test('a store that does not answer is a StoreError before the work', async () => {
  const store = openStore('redis://127.0.0.1:1');
  let runs = 0;
  const f = makeIdempotent(async () => ++runs, { store, key: 0 });
  const error = await f('k').catch((e) => e);
  assert.ok(error instanceof StoreError, String(error));
  assert.equal(error.workRan, false);
  assert.equal(runs, 0);
});

test('a URL idem does not know is a TypeError that does not repeat it', () => {
  assert.throws(() => openStore('ftp://user:secret@host'), (error) => {
    assert.ok(error instanceof TypeError);
    assert.doesNotMatch(error.message, /secret/);
    return true;
  });
  assert.match(openStore('postgres://u:secret@127.0.0.1/db').url, /^postgres:/);
  assert.doesNotMatch(openStore('postgres://u:secret@127.0.0.1/db').url, /secret/);
});

test('the event loop runs while a call waits on the store', async () => {
  const store = openStore('memory');
  let ticks = 0;
  const timer = setInterval(() => {
    ticks += 1;
  }, 1);
  let release;
  const gate = new Promise((resolve) => {
    release = resolve;
  });
  const f = makeIdempotent(async () => gate, { store, key: 0, wait: 5 });
  const first = f('k');
  await new Promise((resolve) => setTimeout(resolve, 10));
  const waiting = f('k');
  const before = ticks;
  await new Promise((resolve) => setTimeout(resolve, 50));
  assert.ok(ticks > before, 'timers fire while a duplicate waits in Rust');
  release('x');
  assert.equal(await waiting, 'x');
  assert.equal(await first, 'x');
  clearInterval(timer);
});

test('a near cache replays from the process', async (t) => {
  // With `nearCache`, a settled record once read is replayed from memory:
  // the table's rows deleted behind the store's back, the call still
  // replays, where a store without the cache runs it again.
  const { execFileSync } = require('node:child_process');
  try {
    execFileSync('sqlite3', ['-version']);
  } catch {
    if (process.env.CI) throw new Error('the sqlite3 command is needed to delete rows behind the store');
    t.skip('no sqlite3 command');
    return;
  }
  for (const [near, runsAfterDelete] of [[true, 1], [false, 2]]) {
    const url = await storeUrl(t, 'sqlite');
    const store = openStore(url, { nearCache: near });
    assert.equal(store.nearCache, near);
    let runs = 0;
    const charge = makeIdempotent(async () => ({ charge: ++runs }), { store, key: 0, namespace: namespace() });
    assert.deepEqual(await charge('order-1', 1250), { charge: 1 });
    assert.deepEqual(await charge('order-1', 1250), { charge: 1 }); // kept by the cache
    const deleted = execFileSync('sqlite3', [url.slice('sqlite:'.length), 'DELETE FROM idem_records; SELECT changes();']);
    assert.equal(deleted.toString().trim(), '1');
    assert.equal((await charge('order-1', 1250)).charge, runsAfterDelete);
    assert.equal(runs, runsAfterDelete);
  }
  assert.equal(openStore('memory').nearCache, false);
  assert.throws(() => openStore('memory', { nearCache: 'yes' }), TypeError);
});
