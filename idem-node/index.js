'use strict';
// idempotence: idem for Node.js. Make any side effect safe to retry: run
// work once per idempotency key and replay its outcome to every retry, on
// SQLite, Redis, PostgreSQL or MariaDB, with the records Rust and Python
// services share.

const { openStore, makeIdempotent } = require('./lib/idempotent');
const { idempotentHandler, idempotency } = require('./lib/http');
const { fastifyIdempotency } = require('./lib/fastify');
const errors = require('./lib/errors');

const { fromOutcome: _fromOutcome, ...classes } = errors;

module.exports = { openStore, makeIdempotent, idempotentHandler, idempotency, fastifyIdempotency, ...classes };
