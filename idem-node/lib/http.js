'use strict';
// The `node:http` wrapper and the Express middleware: idem-http's exchange
// (the Rust half, src/http.rs) decides; JavaScript reads the request body,
// hands the application's response to the run, and writes the answer.
//
// The application answers through the `res` it is given, whose writeHead,
// write and end are replaced: every way of answering (res.send, res.json,
// res.write + res.end, a stream piped into res) ends in them. Its bytes go
// to the exchange, never to the socket; the socket gets the answer the
// exchange gives back, through the methods the response had before.

const native = require('./native');

/** The exchange's settings over a store; see index.d.ts. */
function httpOptions(options) {
  const { store, scope, ...init } = options || {};
  if (!(store instanceof native.Store)) throw new TypeError('options.store must come from openStore');
  if (scope !== undefined && typeof scope !== 'function') {
    throw new TypeError('options.scope must be a function of the request');
  }
  let native_;
  try {
    native_ = new native.HttpOptions(store, init);
  } catch (error) {
    throw new TypeError(error.message);
  }
  return { native: native_, scope };
}

/**
 * Reads the body of `req`, at most `limit` bytes, and puts it back in the
 * stream, so the application (a body parser) reads it as if untouched. It
 * is read in paused mode and put back with `unshift` before the stream
 * emits 'end', which `unshift` allows.
 */
function readBody(req, limit) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    const finish = (error) => {
      req.removeListener('readable', onReadable);
      req.removeListener('error', finish);
      req.removeListener('aborted', onAborted);
      const body = Buffer.concat(chunks, size);
      if (body.length > 0) req.unshift(body);
      if (error) reject(error);
      else resolve(body);
    };
    const onAborted = () => finish(new Error('the client closed the request before its body was read'));
    function onReadable() {
      let chunk;
      while ((chunk = req.read()) !== null) {
        chunks.push(chunk);
        size += chunk.length;
        if (size > limit) return finish();
      }
      // All of it is here: the parser marks the message complete before
      // it ends the stream.
      if (req.complete || req._readableState.ended) finish();
    }
    if (req.readableEnded) {
      reject(new Error('the request body was read before the idempotency middleware: put it before body parsers'));
      return;
    }
    req.on('readable', onReadable);
    req.once('error', finish);
    req.once('aborted', onAborted);
  });
}

/** A response's headers as raw headers, `[name, value, …]`. */
function rawOf(headers) {
  const raw = [];
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    for (const one of Array.isArray(value) ? value : [value]) raw.push(name, String(one));
  }
  return raw;
}

/** The headers writeHead was given, in any of its forms, as raw headers. */
function rawOfArgument(headers) {
  if (!headers) return [];
  if (Array.isArray(headers)) {
    if (headers.length && Array.isArray(headers[0])) return headers.flatMap(([n, v]) => [n, String(v)]);
    return headers.map(String);
  }
  return rawOf(headers);
}

/** Writes `answer` to the socket with the response's own methods. */
async function deliver(res, real, answer) {
  for (const name of res.getHeaderNames()) res.removeHeader(name);
  const raw = answer.headers;
  const grouped = new Map();
  for (let i = 0; i < raw.length; i += 2) {
    const values = grouped.get(raw[i]) || [];
    values.push(raw[i + 1]);
    grouped.set(raw[i], values);
  }
  for (const [name, values] of grouped) res.setHeader(name, values.length === 1 ? values[0] : values);
  real.writeHead.call(res, answer.status);
  const whole = answer.whole;
  if (whole !== null) {
    real.end.call(res, whole);
    return;
  }
  // The socket's close, not the response's: `capture` holds the
  // response's back from the application until it ends.
  const socket = res.socket;
  try {
    for (let frame; (frame = await answer.next()) !== null; ) {
      if (!real.write.call(res, frame) && !res.destroyed) {
        await new Promise((resolve) => {
          const done = () => {
            res.off('drain', done);
            if (socket) socket.off('close', done);
            resolve();
          };
          res.on('drain', done);
          if (socket) socket.on('close', done);
        });
      }
      if (res.destroyed) return;
    }
  } catch {
    // The body failed: the response is cut short, never ended cleanly.
    real.destroy.call(res);
    return;
  }
  real.end.call(res);
}

