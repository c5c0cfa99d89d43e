'use strict';
// The errors idempotent calls throw: idem-core's errors, by class.

/** Base class of every error this package throws. */
class IdempotencyError extends Error {
  constructor(message) {
    super(message);
    this.name = new.target.name;
  }
}

/** The key breaks the rules (1 to 255 visible ASCII characters); nothing
 * was touched and the function did not run. */
class InvalidKeyError extends IdempotencyError {}

/** The key was first used with different arguments; the function did not
 * run. Use a new key for a new request. */
class MismatchError extends IdempotencyError {}

/** Another call holds the key and runs the function now; `retryAfter` is
 * the time left on its lease, in seconds. */
class InProgressError extends IdempotencyError {
  constructor(message, retryAfter) {
    super(message);
    this.retryAfter = retryAfter;
  }
}

/** The store failed. `workRan` false: nothing happened, a retry is safe.
 * true: the side effect happened, its outcome may not be recorded and the
 * key stays held until its lease lapses. */
class StoreError extends IdempotencyError {
  constructor(message, workRan) {
    super(message);
    this.workRan = workRan;
  }
}

/** The function ran, but its lease lapsed and another call took the key
 * over (or the store lost the record); this outcome was not recorded. */
class LeaseLostError extends IdempotencyError {}

/** The arguments or the return value are not JSON. For arguments nothing
 * was claimed; for a return value nothing was recorded and the key was
 * released. */
class EncodeError extends IdempotencyError {}

/** A recorded outcome is not valid JSON: the record is damaged. */
class DecodeError extends IdempotencyError {}

/** An earlier call failed with an error it was told to remember, of a
 * class this function does not name; `value` is the recorded JSON. */
class RememberedError extends IdempotencyError {
  constructor(message, value) {
    super(message);
    this.value = value;
  }
}

const classes = {
  IdempotencyError,
  InvalidKeyError,
  MismatchError,
  InProgressError,
  StoreError,
  LeaseLostError,
  EncodeError,
  DecodeError,
  RememberedError,
};

/** The error an addon `Outcome` of kind `error` stands for. */
function fromOutcome(outcome) {
  switch (outcome.error) {
    case 'InProgressError':
      return new InProgressError(outcome.message, outcome.retryAfter);
    case 'StoreError':
      return new StoreError(outcome.message, outcome.workRan);
    default:
      return new (classes[outcome.error] || IdempotencyError)(outcome.message);
  }
}

module.exports = { ...classes, fromOutcome };
