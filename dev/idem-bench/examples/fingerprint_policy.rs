//! What the request fingerprint costs the adapters now that it goes
//! through `Options::fingerprint` (route policies, form and multipart
//! bodies), against `lazy_fingerprint`, which the adapters called before,
//! on the same bodies in alternating batches of one run; medians per call.
//!
//! ```sh
//! cargo run --release -p idem-bench --example fingerprint_policy [BATCHES]
//! ```
//!
//! Rows: a 1 KiB and a 100-byte JSON body with no policy (the ratio that
//! must stay within 1.1), the 1 KiB body under an exclude policy, and a
//! form and a multipart body of about 1 KiB, each against the byte-exact
//! fingerprint of the same body.

use std::hint::black_box;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, Method, Uri};
use idem_core::MemoryStore;
use idem_http::{FingerprintPolicy, Options};

const CALLS: u32 = 2000;

/// A request to fingerprint.
struct Request {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
}

impl Request {
    fn new(uri: &str, content_type: &str, body: String) -> Request {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::CONTENT_TYPE, content_type.parse().unwrap());
        Request {
            method: Method::POST,
            uri: uri.parse().unwrap(),
            headers,
            body: Bytes::from(body),
        }
    }
}

/// Nanoseconds per call of `f`, over `CALLS` calls.
fn batch(f: &dyn Fn() -> u8) -> f64 {
    let started = Instant::now();
    for _ in 0..CALLS {
        black_box(f());
    }
    started.elapsed().as_nanos() as f64 / f64::from(CALLS)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The medians of `baseline` and `measured`, run in alternating batches.
fn compare(batches: usize, baseline: &dyn Fn() -> u8, measured: &dyn Fn() -> u8) -> (f64, f64) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..batches {
        a.push(batch(baseline));
        b.push(batch(measured));
    }
    (median(a), median(b))
}

fn main() {
    let batches: usize = std::env::args().nth(1).map_or(31, |n| {
        n.parse().expect("usage: fingerprint_policy [BATCHES]")
    });
    let items: Vec<String> = (0..12)
        .map(|i| {
            format!(
                r#"{{"sku":"sku-{i:04}","quantity":{},"unit_price":{},"note":"gift wrap"}}"#,
                i + 1,
                1250 + i
            )
        })
        .collect();
    let kib = format!(
        r#"{{"amount":1250,"currency":"EUR","customer":"cus_4f9a2c81d0e7","description":"monthly plan 2024-117","client_ts":1764633600,"items":[{}]}}"#,
        items.join(",")
    );
    let small = r#"{"amount":1250,"currency":"EUR","customer":"cus_4f9a2c81d0e7","description":"monthly plan 2024-117"}"#;
    let form: String = (0..40)
        .map(|i| format!("item%5B{i}%5D=sku-{i:04}+x{}", i + 1))
        .collect::<Vec<_>>()
        .join("&");
    let boundary = "----WebKitFormBoundary7MA4YWxkTrZu0gW";
    let multipart: String = (0..6)
        .map(|i| {
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"f{i}\"; filename=\"f{i}.txt\"\r\n\
                 Content-Type: text/plain\r\n\r\n{}\r\n",
                "x".repeat(100)
            )
        })
        .collect::<String>()
        + &format!("--{boundary}--\r\n");
    let plain = Options::new(MemoryStore::new());
    let policy = Options::new(MemoryStore::new())
        .with_fingerprint_policy(FingerprintPolicy::new().exclude(["/client_ts"]));

    let json = "application/json";
    let rows = [
        (
            "JSON, no policy",
            Request::new("/pay", json, kib.clone()),
            &plain,
            true,
        ),
        (
            "JSON (100 B), no policy",
            Request::new("/pay", json, small.to_owned()),
            &plain,
            true,
        ),
        (
            "JSON, exclude policy",
            Request::new("/pay", json, kib),
            &policy,
            true,
        ),
        (
            "form, no policy",
            Request::new("/pay", "application/x-www-form-urlencoded", form),
            &plain,
            false,
        ),
        (
            "multipart, no policy",
            Request::new(
                "/pay",
                &format!("multipart/form-data; boundary={boundary}"),
                multipart,
            ),
            &plain,
            false,
        ),
    ];
    println!("request fingerprint, median of {batches} alternating batches of {CALLS} calls");
    println!(
        "{:<26} {:>7} {:>10} {:>10} {:>7}",
        "row", "bytes", "before ns", "now ns", "ratio"
    );
    for (name, r, options, lazy) in &rows {
        // Before: the function the adapters called (JSON), or the bytes
        // as they are (forms and multipart bodies were not canonicalised).
        let before = || -> u8 {
            match lazy {
                true => idem_http::lazy_fingerprint(&r.method, &r.uri, &r.headers, &r.body)
                    .current()
                    .scheme(),
                false => {
                    idem_http::raw_fingerprint(&r.method, &r.uri, &r.headers, &r.body).scheme()
                }
            }
        };
        let now = || {
            options
                .fingerprint(&r.method, &r.uri, &r.headers, &r.body)
                .current()
                .scheme()
        };
        let (a, b) = compare(batches, &before, &now);
        println!(
            "{name:<26} {:>7} {a:>10.0} {b:>10.0} {:>7.3}",
            r.body.len(),
            b / a
        );
    }
}
