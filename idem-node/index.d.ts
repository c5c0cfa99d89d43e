// Types of the `idempotence` package's JavaScript API (index.js). Written
// by hand: the addon's own surface (lib/native.js) is internal.

/** A store named by URL; opened by the first call that uses it. */
export interface Store {
  /** The store's URL, without its password. */
  readonly url: string;
  /** Whether replays of settled records are answered from this process. */
  readonly nearCache: boolean;
}

/**
 * Names a store by URL: `memory`, `sqlite:PATH`, `redis://…`, `rediss://…`,
 * `postgres://…`, `mysql://…` or `mariadb://…`. Throws a TypeError (that
 * does not repeat the URL) for any other. `name` is a Redis key prefix or a
 * SQL table. `nearCache: true` keeps settled records in each process
 * (idem-core's `NearCache`: 10,000 records, 16 MiB, 60 s at most), so a
 * replay needs no round trip; a record deleted by hand may replay for up to
 * 60 s more.
 */
export function openStore(url: string, options?: { name?: string; nearCache?: boolean }): Store;

/** Picks a value from a call's arguments: an argument's index, a property
 * of the first argument (an object), or a function given the arguments. */
export type Pick<A extends unknown[], T> = number | string | ((...args: A) => T);

export interface IdempotentOptions<A extends unknown[]> {
  /** Where outcomes are kept. */
  store: Store;
  /** Where the idempotency key is: 1 to 255 visible ASCII characters. */
  key: Pick<A, string>;
  /**
   * What makes the request, fingerprinted as canonical JSON in Rust. By
   * default: every argument but the key's (an array) for an index key; the
   * first argument without its key property for a property key; every
   * argument for a function key.
   */
  body?: Pick<A, unknown>;
  /** Separates applications sharing one store. Default "". */
  namespace?: string;
  /** The tenant or principal owning the key. Default "". */
  scope?: string | ((...args: A) => string);
  /** Seconds a crashed call blocks its key; renewed every third of it while
   * the function runs. Default 60. */
  lease?: number;
  /** Seconds an outcome is replayed. Default 86400. */
  retention?: number;
  /** If set, seconds a call that finds the key in progress waits for the
   * outcome instead of throwing InProgressError. */
  wait?: number;
  /**
   * Errors recorded and thrown again to every retry, by class or by a
   * predicate; any other thrown error releases the key, so a retry runs
   * the function again. A remembered error is stored as
   * `{"type": constructor name, "args": [message]}`.
   */
  remember?: Array<new (...args: any[]) => Error> | ((error: Error) => boolean);
}

/**
 * Wraps `fn` so that it runs once per idempotency key; every retry with the
 * same key and arguments gets its outcome. Values travel as
 * `JSON.stringify` makes them; the first call returns the function's own
 * value, a replay its JSON form (`undefined` is recorded as `null`).
 */
export function makeIdempotent<A extends unknown[], R>(
  fn: (...args: A) => Promise<R> | R,
  options: IdempotentOptions<A>,
): (...args: A) => Promise<R>;

/** Base class of every error this package throws. */
export class IdempotencyError extends Error {}
/** The key breaks the rules; nothing was touched. */
export class InvalidKeyError extends IdempotencyError {}
/** The key was first used with different arguments; nothing ran. */
export class MismatchError extends IdempotencyError {}
/** Another call holds the key; `retryAfter` is its lease's time left, in seconds. */
export class InProgressError extends IdempotencyError {
  readonly retryAfter: number;
}
/** The store failed; `workRan` says whether the function had run. */
export class StoreError extends IdempotencyError {
  readonly workRan: boolean;
}
/** The function ran but its lease was lost; its outcome was not recorded. */
export class LeaseLostError extends IdempotencyError {}
/** The arguments or the return value are not JSON. */
export class EncodeError extends IdempotencyError {}
/** A recorded outcome is not valid JSON: the record is damaged. */
export class DecodeError extends IdempotencyError {}
/** A remembered failure of a class this function does not name. */
export class RememberedError extends IdempotencyError {
  readonly value: unknown;
}

