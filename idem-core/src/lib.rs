//! Make any side effect safe to retry.
//!
//! **Placeholder docs, replaced below.**
#![forbid(unsafe_code)]

mod error;
mod fingerprint;
mod idempotent;
mod key;
mod lease;
mod machine;
mod memory;
mod record;
mod store;

pub use error::{Error, When};
pub use fingerprint::Fingerprint;
pub use idempotent::{Idempotent, DEFAULT_LEASE, DEFAULT_RETENTION};
pub use key::{validate_client_key, Key, KeyError, MAX_KEY_LEN, MAX_SCOPE_LEN};
pub use lease::{Begin, Lease, Replay};
pub use memory::MemoryStore;
pub use record::{NewRecord, Record, State, Token};
pub use store::{Insert, Store, StoreError, StoreErrorKind};