/** Frames kept in flight before `write` asks its writer to wait. */
const IN_FLIGHT = 16;

/** The methods of `res` that `capture` replaces, as they are now. */
function methodsOf(res) {
  return { writeHead: res.writeHead, write: res.write, end: res.end, destroy: res.destroy, emit: res.emit };
}

/**
 * Hands every way `res` answers to `run`: the head on writeHead or the
 * first write or end, the body's chunks in order, its end. A `destroy`
 * before the end (what `stream.pipeline` does when a stream piped into
 * `res` fails) calls `onDestroy` instead of closing the socket: the client
 * gets what Rust answers for a failed body. A client that hangs up is
 * not the application's business: the response's 'close' is held back
 * until the application ends, so a stream piped into `res` goes on and its
 * recording is whole. Returns the methods `res` had, and `headSent()`.
 */
function capture(res, run, onEnd, onDestroy) {
  const real = methodsOf(res);
  let head = false;
  let ended = false;
  let open = true;
  let queue = Promise.resolve();
  let inFlight = 0;
  let wantsDrain = false;

  const respond = (status, extra) => {
    if (head) return;
    head = true;
    const raw = rawOf(res.getHeaders());
    const added = rawOfArgument(extra);
    // Headers given to writeHead take the place of those set before.
    const names = new Set();
    for (let i = 0; i < added.length; i += 2) names.add(added[i].toLowerCase());
    const kept = [];
    for (let i = 0; i < raw.length; i += 2) if (!names.has(raw[i].toLowerCase())) kept.push(raw[i], raw[i + 1]);
    res.statusCode = status;
    if (!run.respond(status, kept.concat(added))) open = false;
  };
  const send = (chunk, encoding, callback) => {
    if (typeof encoding === 'function') [callback, encoding] = [encoding, undefined];
    if (chunk === undefined || chunk === null || chunk.length === 0) {
      if (callback) process.nextTick(callback);
      return true;
    }
    const buffer = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk, encoding || 'utf8');
    inFlight += 1;
    queue = queue.then(async () => {
      if (open && !(await run.send(buffer))) open = false;
      inFlight -= 1;
      if (callback) callback();
      if (wantsDrain && inFlight === 0) {
        wantsDrain = false;
        res.emit('drain');
      }
    });
    if (inFlight >= IN_FLIGHT) {
      wantsDrain = true;
      return false;
    }
    return true;
  };

  res.writeHead = function writeHead(status, reason, headers) {
    if (typeof reason !== 'string') headers = reason;
    else res.statusMessage = reason;
    respond(status, headers);
    return res;
  };
  res.write = function write(chunk, encoding, callback) {
    if (ended) throw new Error('write after end');
    respond(res.statusCode);
    return send(chunk, encoding, callback);
  };
  res.end = function end(chunk, encoding, callback) {
    if (typeof chunk === 'function') [callback, chunk] = [chunk, undefined];
    if (typeof encoding === 'function') [callback, encoding] = [encoding, undefined];
    if (ended) return res;
    respond(res.statusCode);
    send(chunk, encoding);
    ended = true;
    queue = queue.then(() => {
      run.end();
      if (callback) callback();
    });
    onEnd();
    return res;
  };
  res.destroy = function destroy(error) {
    if (!ended) onDestroy(error === undefined || error === null ? new Error('the response was destroyed') : error);
    return res;
  };
  let closed = false;
  res.emit = function emit(name, ...args) {
    if (name === 'close' && !ended) {
      closed = true;
      return false;
    }
    return real.emit.call(res, name, ...args);
  };
  const restore = () => {
    Object.assign(res, real);
    if (closed) res.emit('close');
  };
  return { real, restore, headSent: () => head, ended: () => ended };
}

