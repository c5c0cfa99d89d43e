'use strict';
// The Fastify plugin over real sockets, as test/http.test.js runs the
// Express middleware. Executions are counted by the handlers' own side
// effects.

const test = require('node:test');
const assert = require('node:assert/strict');
const { Readable } = require('node:stream');
const Fastify = require('fastify');
const { openStore, fastifyIdempotency } = require('..');
const { storeUrl, namespace } = require('./stores');

const KINDS = ['memory', 'sqlite', 'redis'];

/** A Fastify app with the plugin and `routes`, listening on a free port. */
async function serve(options, routes) {
  const app = Fastify();
  await app.register(fastifyIdempotency, options);
  routes(app);
  const url = await app.listen({ port: 0, host: '127.0.0.1' });
  return { url, close: () => app.close() };
}

/** A POST; status, headers (without the connection's own) and body bytes. */
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

function plain(response) {
  const { 'idempotent-replayed': _marker, ...headers } = response.headers;
  return { ...response, headers };
}

function each(name, body) {
  for (const kind of KINDS) {
    test(`${name} [${kind}]`, async (t) => {
      const url = await storeUrl(t, kind);
      if (url === null) return;
      await body({ store: openStore(url), namespace: namespace() }, t);
    });
  }
}

each('Fastify: the first reply is replayed byte for byte, marked, and runs once', async (options) => {
  let runs = 0;
  const server = await serve(options, (app) => {
    app.post('/payments', async (request, reply) => {
      runs += 1;
      reply.code(201).header('x-charge', `ch_${runs}`);
      return { charged: request.body.amount, run: runs };
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
    const other = await post(`${server.url}/payments`, 'k1', { amount: 6 });
    assert.equal(other.status, 422);
    assert.match(JSON.parse(other.bytes).type, /mismatch/);
    assert.equal(runs, 1);
    // Without a key the request is not protected.
    await post(`${server.url}/payments`, null, { amount: 5 });
    assert.equal(runs, 2);
  } finally {
    await server.close();
  }
});

each('Fastify: a thrown error releases the key and a retry runs again', async (options) => {
  let runs = 0;
  const server = await serve(options, (app) => {
    app.post('/payments', async (request, reply) => {
      runs += 1;
      if (runs === 1) throw new Error('card declined by a flaky gateway');
      reply.code(201);
      return { run: runs };
    });
  });
  try {
    assert.equal((await post(`${server.url}/payments`, 'k2', { amount: 1 })).status, 500);
    const retry = await post(`${server.url}/payments`, 'k2', { amount: 1 });
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

each('Fastify: a stream reply over 1 MiB is recorded and replayed', async (options) => {
  let runs = 0;
  const server = await serve(options, (app) => {
    app.post('/exports', (request, reply) => {
      runs += 1;
      reply.type('application/octet-stream').send(Readable.from(pieces()));
    });
  });
  try {
    const expected = Buffer.concat(pieces());
    const first = await post(`${server.url}/exports`, 'k3', { month: 11 });
    assert.equal(first.status, 200);
    assert.ok(first.bytes.equals(expected), `first body: ${first.bytes.length} bytes`);
    // The recording of a streamed body finishes after its client read the
    // last byte: the retry waits for it.
    const replay = await post(`${server.url}/exports`, 'k3', { month: 11 }, { prefer: 'wait=10' });
    assert.equal(replay.headers['idempotent-replayed'], 'true');
    assert.ok(replay.bytes.equals(expected), `replayed body: ${replay.bytes.length} bytes`);
    assert.equal(runs, 1);
  } finally {
    await server.close();
  }
});

each('Fastify: the scope from a function keeps principals apart', async (options) => {
  let runs = 0;
  const scoped = { ...options, scope: (req) => `user:${req.headers['x-user']}` };
  const server = await serve(scoped, (app) => {
    app.post('/payments', async (request) => ({ user: request.headers['x-user'], run: ++runs }));
  });
  try {
    const alice = await post(`${server.url}/payments`, 'k4', { amount: 1 }, { 'x-user': 'alice' });
    const bob = await post(`${server.url}/payments`, 'k4', { amount: 1 }, { 'x-user': 'bob' });
    assert.deepEqual(JSON.parse(alice.bytes), { user: 'alice', run: 1 });
    assert.deepEqual(JSON.parse(bob.bytes), { user: 'bob', run: 2 });
    const again = await post(`${server.url}/payments`, 'k4', { amount: 1 }, { 'x-user': 'alice' });
    assert.equal(again.headers['idempotent-replayed'], 'true');
    assert.deepEqual(plain(again), plain(alice));
    assert.equal(runs, 2);
  } finally {
    await server.close();
  }
});