/** What a request's fingerprint covers, beside its method, path and content type. */
export interface FingerprintPolicy {
  /** JSON Pointers of the only body fields fingerprinted. */
  include?: string[];
  /** JSON Pointers of body fields left out. */
  exclude?: string[];
  /** Leaves the whole query string out. */
  ignoreQuery?: boolean;
  /** Query parameters left out. */
  ignoreQueryParams?: string[];
}

/** The HTTP protocol's settings; every default is the Rust one. */
export interface HttpOptions {
  /** Where responses are kept. */
  store: Store;
  /** The principal owning keys, from the request (its authenticated user).
   * Without it keys are scoped by the caller as idem-http reads it. */
  scope?: (req: import('node:http').IncomingMessage) => string | Promise<string>;
  /** Separates applications sharing one store. */
  namespace?: string;
  /** Seconds a crashed request blocks its key. Default 60. */
  lease?: number;
  /** Seconds a response is replayed. Default 86400. */
  retention?: number;
  /** The key's header. Default `Idempotency-Key`. */
  header?: string;
  /** Refuses a protected request without a key with 400. Default false. */
  requireKey?: boolean;
  /** The protected methods. Default POST and PATCH. */
  methods?: string[];
  /** The largest request body, bytes; a longer one gets 413. */
  maxRequestBody?: number;
  /** The largest response body recorded whole, bytes; longer ones are recorded in chunks. */
  maxResponseBody?: number;
  /** The largest response body recorded in chunks, bytes. */
  maxStreamedBody?: number;
  /** Records 5xx responses too. Default false: a 5xx releases the key. */
  recordServerErrors?: boolean;
  /** Runs the application unprotected when the store fails. Default false. */
  failOpen?: boolean;
  /** Seconds one store call may take. */
  storeTimeout?: number;
  /** The longest wait a client may ask for, seconds. */
  maxWait?: number;
  /** Keys are not scoped by the caller. */
  sharedAcrossCallers?: boolean;
  /** Whether a caller-scoped request checks for an unscoped record. */
  checkUnscopedRecords?: boolean;
  /** A JSON Pointer to the key in a JSON body, instead of a header. */
  keyPointer?: string;
  /** What the fingerprint covers. */
  policy?: FingerprintPolicy;
  /** Route patterns (`/payments/{id}`, a last `**`) with their own policies; the first match decides. */
  routes?: Array<{ pattern: string; policy: FingerprintPolicy }>;
}

/**
 * A `node:http` request listener running `handler` once per idempotency
 * key and replaying its response (status, headers, body bytes) to every
 * retry, marked `Idempotent-Replayed`. A handler that throws before its
 * response head releases the key and gets a 500; the error goes to
 * `onError` (default console.error).
 */
export function idempotentHandler(
  options: HttpOptions & { onError?: (error: unknown) => void },
  handler: (req: import('node:http').IncomingMessage, res: import('node:http').ServerResponse) => unknown,
): (req: import('node:http').IncomingMessage, res: import('node:http').ServerResponse) => void;

/**
 * Express middleware doing the same for the routes after it. Put it before
 * body parsers: it reads the body and puts it back. Errors reach Express's
 * error handlers; a 5xx is not recorded, so its key is released.
 */
export function idempotency(
  options: HttpOptions,
): (req: import('node:http').IncomingMessage, res: import('node:http').ServerResponse, next: (error?: unknown) => void) => void;

/**
 * A Fastify plugin doing the same for the routes of the instance it is
 * registered on (it is not encapsulated): `app.register(fastifyIdempotency,
 * options)`. It runs in an `onRequest` hook, before Fastify parses the
 * body, so `scope` is given the raw request. A replay or a problem is
 * written after `reply.hijack()`; a thrown error's 500 is not recorded, so
 * its key is released.
 */
export function fastifyIdempotency(
  fastify: { addHook(name: 'onRequest', hook: (request: any, reply: any, done: (error?: Error) => void) => void): unknown },
  options: HttpOptions,
  done: (error?: Error) => void,
): void;
