'use strict';
// The HTTP side over real sockets: an Express app behind `idempotency`
// and a `node:http` server behind `idempotentHandler`. Executions are
// counted by the handlers' own side effects.

const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const { Readable } = require('node:stream');
const express = require('express');
const { openStore, idempotency, idempotentHandler } = require('..');
const { storeUrl, namespace } = require('./stores');

const KINDS = ['memory', 'sqlite', 'redis'];

/** Listens on a free port; the base URL and a close function. */
async function serve(listener) {
  const server = http.createServer(listener);
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(resolve);
      }),
  };
}

/** A POST; status, headers (without the date) and body bytes. */
async function post(url, key, body, headers = {}) {
  const response = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(key ? { 'idempotency-key': key } : {}), ...headers },
    body: JSON.stringify(body),
  });
  const bytes = Buffer.from(await response.arrayBuffer());
  const kept = [...response.headers].filter(([name]) => !['date', 'connection', 'keep-alive'].includes(name));
  return { status: response.status, headers: Object.fromEntries(kept), bytes };
}

/** The replay of a body recorded in chunks: the recording finishes in
 * its own task after the client has read the last byte, and a retry
 * meanwhile gets 409 (the key is still in progress). */
async function replayOfStreamed(url, key, body) {
  for (;;) {
    const replay = await post(url, key, body);
    if (replay.status !== 409) return replay;
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

/** Without the replay marker, to compare a replay with the first answer. */
function plain(response) {
  const { 'idempotent-replayed': _marker, ...headers } = response.headers;
  return { ...response, headers };
}

/** Defines `name` once per store kind, given the middleware's options. */
function each(name, body) {
  for (const kind of KINDS) {
    test(`${name} [${kind}]`, async (t) => {
      const url = await storeUrl(t, kind);
      if (url === null) return;
      await body({ store: openStore(url), namespace: namespace() }, t);
    });
  }
}

/** An Express app: the middleware first, then a JSON body parser. */
async function expressApp(options, routes) {
  const app = express();
  app.use(idempotency(options));
  app.use(express.json());
  routes(app);
  return serve(app);
}

each('Express: the first response is replayed byte for byte, marked, and runs once', async (options) => {
  let runs = 0;
  const server = await expressApp(options, (app) => {
    app.post('/payments', (req, res) => {
      runs += 1;
      res.status(201).set('x-charge', `ch_${runs}`).json({ charged: req.body.amount, run: runs });
    });
  });
  try {
    const first = await post(`${server.url}/payments`, 'k1', { amount: 5 });
    assert.equal(first.status, 201);
    assert.equal(first.headers['idempotent-replayed'], undefined);
    assert.deepEqual(JSON.parse(first.bytes), { charged: 5, run: 1 });
    const replay = await post(`${server.url}/payments`, 'k1', { amount: 5 });
    assert.equal(replay.headers['idempotent-replayed'], 'true');
    assert.deepEqual(plain(replay), first);
    assert.equal(runs, 1);
    // Without a key the request is not protected.
    await post(`${server.url}/payments`, null, { amount: 5 });
    assert.equal(runs, 2);
  } finally {
    await server.close();
  }
});

each('Express: another body under the key is refused with 422 and runs nothing', async (options) => {
  let runs = 0;
  const server = await expressApp(options, (app) => {
    app.post('/payments', (req, res) => res.json({ run: ++runs }));
  });
  try {
    await post(`${server.url}/payments`, 'k2', { amount: 5 });
    const refused = await post(`${server.url}/payments`, 'k2', { amount: 6 });
    assert.equal(refused.status, 422);
    assert.match(JSON.parse(refused.bytes).type, /mismatch/);
    assert.equal(runs, 1);
  } finally {
    await server.close();
  }
});

each('Express: a request finding its key running gets 409, then the replay', async (options) => {
  let runs = 0;
  let entered;
  const inside = new Promise((resolve) => (entered = resolve));
  let release;
  const gate = new Promise((resolve) => (release = resolve));
  const server = await expressApp(options, (app) => {
    app.post('/payments', async (req, res) => {
      runs += 1;
      entered();
      await gate;
      res.json({ run: runs });
    });
  });
  try {
    const first = post(`${server.url}/payments`, 'k3', { amount: 1 });
    await inside;
    const busy = await post(`${server.url}/payments`, 'k3', { amount: 1 });
    assert.equal(busy.status, 409);
    release();
    assert.equal((await first).status, 200);
    const replay = await post(`${server.url}/payments`, 'k3', { amount: 1 });
    assert.equal(replay.headers['idempotent-replayed'], 'true');
    assert.equal(runs, 1);
  } finally {
    await server.close();
  }
});

each('Express: a thrown error releases the key and a retry runs again', async (options) => {
  let runs = 0;
  const server = await expressApp(options, (app) => {
    app.post('/payments', (req, res) => {
      runs += 1;
      if (runs === 1) throw new Error('card declined by a flaky gateway');
      res.status(201).json({ run: runs });
    });
    // Quiet: Express's default handler would log the stack.
    app.use((error, req, res, _next) => res.status(500).json({ error: error.message }));
  });
  try {
    assert.equal((await post(`${server.url}/payments`, 'k4', { amount: 1 })).status, 500);
    const retry = await post(`${server.url}/payments`, 'k4', { amount: 1 });
    assert.equal(retry.status, 201);
    assert.equal(retry.headers['idempotent-replayed'], undefined);
    assert.equal(runs, 2);
  } finally {
    await server.close();
  }
});

/** 1.25 MiB in 20 pieces of 64 KiB, each filled with its index. */
function pieces() {
  return Array.from({ length: 20 }, (_, i) => Buffer.alloc(64 * 1024, 65 + i));
}

each('Express: a streamed body over 1 MiB written in pieces is recorded and replayed', async (options) => {
  let runs = 0;
  const server = await expressApp(options, (app) => {
    app.post('/exports', async (req, res) => {
      runs += 1;
      res.type('application/octet-stream');
      for (const piece of pieces()) {
        if (!res.write(piece)) await new Promise((resolve) => res.once('drain', resolve));
      }
      res.end();
    });
  });
  try {
    const expected = Buffer.concat(pieces());
    const first = await post(`${server.url}/exports`, 'k5', { month: 11 });
    assert.equal(first.status, 200);
    assert.ok(first.bytes.equals(expected), `first body: ${first.bytes.length} bytes`);
    const replay = await replayOfStreamed(`${server.url}/exports`, 'k5', { month: 11 });
    assert.equal(replay.headers['idempotent-replayed'], 'true');
    assert.ok(replay.bytes.equals(expected), `replayed body: ${replay.bytes.length} bytes`);
    assert.equal(runs, 1);
  } finally {
    await server.close();
  }
});

each('Express: the scope from a function keeps principals apart', async (options) => {
  let runs = 0;
  const scoped = { ...options, scope: (req) => `user:${req.headers['x-user']}` };
  const server = await expressApp(scoped, (app) => {
    app.post('/payments', (req, res) => res.json({ user: req.headers['x-user'], run: ++runs }));
  });
  try {
    const alice = await post(`${server.url}/payments`, 'k6', { amount: 1 }, { 'x-user': 'alice' });
    const bob = await post(`${server.url}/payments`, 'k6', { amount: 1 }, { 'x-user': 'bob' });
    assert.deepEqual(JSON.parse(alice.bytes), { user: 'alice', run: 1 });
    assert.deepEqual(JSON.parse(bob.bytes), { user: 'bob', run: 2 });
    const again = await post(`${server.url}/payments`, 'k6', { amount: 1 }, { 'x-user': 'alice' });
    assert.equal(again.headers['idempotent-replayed'], 'true');
    assert.deepEqual(JSON.parse(again.bytes), { user: 'alice', run: 1 });
    assert.equal(runs, 2);
  } finally {
    await server.close();
  }
});

each('node:http: a piped stream is recorded and replayed; a throw releases the key', async (options) => {
  let runs = 0;
  const errors = [];
  const listener = idempotentHandler({ ...options, onError: (error) => errors.push(error) }, (req, res) => {
    runs += 1;
    if (req.headers['x-fail'] === 'yes') throw new Error('before the head');
    res.writeHead(202, { 'content-type': 'application/octet-stream' });
    Readable.from(pieces()).pipe(res);
  });
  const server = await serve(listener);
  try {
    const failed = await post(`${server.url}/`, 'k7', { n: 1 }, { 'x-fail': 'yes' });
    assert.equal(failed.status, 500);
    assert.equal(errors.length, 1);
    const first = await post(`${server.url}/`, 'k7', { n: 1 });
    assert.equal(first.status, 202);
    assert.ok(first.bytes.equals(Buffer.concat(pieces())));
    const replay = await replayOfStreamed(`${server.url}/`, 'k7', { n: 1 });
    assert.deepEqual(plain(replay), first);
    assert.equal(replay.headers['idempotent-replayed'], 'true');
    assert.equal(runs, 2);
  } finally {
    await server.close();
  }
});
