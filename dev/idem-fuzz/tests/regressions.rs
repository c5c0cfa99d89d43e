//! What the fuzz targets found, each as a test of the fixed behaviour.

use std::time::Duration;

use idem_core::store::State;
use idem_fuzz::{sqlite_row, stored_response};
use idem_sqlite::rusqlite::params;

/// A payload as `encode` lays it out, with `headers` as given.
fn payload(headers: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut out = vec![1, 0, 0, 200];
    out.extend_from_slice(&(headers.len() as u16).to_be_bytes());
    for (name, value) in headers {
        out.extend_from_slice(&(name.len() as u16).to_be_bytes());
        out.extend_from_slice(name);
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value);
    }
    out.extend_from_slice(&0u64.to_be_bytes());
    out
}

/// The stored-response decoder took payloads the encoder never writes:
/// an uppercase name (replayed lowercased), a `Set-Cookie` or hop-by-hop
/// header (replayed, though never stored), and a name whose values were
/// apart (replayed together).
#[test]
fn a_stored_response_decodes_only_as_the_encoder_writes_it() {
    let refused = |headers: &[(&[u8], &[u8])], why: &str| {
        let error = idem_http::stored::decode(&payload(headers)).unwrap_err();
        assert!(error.to_string().contains(why), "{error}");
    };
    refused(&[(b"X-Request-Id", b"1")], "lowercase");
    refused(&[(b"set-cookie", b"session=1")], "never stored");
    refused(&[(b"transfer-encoding", b"chunked")], "never stored");
    refused(&[(b"connection", b"close")], "never stored");
    refused(
        &[(b"vary", b"accept"), (b"etag", b"1"), (b"vary", b"origin")],
        "apart",
    );
    let kept: &[(&[u8], &[u8])] = &[(b"vary", b"accept"), (b"vary", b"origin"), (b"etag", b"1")];
    assert!(idem_http::stored::decode(&payload(kept)).is_ok());
    // The target itself holds on each.
    stored_response(&payload(&[(b"X-Request-Id", b"1")]));
}

/// Reads the row under "k" with `state` and `lease_until` at `now`.
fn sqlite_record(state: i64, lease_until: Option<i64>) -> idem_core::store::Record {
    let conn = idem_sqlite::fuzzing::open().unwrap();
    conn.execute(
        "INSERT INTO idem_records (key, token, fingerprint, state, payload, lease_until, \
         retain_until) VALUES ('k', ?1, ?2, ?3, x'', ?4, 2000)",
        params![[7u8; 16], [8u8; 32], state, lease_until],
    )
    .unwrap();
    idem_sqlite::fuzzing::load(&conn, "k", 1000)
        .unwrap()
        .unwrap()
}

/// The SQLite store read a finished row's lease deadline into the record
/// (a lease on a completed record), and an in-flight row without one as no
/// lease at all, where the other stores read a lapsed one.
#[test]
fn a_sqlite_record_has_a_lease_exactly_when_in_flight() {
    let completed = sqlite_record(1, Some(1500));
    assert_eq!(completed.state, State::Completed);
    assert_eq!(completed.lease_remaining, None);
    let in_flight = sqlite_record(0, None);
    assert_eq!(in_flight.lease_remaining, Some(Duration::ZERO));
    assert!(in_flight.lease_lapsed());
    let leased = sqlite_record(0, Some(1500));
    assert_eq!(leased.lease_remaining, Some(Duration::from_micros(500)));
    assert_eq!(leased.retention_remaining, Duration::from_micros(1000));
    // The target on the same row: now 1000, then the six columns.
    let mut row = 1000i64.to_be_bytes().to_vec();
    row.extend([4, 0, 16]);
    row.extend([7; 16]);
    row.extend([4, 0, 32]);
    row.extend([8; 32]);
    row.extend([1, 0, 0, 0, 0, 0, 0, 0, 1]);
    row.extend([4, 0, 0]);
    row.push(1);
    row.extend(1500i64.to_be_bytes());
    row.push(1);
    row.extend(2000i64.to_be_bytes());
    sqlite_row(&row);
}

/// A 33-byte stored fingerprint whose scheme byte is 1 read as the scheme-1
/// fingerprint, which is stored in 32 bytes: two stored forms for one
/// fingerprint, so the record did not re-encode as it was read.
#[test]
fn a_scheme_one_fingerprint_has_one_stored_form() {
    let mut long = vec![1u8];
    long.extend([9; 32]);
    assert_eq!(
        idem_core::Fingerprint::try_from(&long[..]),
        Err(idem_core::store::ParseError::FirstSchemeWithByte)
    );
    let mut row = vec![16];
    row.extend([7; 16]);
    row.push(33);
    row.extend(&long);
    row.extend([0, 1, 0, 0, 0]);
    row.extend(0i64.to_be_bytes());
    row.extend(1000i64.to_be_bytes());
    idem_fuzz::postgres_row(&row);
}