/**
 * Runs `app(req, res, protectedRun)` under the exchange; the answer
 * decided by Rust goes to the socket. The application is done when it
 * calls `res.end`; one that throws (or whose Promise rejects) first gets
 * its key released if no head was sent, and the error is thrown again.
 * `onAnswer()` is called when Rust answers and the application does not
 * run (a framework is told to leave the response alone).
 */
async function exchange(settings, req, res, app, onAnswer) {
  const options = settings.native;
  if (!options.admits(req.method, req.rawHeaders)) return app(req, res, false);
  const body = await readBody(req, options.maxRequestBody + 1);
  const scope = settings.scope ? await settings.scope(req) : undefined;
  if (scope !== undefined && typeof scope !== 'string') throw new TypeError('the scope function must return a string');
  const started = await options.start(req.method, req.url, req.rawHeaders, body, scope);
  if (started.kind === 'pass') return app(req, res, false);
  if (started.kind === 'answer') {
    if (onAnswer) onAnswer();
    await deliver(res, methodsOf(res), started.answer);
    return undefined;
  }
  const run = started.run;
  let captured;
  let destroyed;
  const finished = new Promise((resolve, reject) => {
    captured = capture(res, run, resolve, (error) => {
      destroyed = error;
      reject(error);
    });
    Promise.resolve()
      .then(() => app(req, res, true))
      .catch(reject);
  });
  // Delivered while the application sends: a streamed body waits for its
  // reader.
  const delivered = run.answer().then((answer) => (answer === null ? null : deliver(res, captured.real, answer)));
  let failure;
  try {
    await finished;
  } catch (error) {
    failure = error === undefined ? new Error('the application failed') : error;
  }
  if (failure !== undefined) {
    if (!captured.headSent()) run.abort();
    else if (!captured.ended()) await run.fail(String(failure && failure.message));
  }
  await delivered;
  captured.restore();
  if (failure !== undefined && failure === destroyed) {
    // Before its head the key was released and nothing is answered: the
    // application closed the connection, and so it is closed.
    if (!captured.headSent()) res.destroy(failure);
    return undefined;
  }
  if (failure !== undefined) throw failure;
  return undefined;
}

/**
 * A `node:http` request listener that runs `handler` once per
 * idempotency key and replays its response to every retry. A handler
 * that throws before its response head releases the key and gets a 500;
 * the error goes to `onError` (default: console.error).
 */
function idempotentHandler(options, handler) {
  if (typeof handler !== 'function') throw new TypeError('idempotentHandler takes a request handler');
  const { onError = (error) => console.error(error), ...rest } = options || {};
  const settings = httpOptions(rest);
  return function listener(req, res) {
    exchange(settings, req, res, (q, s) => handler(q, s)).catch((error) => {
      if (!res.headersSent) {
        res.statusCode = 500;
        res.setHeader('content-type', 'text/plain; charset=utf-8');
        res.end('Internal Server Error');
      } else if (!res.writableEnded) {
        res.destroy();
      }
      onError(error);
    });
  };
}

/**
 * Express middleware doing the same for the routes after it; put it
 * before body parsers. `scope(req)` names the principal owning keys.
 * The application's errors reach Express's error handlers; a 5xx is not
 * recorded (unless `recordServerErrors`), so its key is released.
 */
function idempotency(options) {
  const settings = httpOptions(options);
  return function idempotency(req, res, next) {
    let nextCalled = false;
    exchange(settings, req, res, () => {
      nextCalled = true;
      next();
    }).catch((error) => {
      if (!nextCalled || !res.headersSent) next(error);
      else if (!res.writableEnded) res.destroy(error);
    });
  };
}

module.exports = { idempotentHandler, idempotency, httpOptions, exchange };
