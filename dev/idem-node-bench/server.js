'use strict';
// One Express server of the benchmark: `node server.js SUBJECT PORT PREFIX`.
// Every subject serves the same handler (one Redis INCR, a small JSON
// answer) at POST /pay; they differ only in the idempotency library in
// front of it, set up as its README says. PREFIX keeps each server's
// Redis keys apart. Prints "ready" once it listens.

const path = require('node:path');
const express = require('express');
const { createClient } = require('@redis/client');

const REDIS = process.env.IDEM_REDIS_URL || 'redis://127.0.0.1:6379';
const [subject, port, prefix] = process.argv.slice(2);

/** The work: one INCR, counting executions, answered as JSON. */
function handler(redis) {
  const counter = `${prefix}:runs`;
  return async (req, res) => {
    const runs = await redis.incr(counter);
    res.status(200).json({ charge: `ch_${runs}`, amount: req.body.amount });
  };
}

/** No idempotency: the handler alone. */
function plain(app, redis) {
  app.post('/pay', express.json(), handler(redis));
}

/** idem's middleware (the `idempotence` package), before the body
 * parser; with `nearCache`, settled records are kept in the process. */
function idem(nearCache) {
  return (app, redis) => {
    const { openStore, idempotency } = require(path.join(__dirname, '..', '..', 'idem-node'));
    const store = openStore(REDIS, { name: prefix, nearCache });
    app.use(idempotency({ store }));
    app.post('/pay', express.json(), handler(redis));
  };
}

/**
 * @node-idempotency/core with its Redis adapter. Its Express wrapper is
 * not published on npm, so this is the glue its README gives: onRequest
 * before the handler, onResponse with what the handler answered.
 */
async function nodeIdempotency(app, redis) {
  const { Idempotency, IdempotencyError } = require('@node-idempotency/core');
  const { RedisStorageAdapter } = require('@node-idempotency/storage-adapter-redis');
  const storage = new RedisStorageAdapter({ url: REDIS });
  await storage.connect();
  const idempotency = new Idempotency(storage, { cacheKeyPrefix: prefix });
  const work = handler(redis);
  app.post('/pay', express.json(), async (req, res, next) => {
    const request = { method: req.method, headers: req.headers, body: req.body, path: req.path };
    try {
      const cached = await idempotency.onRequest(request);
      if (cached) {
        res.status(cached.additional.status).json(cached.body);
        return;
      }
    } catch (error) {
      if (!(error instanceof IdempotencyError)) return next(error);
      const conflict = error.code === 'REQUEST_IN_PROGRESS' ? 409 : 422;
      res.status(conflict).json({ error: error.code });
      return;
    }
    const json = res.json.bind(res);
    res.json = (body) => {
      idempotency
        .onResponse(request, { body, additional: { status: res.statusCode } })
        .then(() => json(body), next);
      return res;
    };
    await work(req, res);
  });
}

/** express-idempotency with its Redis adapter; the handler asks isHit. */
async function expressIdempotency(app, redis) {
  const idempotency = require('express-idempotency');
  const RedisAdapter = require('express-idempotency-redis-adapter').default;
  const adapter = new RedisAdapter({ connectionConfig: { url: REDIS } });
  await adapter.connect();
  app.use(idempotency.idempotency({ dataAdapter: adapter }));
  const work = handler(redis);
  app.post('/pay', express.json(), async (req, res) => {
    if (idempotency.getSharedIdempotencyService().isHit(req)) return;
    await work(req, res);
  });
}

/**
 * Powertools for TypeScript: makeIdempotent over the work, on its cache
 * (Redis) persistence layer with the handler's own client. The key is the
 * header. The body is not validated: in 2.35.0 the cache layer drops the
 * payload hash when it completes a record, so with payloadValidationJmesPath
 * every replay fails with IdempotencyValidationError. Outside Lambda there is no remaining time
 * to bound the in-progress record, so a 30 s one is registered (else it
 * warns on every call and an orphaned record blocks the key until expiry).
 */
function powertools(localCache) {
  return (app, redis) => {
    const { makeIdempotent, IdempotencyConfig, IdempotencyAlreadyInProgressError } = require(
      '@aws-lambda-powertools/idempotency',
    );
    const { CachePersistenceLayer } = require('@aws-lambda-powertools/idempotency/cache');
    const persistenceStore = new CachePersistenceLayer({ client: redis });
    const config = new IdempotencyConfig({
      eventKeyJmesPath: 'key',
      useLocalCache: localCache,
    });
    config.registerLambdaContext({ getRemainingTimeInMillis: () => 30_000 });
    const counter = `${prefix}:runs`;
    const charge = makeIdempotent(
      async ({ body }) => {
        const runs = await redis.incr(counter);
        return { charge: `ch_${runs}`, amount: body.amount };
      },
      { persistenceStore, config, keyPrefix: prefix },
    );
    app.post('/pay', express.json(), async (req, res) => {
      try {
        res.status(200).json(await charge({ key: req.get('idempotency-key'), body: req.body }));
      } catch (error) {
        if (error instanceof IdempotencyAlreadyInProgressError) res.status(409).json({ error: error.name });
        else res.status(422).json({ error: error.name, message: error.message });
      }
    });
  };
}

const SUBJECTS = {
  plain,
  idem: idem(false),
  'idem-near': idem(true),
  'node-idempotency': nodeIdempotency,
  'express-idempotency': expressIdempotency,
  powertools: powertools(false),
  'powertools-local': powertools(true),
};

async function main() {
  const setup = SUBJECTS[subject];
  if (!setup) throw new Error(`unknown subject ${subject}; known: ${Object.keys(SUBJECTS).join(', ')}`);
  const redis = await createClient({ url: REDIS }).connect();
  const app = express();
  app.set('etag', false);
  await setup(app, redis);
  app.listen(Number(port), '127.0.0.1', () => console.log('ready'));
}

// A clean exit, so that `node --cpu-prof` writes its profile.
process.on('SIGTERM', () => process.exit(0));

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
