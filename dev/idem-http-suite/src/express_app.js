'use strict';
// The HTTP behaviour suite's routes as Express apps behind idem's
// middleware (`idempotency` of the `idempotence` package, idem-node),
// each served by node:http on a free port of 127.0.0.1.
//
// Run as `node --expose-gc express_app.js PACKAGE_DIR`: it loads Express
// and the package from PACKAGE_DIR (idem-node, whose node_modules holds
// Express), then serves one app per line of JSON config read from stdin,
// answering `ID PORT` for each; `close ID` closes one. Each app has its own
// store, count of runs and gate, so one process serves a whole run of the
// suite (a node start per app cost most of its time). It ends when stdin
// closes, so no app outlives the suite. A config, as the suite's
// `Adapter::Express` writes it:
//
// * `IDEM_STORE_URL`: the store, as `openStore` takes it; `IDEM_STORE_NAME`
//   its key prefix or table.
// * `IDEM_OPTIONS`: the middleware's options as a JSON object, named as the
//   Python middleware's keyword arguments (`require_key`); each name is
//   the camelCase option of the Node middleware (`requireKey`).
// * `IDEM_SCOPE`: `tenant-header` takes the scope from `x-tenant`.
//
// An app's `GET /effects` answers how many times its handlers have run;
// `POST /gate` lets one request waiting at `/gated` or `/gated-events`
// through.

const path = require('node:path');
const http = require('node:http');
const { createRequire } = require('node:module');
const { Readable, pipeline } = require('node:stream');

const packageDir = path.resolve(process.argv[2] || path.join(__dirname, '..', '..', '..', 'idem-node'));
const fromPackage = createRequire(path.join(packageDir, 'package.json'));
const express = fromPackage('express');
const { openStore, idempotency } = fromPackage('./index.js');

const BIG_BODY = 4096;
const STREAM_BODY = 3 * 1024 * 1024 + 17;
const STREAM_FRAME = 10_007;
const EVENTS = 2_000;
const GATED_EVENTS = 10;

/** A semaphore of no permits: `acquire` waits for a `release`. */
function semaphore() {
  let permits = 0;
  const waiting = [];
  return {
    release() {
      const next = waiting.shift();
      if (next) next();
      else permits += 1;
    },
    acquire() {
      if (permits > 0) {
        permits -= 1;
        return Promise.resolve();
      }
      return new Promise((resolve) => waiting.push(resolve));
    },
  };
}

let streamBody;
function stream() {
  if (!streamBody) {
    streamBody = Buffer.alloc(STREAM_BODY);
    for (let i = 0; i < STREAM_BODY; i++) streamBody[i] = ((i % 251) ^ Math.floor(i / 251)) & 0xff;
  }
  return streamBody;
}

