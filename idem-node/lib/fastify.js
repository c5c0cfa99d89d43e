'use strict';
// The Fastify plugin: the Express middleware's exchange (lib/http.js) in
// an `onRequest` hook. Fastify answers through the raw `res` (writeHead,
// write, end, streams piped into it), so the same capture records every
// reply; a replay or a problem is written to the raw response after
// `reply.hijack()`, so Fastify sends nothing of its own.

const { httpOptions, exchange } = require('./http');

/**
 * Registers idempotency for the routes of the instance it is registered
 * on (it is not encapsulated, as `fastify-plugin` would make it).
 * `options` are those of `idempotency`; `scope(req)` is given the raw
 * request, since it runs before Fastify parses the body.
 */
function fastifyIdempotency(fastify, options, done) {
  let settings;
  try {
    settings = httpOptions(options);
  } catch (error) {
    done(error);
    return;
  }
  fastify.addHook('onRequest', (request, reply, next) => {
    let continued = false;
    exchange(
      settings,
      request.raw,
      reply.raw,
      () => {
        continued = true;
        next();
      },
      () => reply.hijack(),
    ).catch((error) => {
      if (!continued) next(error);
      else if (!reply.raw.writableEnded) reply.raw.destroy(error);
    });
  });
  done();
}

// Not encapsulated: the hook covers the routes of the registering scope.
fastifyIdempotency[Symbol.for('skip-override')] = true;
fastifyIdempotency[Symbol.for('fastify.display-name')] = 'idempotence';

module.exports = { fastifyIdempotency };
