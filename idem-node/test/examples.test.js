'use strict';
// The examples run as a user runs them: `node app.js` in the example's
// directory, talked to over HTTP. `idempotence` and Express resolve
// through NODE_PATH to this checkout's package and its test dependencies,
// as `npm install` would place them.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const crypto = require('node:crypto');
const { spawn } = require('node:child_process');
const { storeUrl, scratch } = require('./stores');

const EXAMPLES = path.join(__dirname, '..', '..', 'examples');

/** A directory for NODE_PATH holding `idempotence` and `express`. */
function modules() {
  const dir = path.join(scratch(), 'node_modules');
  fs.mkdirSync(dir);
  fs.symlinkSync(path.join(__dirname, '..'), path.join(dir, 'idempotence'));
  fs.symlinkSync(path.dirname(require.resolve('express/package.json')), path.join(dir, 'express'));
  return dir;
}

/** Starts `node app.js` in `example` with `env`; its URL and a stop function. */
async function start(example, env) {
  const child = spawn(process.execPath, ['app.js'], {
    cwd: path.join(EXAMPLES, example),
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const exited = new Promise((resolve) => child.once('exit', resolve));
  const url = await new Promise((resolve, reject) => {
    let out = '';
    child.stdout.setEncoding('utf8');
    child.stdout.on('data', (chunk) => {
      out += chunk;
      const found = out.match(/on (http:\/\/\S+)/);
      if (found) resolve(found[1]);
    });
    child.once('exit', (code) => reject(new Error(`${example} exited ${code}: ${out}`)));
  });
  return {
    url,
    stop: async () => {
      child.kill('SIGKILL');
      await exited;
    },
  };
}

async function pay(url, key, merchant, body) {
  const response = await fetch(`${url}/payments`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      'x-merchant': merchant,
      ...(key ? { 'idempotency-key': key } : {}),
    },
    body: JSON.stringify(body),
  });
  return {
    status: response.status,
    replayed: response.headers.get('idempotent-replayed') === 'true',
    text: await response.text(),
  };
}

async function charges(url) {
  return (await fetch(`${url}/payments`)).json();
}

test('examples/express-payments charges a retried payment once, across a restart [redis]', async (t) => {
  const redis = await storeUrl(t, 'redis');
  if (redis === null) return;
  const env = { IDEM_REDIS_URL: redis, PORT: '0', NODE_PATH: modules() };
  // The example's namespace is fixed: a key of this run's own.
  const key = `order-${crypto.randomUUID()}`;
  const order = { amount: 1250, currency: 'EUR', client_ts: 1 };
  let service = await start('express-payments', env);
  try {
    const first = await pay(service.url, key, 'm1', order);
    assert.equal(first.status, 201);
    assert.equal(first.replayed, false);
    assert.deepEqual(JSON.parse(first.text), { id: 'ch_1', amount: 1250, currency: 'EUR' });
    // Retries, one built later with another client_ts: the first answer.
    const retries = await Promise.all(
      [1, 2, 3, 4].map((ts) => pay(service.url, key, 'm1', { ...order, client_ts: ts })),
    );
    for (const retry of retries) assert.deepEqual(retry, { ...first, replayed: true });
    // The same key with another amount is refused; without a key, too.
    assert.equal((await pay(service.url, key, 'm1', { ...order, amount: 1 })).status, 422);
    assert.equal((await pay(service.url, null, 'm1', order)).status, 400);
    // Another merchant's key is its own.
    assert.equal((await pay(service.url, key, 'm2', order)).status, 201);
    assert.deepEqual(
      (await charges(service.url)).map((c) => c.id),
      ['ch_1', 'ch_2'],
    );

    // A new process on the same store replays; it charges nothing.
    await service.stop();
    service = await start('express-payments', env);
    const after = await pay(service.url, key, 'm1', { ...order, client_ts: 9 });
    assert.deepEqual(after, { ...first, replayed: true });
    assert.deepEqual(await charges(service.url), []);
  } finally {
    await service.stop();
  }
});