const event = (i) => `id: ${i}\nevent: token\ndata: {"n":${i},"text":"word ${i}"}\n\n`;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** The routes with their own count of runs and gate. */
function routes() {
  const state = { runs: 0, gate: semaphore() };
  /** Counts one run and returns its number (1 for the first). */
  const run = () => ++state.runs;
  const gate = state.gate;
  const app = express();
  // The suite compares the application's own headers: none of Express's.
  app.disable('x-powered-by');
  app.set('etag', false);

  function payment(req, res) {
    const n = run();
    const length = Buffer.isBuffer(req.body) ? req.body.length : 0;
    res.status(201);
    res.setHeader('set-cookie', `session=s${n}; HttpOnly`);
    res.setHeader('x-multi', ['a', 'b']);
    res.setHeader('x-run', String(n));
    // Set as a header: `res.type` would add a charset.
    res.setHeader('content-type', 'application/json');
    res.send(Buffer.from(`{"run":${n},"tenant":"${req.get('x-tenant') || '-'}","echo":${length}}`));
  }

  const count = (req, res) => res.type('text/plain').send(String(state.runs));
  const body = express.raw({ type: () => true, limit: '16mb' });

  app.post('/payments', body, payment);
  app.patch('/payments', body, payment);
  app.post('/other', body, payment);
  app.get('/payments', count);

  app.post('/binary', (req, res) => {
    const n = run();
    const bytes = Buffer.alloc(257);
    for (let i = 0; i < 256; i++) bytes[i] = i;
    bytes[256] = n % 256;
    res.status(202).type('application/octet-stream').send(bytes);
  });

  app.post('/gated', async (req, res) => {
    const n = run();
    await gate.acquire();
    res.status(201).type('text/plain').send(`run ${n}`);
  });

  app.post('/flaky', (req, res) => {
    const n = run();
    if (n === 1) res.status(503).type('text/plain').send('try again');
    else res.status(201).type('text/plain').send(`run ${n}`);
  });

  app.post('/big', (req, res) => {
    run();
    res.type('application/octet-stream').send(Buffer.alloc(BIG_BODY, 'x'));
  });

  // A stream that fails after its first bytes: `pipeline` destroys the
  // response, as any Node stream error does.
  app.post('/broken', (req, res) => {
    run();
    async function* frames() {
      yield Buffer.from('half a response');
      throw new Error('the stream broke');
    }
    pipeline(Readable.from(frames()), res, () => {});
  });

  app.post('/stream', (req, res) => {
    run();
    const whole = stream();
    async function* frames() {
      for (let sent = 0, at = 0; at < whole.length; sent++, at += STREAM_FRAME) {
        if (sent && sent % 16 === 0) await sleep(1);
        yield whole.subarray(at, at + STREAM_FRAME);
      }
    }
    pipeline(Readable.from(frames()), res, () => {});
  });

  app.post('/events', (req, res) => {
    run();
    async function* frames() {
      for (let i = 0; i < EVENTS; i++) {
        if (i && i % 100 === 0) await sleep(1);
        yield event(i);
      }
    }
    res.setHeader('content-type', 'text/event-stream');
    pipeline(Readable.from(frames()), res, () => {});
  });

  app.post('/gated-events', async (req, res) => {
    run();
    res.setHeader('content-type', 'text/event-stream');
    for (let i = 0; i < 2 * GATED_EVENTS; i++) {
      if (i === GATED_EVENTS) await gate.acquire();
      res.write(event(i));
    }
    res.end();
  });

  app.post('/panic', () => {
    run();
    throw new Error('the handler fails on purpose');
  });

  // Quiet: Express's default handler would print the stack.
  app.use((error, req, res, _next) => {
    if (res.headersSent) res.destroy(error);
    else res.status(500).type('text/plain').send('Internal Server Error');
  });

  return { app, state };
}

/** The Python middleware's option names as the Node middleware's. */
function camelCase(options) {
  return Object.fromEntries(
    Object.entries(options).map(([name, value]) => [name.replace(/_([a-z])/g, (_, c) => c.toUpperCase()), value]),
  );
}

const apps = new Map();
let made = 0;

/** Serves a new app as `config` says; answers its id and port. */
function serve(config, answer) {
  const options = camelCase(JSON.parse(config.IDEM_OPTIONS || '{}'));
  const store = openStore(config.IDEM_STORE_URL, config.IDEM_STORE_NAME ? { name: config.IDEM_STORE_NAME } : undefined);
  const scope = config.IDEM_SCOPE === 'tenant-header' ? (req) => req.headers['x-tenant'] : undefined;
  const { app, state } = routes();
  const root = express();
  root.disable('x-powered-by');
  // The suite's own calls, before the middleware: never refused for a key.
  root.get('/effects', (req, res) => res.type('text/plain').send(String(state.runs)));
  root.post('/gate', (req, res) => {
    state.gate.release();
    res.status(204).end();
  });
  root.use(idempotency({ store, scope, ...options }));
  root.use(app);
  const server = http.createServer(root);
  const id = ++made;
  apps.set(id, server);
  server.listen(0, '127.0.0.1', () => answer(`${id} ${server.address().port}`));
}

/** Closes app `id`: its connections, then its store, which goes with the
 * last reference to it (so its connections close too). */
function close(id) {
  const server = apps.get(id);
  if (!server) return;
  apps.delete(id);
  server.close();
  server.closeAllConnections();
  // Connections end on their next tick; the store's pool is freed by the
  // collection after that.
  setTimeout(() => global.gc && global.gc(), 100);
}

let input = '';
process.stdin.setEncoding('utf8');
process.stdin.on('data', (chunk) => {
  input += chunk;
  for (let end; (end = input.indexOf('\n')) >= 0; ) {
    const line = input.slice(0, end);
    input = input.slice(end + 1);
    if (line.startsWith('close ')) close(Number(line.slice(6)));
    else serve(JSON.parse(line), (answer) => process.stdout.write(`${answer}\n`));
  }
});
process.stdin.on('end', () => process.exit(0));
