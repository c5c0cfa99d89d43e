'use strict';
// `openStore` and `makeIdempotent`: JavaScript moves arguments and results
// as JSON text; claiming, fingerprinting, recording and replaying happen in
// Rust (idem-core), exactly as for Rust's `execute` and Python's decorator.

const native = require('./native');
const errors = require('./errors');

/** Names a store by URL (`memory`, `sqlite:PATH`, `redis://…`,
 * `rediss://…`, `postgres://…`, `mysql://…`, `mariadb://…`); nothing is
 * opened until the first call that uses it. `name` is a Redis key prefix or
 * a SQL table; `nearCache` keeps settled records in the process. */
function openStore(url, { name, nearCache } = {}) {
  if (typeof url !== 'string') throw new TypeError('openStore takes a store URL, a string');
  if (name !== undefined && typeof name !== 'string') throw new TypeError('name must be a string');
  if (nearCache !== undefined && typeof nearCache !== 'boolean') throw new TypeError('nearCache must be a boolean');
  try {
    return native.openStore(url, name, nearCache);
  } catch (error) {
    throw new TypeError(error.message);
  }
}

/** `value` as JSON text, as `JSON.stringify` makes it, or an EncodeError. */
function json(value, what) {
  let text;
  try {
    text = JSON.stringify(value);
  } catch (cause) {
    throw Object.assign(new errors.EncodeError(`${what} is not JSON (${cause.message})`), { cause });
  }
  if (text === undefined) throw new errors.EncodeError(`${what} is not JSON (${typeof value})`);
  return text;
}

/** Throws the error an addon `Outcome` of kind `error` stands for. */
function check(outcome) {
  if (outcome.kind === 'error') throw errors.fromOutcome(outcome);
  return outcome;
}

function picker(option, what) {
  if (typeof option === 'function') return (args) => option(...args);
  if (Number.isInteger(option) && option >= 0) return (args) => args[option];
  if (typeof option === 'string') {
    return (args) => {
      const first = args[0];
      if (first === null || typeof first !== 'object') {
        throw new TypeError(`the ${what} is the first argument's property ${option}, but the first argument is not an object`);
      }
      return first[option];
    };
  }
  throw new TypeError(`${what} must be an argument index, a property name of the first argument, or a function`);
}

function seconds(value, name) {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) {
    throw new TypeError(`${name} must be a finite, non-negative number of seconds`);
  }
  return value;
}

/**
 * Wraps the async function `fn` so that it runs once per idempotency key
 * and every retry with the same key and arguments gets its outcome.
 * See index.d.ts for the options.
 */
function makeIdempotent(fn, options) {
  if (typeof fn !== 'function') throw new TypeError('makeIdempotent takes a function');
  const {
    store,
    key,
    body,
    namespace = '',
    scope = '',
    lease = 60,
    retention = 24 * 3600,
    wait,
    remember = [],
  } = options || {};
  if (!(store instanceof native.Store)) throw new TypeError('options.store must come from openStore');
  const keyOf = picker(key, 'key');
  let bodyOf;
  if (body !== undefined) {
    bodyOf = picker(body, 'body');
  } else if (typeof key === 'string') {
    // The first argument without its key property.
    bodyOf = (args) => {
      const { [key]: _key, ...rest } = args[0];
      return args.length > 1 ? [rest, ...args.slice(1)] : rest;
    };
  } else if (Number.isInteger(key)) {
    // Every argument but the key's.
    bodyOf = (args) => args.filter((_, index) => index !== key);
  } else {
    bodyOf = (args) => args;
  }
  const scopeOf = typeof scope === 'function' ? (args) => scope(...args) : () => scope;
  if (typeof scopeOf([]) !== 'string' && typeof scope !== 'function') throw new TypeError('scope must be a string or a function');
  const remembers =
    typeof remember === 'function'
      ? remember
      : (error) => remember.some((cls) => error instanceof cls);
  const classes = typeof remember === 'function' ? [] : [...remember];
  const guard = new native.Guard(store, {
    namespace,
    lease: seconds(lease, 'lease'),
    retention: seconds(retention, 'retention'),
    wait: wait === undefined ? undefined : seconds(wait, 'wait'),
  });

  const remembered = (text) => {
    const value = JSON.parse(text);
    const cls = classes.find((c) => c.name === value.type);
    if (cls && Array.isArray(value.args)) return new cls(...value.args);
    return new errors.RememberedError(
      `an earlier call under this key failed and its failure is remembered: ${text}`,
      value,
    );
  };

  return async function idempotent(...args) {
    const theKey = keyOf(args);
    if (typeof theKey !== 'string') {
      throw new TypeError(`the idempotency key must be a string, not ${theKey === null ? 'null' : typeof theKey}`);
    }
    const theScope = scopeOf(args);
    if (typeof theScope !== 'string') throw new TypeError('the scope must be a string');
    const request = json(bodyOf(args), 'the arguments that make the request');
    const begun = check(await guard.begin(theKey, theScope, request));
    if (begun.kind === 'replayed') return JSON.parse(begun.value);
    if (begun.kind === 'remembered') throw remembered(begun.value);
    const call = begun.call;
    let result;
    try {
      result = await fn.apply(this, args);
    } catch (error) {
      const keep = error instanceof Error && remembers(error);
      const name = keep ? error.constructor.name : undefined;
      const settled = await call.fail(name, keep ? JSON.stringify([error.message]) : undefined);
      if (settled.message) {
        process.emitWarning(`could not settle the idempotency key after the function threw: ${settled.message}`);
      }
      throw error;
    }
    // A function that returns nothing records null, as JSON.stringify
    // writes undefined in an array.
    let outcome;
    try {
      outcome = json(result === undefined ? null : result, "the function's return value");
    } catch (error) {
      const settled = await call.fail(undefined, undefined);
      error.message += settled.message
        ? `; releasing the key failed too (${settled.message})`
        : '; nothing was recorded and the key was released, so a retry runs the function again';
      throw error;
    }
    check(await call.complete(outcome));
    return result;
  };
}

module.exports = { openStore, makeIdempotent };
