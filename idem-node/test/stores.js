'use strict';
// Stores to test against: memory and SQLite always; Redis, PostgreSQL and
// MariaDB from IDEM_REDIS_URL, IDEM_POSTGRES_URL, IDEM_MYSQL_URL (or the
// local servers). A missing server skips its tests with the reason, and
// fails them when CI is set, as the Rust and Python tests do.

const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const fs = require('node:fs');
const crypto = require('node:crypto');

const SERVERS = {
  redis: ['IDEM_REDIS_URL', 'redis://127.0.0.1:6379', 6379],
  postgres: ['IDEM_POSTGRES_URL', 'postgres://root@127.0.0.1:5432/test', 5432],
  mysql: ['IDEM_MYSQL_URL', 'mysql://root@127.0.0.1:3306/test', 3306],
};
const STORES = ['memory', 'sqlite', 'redis', 'postgres', 'mysql'];
const SHARED = ['sqlite', 'redis', 'postgres', 'mysql'];

function listening(host, port) {
  return new Promise((resolve) => {
    const socket = net.connect({ host, port, timeout: 2000 });
    const done = (ok, error) => {
      socket.destroy();
      resolve(ok ? null : error);
    };
    socket.once('connect', () => done(true));
    socket.once('timeout', () => done(false, new Error('timed out')));
    socket.once('error', (error) => done(false, error));
  });
}

/** A temporary directory removed when the process exits. */
function scratch() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idem-node-'));
  process.once('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** The URL of store `kind`, or null after `t.skip` (a throw under CI) when
 * its server does not answer. */
async function storeUrl(t, kind) {
  if (kind === 'memory') return 'memory';
  if (kind === 'sqlite') return `sqlite:${path.join(scratch(), 'idem.db')}`;
  const [variable, fallback, port] = SERVERS[kind];
  const url = process.env[variable] || fallback;
  const parsed = new URL(url);
  const host = parsed.hostname || '127.0.0.1';
  const at = Number(parsed.port) || port;
  const error = await listening(host, at);
  if (error) {
    const reason = `no ${kind} at ${host}:${at} (${error.message}); set ${variable}`;
    if (process.env.CI) throw new Error(`${reason} (CI is set, so this fails instead of skipping)`);
    t.skip(reason);
    return null;
  }
  return url;
}

/** A namespace of the test's own, so tests share no record. */
function namespace() {
  return `node-${crypto.randomUUID()}`;
}

module.exports = { STORES, SHARED, storeUrl, namespace, scratch };
