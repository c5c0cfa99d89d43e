#!/usr/bin/env node
// A payments service on Node's own `node:http`, to run behind idem-proxy.
// It knows nothing of idempotency: the proxy in front of it runs each keyed
// POST once and replays the answer to retries.
//
//     node upstream.js --port 3000
//     idem-proxy --listen 127.0.0.1:8080 --upstream http://127.0.0.1:3000
//
// It counts its effects (`GET /effects`) and logs each run with its key and
// time (`GET /runs`), which idem's tests read. `POST /charges` records the
// key the proxy passes on (`Idempotency-Key`) and refuses to charge twice
// under it; the other routes are the HTTP behaviour suite's: `/payments`,
// `/other`, `/binary`, `/gated` (waits for a `POST /gate`), `/flaky`,
// `/big`, `/broken`, `/panic` and `/slow`.
'use strict';
const http = require('node:http');

const runs = []; // [path, key, time] of each run, in order
const charged = new Map(); // key -> the body answered under it
const waiting = []; // gated requests' resolvers
let permits = 0;

function run(path, key) {
  runs.push([path, key, Date.now() / 1000]);
  return runs.length;
}

function answer(res, status, body, type = 'text/plain', headers = []) {
  const bytes = Buffer.isBuffer(body) ? body : Buffer.from(body);
  const lines = [['Content-Type', type], ['Content-Length', String(bytes.length)], ...headers];
  res.writeHead(status, lines.flat());
  res.end(bytes);
}

function gate() {
  if (permits > 0) {
    permits -= 1;
    return Promise.resolve();
  }
  return new Promise((resolve) => waiting.push(resolve));
}

async function handle(req, res, body) {
  const path = req.url.split('?')[0];
  const key = req.headers['idempotency-key'] ?? null;
  if (req.method === 'GET') {
    if (path === '/payments' || path === '/effects') return answer(res, 200, String(runs.length));
    if (path === '/runs') return answer(res, 200, JSON.stringify(runs), 'application/json');
    return answer(res, 404, 'not found');
  }
  if (req.method !== 'POST' && req.method !== 'PATCH') return answer(res, 405, 'method not allowed');
  switch (path) {
    case '/payments':
    case '/other': {
      const n = run(path, key);
      const tenant = req.headers['x-tenant'] ?? '-';
      const payment = `{"run":${n},"tenant":"${tenant}","echo":${body.length}}`;
      return answer(res, 201, payment, 'application/json', [
        ['Set-Cookie', `session=s${n}; HttpOnly`],
        ['x-multi', 'a'],
        ['x-multi', 'b'],
        ['x-run', String(n)],
      ]);
    }
    case '/charges': {
      if (key !== null && charged.has(key)) return answer(res, 201, charged.get(key), 'application/json');
      const charge = `{"charge":${run(path, key)}}`;
      if (key !== null) charged.set(key, charge);
      return answer(res, 201, charge, 'application/json');
    }
    case '/binary': {
      const n = run(path, key);
      const bytes = Buffer.alloc(257);
      for (let i = 0; i < 256; i++) bytes[i] = i;
      bytes[256] = n % 256;
      return answer(res, 202, bytes, 'application/octet-stream');
    }
    case '/gated': {
      const n = run(path, key);
      await gate();
      return answer(res, 201, `run ${n}`);
    }
    case '/gate': {
      const next = waiting.shift();
      if (next) next();
      else permits += 1;
      return answer(res, 204, '');
    }
    case '/flaky': {
      const n = run(path, key);
      return n === 1 ? answer(res, 503, 'try again') : answer(res, 201, `run ${n}`);
    }
    case '/big':
      run(path, key);
      return answer(res, 200, Buffer.alloc(4096, 'x'), 'application/octet-stream');
    case '/broken':
      // Half a response, then the connection drops.
      run(path, key);
      res.writeHead(200, { 'Content-Length': '100' });
      res.write('half a response', () => req.socket.destroy());
      return undefined;
    case '/panic':
      // The process fails mid-request: no answer at all.
      run(path, key);
      req.socket.destroy();
      return undefined;
    case '/slow': {
      const n = run(path, key);
      const delay = Number(req.headers['x-delay'] ?? '1') * 1000;
      setTimeout(() => answer(res, 201, `run ${n}`), delay);
      return undefined;
    }
    default:
      return answer(res, 404, 'not found');
  }
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (chunk) => chunks.push(chunk));
  req.on('end', () => handle(req, res, Buffer.concat(chunks)));
});
server.keepAliveTimeout = 65000;
const at = process.argv.indexOf('--port');
const port = at >= 0 ? Number(process.argv[at + 1]) : 3000;
server.listen(port, '127.0.0.1', () => {
  console.log(`listening on 127.0.0.1:${server.address().port}`);
});
