//! A generated corpus of request pairs through the layer, per body type:
//! JSON under a route policy, forms, and multipart uploads. Each key gets
//! an original request, an honest retry (fields reordered, other
//! whitespace and escaping, a new multipart boundary, excluded fields and
//! ignored query parameters changed), which must replay, and a changed
//! intent (an included value, a file's bytes, a file name, a value's
//! order), which must get 422. `IDEM_CORPUS_PAIRS` sets the pairs per body
//! type (2,000 by default), `IDEM_CORPUS_SEED` the generator's seed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_core::MemoryStore;
use idem_http::FingerprintPolicy;
use idem_tower::{BoxError, IdempotencyLayer, RequestBody};
use tower::{Service, ServiceBuilder, ServiceExt};

/// SplitMix64: small, seeded, and the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn word(&mut self) -> String {
        const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789 &=+%/?#\"\\-_.~";
        let len = 1 + self.below(10);
        (0..len)
            .map(|_| CHARS[self.below(CHARS.len())] as char)
            .collect()
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

fn pairs() -> usize {
    std::env::var("IDEM_CORPUS_PAIRS").map_or(2000, |n| n.parse().expect("a number of pairs"))
}

fn seed() -> u64 {
    let seed =
        std::env::var("IDEM_CORPUS_SEED").map_or(0x01de_5eed, |n| n.parse().expect("a number"));
    eprintln!("corpus seed {seed}");
    seed
}

/// A request to send: its path and query, content type and body.
struct Sent {
    uri: String,
    content_type: String,
    body: Vec<u8>,
}

/// The layer over a handler that counts its runs.
struct Server<S> {
    service: S,
    runs: Arc<AtomicUsize>,
}

fn server(
    layer: IdempotencyLayer,
) -> Server<
    impl Service<
            Request<Full<Bytes>>,
            Response = Response<idem_tower::ResponseBody>,
            Error = BoxError,
            Future: Send,
        > + Clone
        + Send
        + Sync,
> {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let service =
        ServiceBuilder::new()
            .layer(layer)
            .service_fn(move |request: Request<RequestBody>| {
                let runs = Arc::clone(&counted);
                async move {
                    request.into_body().collect().await?;
                    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    Ok::<_, BoxError>(
                        Response::builder()
                            .status(StatusCode::CREATED)
                            .body(Full::new(Bytes::from(format!("run {run}"))))
                            .unwrap(),
                    )
                }
            });
    Server { service, runs }
}

impl<S> Server<S>
where
    S: Service<
            Request<Full<Bytes>>,
            Response = Response<idem_tower::ResponseBody>,
            Error = BoxError,
            Future: Send,
        > + Clone
        + Send
        + Sync,
{
    async fn send(&self, key: &str, sent: &Sent) -> (StatusCode, bool, Bytes) {
        let request = Request::post(sent.uri.as_str())
            .header("idempotency-key", key)
            .header("content-type", sent.content_type.as_str())
            .body(Full::new(Bytes::from(sent.body.clone())))
            .unwrap();
        let response = self.service.clone().oneshot(request).await.unwrap();
        let replayed = response.headers().contains_key("idempotent-replayed");
        let status = response.status();
        (
            status,
            replayed,
            response.into_body().collect().await.unwrap().to_bytes(),
        )
    }

    /// Sends each triple under a key of its own and counts what came back.
    async fn run(&self, name: &str, triples: Vec<(Sent, Sent, Sent)>) {
        let (mut replayed, mut refused) = (0, 0);
        for (i, (original, retry, changed)) in triples.iter().enumerate() {
            let key = format!("{name}-{i}");
            let first = self.send(&key, original).await;
            assert_eq!(
                (first.0, first.1),
                (StatusCode::CREATED, false),
                "{name} #{i}: first"
            );
            let again = self.send(&key, retry).await;
            assert_eq!(
                (again.0, again.1, &again.2),
                (StatusCode::CREATED, true, &first.2),
                "{name} #{i}: an honest retry replays\n{}\n{}",
                String::from_utf8_lossy(&original.body),
                String::from_utf8_lossy(&retry.body)
            );
            replayed += 1;
            let other = self.send(&key, changed).await;
            assert_eq!(
                other.0,
                StatusCode::UNPROCESSABLE_ENTITY,
                "{name} #{i}: a changed intent is refused\n{}\n{}",
                String::from_utf8_lossy(&original.body),
                String::from_utf8_lossy(&changed.body)
            );
            refused += 1;
        }
        assert_eq!(
            self.runs.load(Ordering::SeqCst),
            triples.len(),
            "{name}: one run per key"
        );
        println!("{name}: {replayed} honest retries replayed, {refused} changed intents refused");
    }
}

// JSON, written with keys in any order and any whitespace.
#[derive(Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(i64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn random(rng: &mut Rng, depth: usize) -> Json {
        match rng.below(if depth > 2 { 4 } else { 6 }) {
            0 => Json::Null,
            1 => Json::Bool(rng.chance(50)),
            2 => Json::Num(rng.next() as i64 >> rng.below(60)),
            3 => Json::Str(rng.word()),
            4 => Json::Arr(
                (0..rng.below(4))
                    .map(|_| Json::random(rng, depth + 1))
                    .collect(),
            ),
            _ => Json::object(rng, depth + 1),
        }
    }

    fn object(rng: &mut Rng, depth: usize) -> Json {
        let mut fields: Vec<(String, Json)> = Vec::new();
        for _ in 0..1 + rng.below(5) {
            let name = format!("k{}", rng.below(1000));
            if fields.iter().all(|(n, _)| *n != name) {
                fields.push((name, Json::random(rng, depth)));
            }
        }
        Json::Obj(fields)
    }

    fn write(&self, rng: &mut Rng, out: &mut String) {
        let space = |rng: &mut Rng, out: &mut String| {
            for _ in 0..rng.below(3) {
                out.push([' ', '\n', '\t', '\r'][rng.below(4)]);
            }
        };
        space(rng, out);
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Num(n) => out.push_str(&n.to_string()),
            Json::Str(s) => {
                out.push('"');
                for c in s.chars() {
                    match c {
                        '"' => out.push_str("\\\""),
                        '\\' => out.push_str("\\\\"),
                        // The same string, escaped another way.
                        c if rng.chance(10) => out.push_str(&format!("\\u{:04x}", c as u32)),
                        c => out.push(c),
                    }
                }
                out.push('"');
            }
            Json::Arr(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write(rng, out);
                }
                out.push(']');
            }
            Json::Obj(fields) => {
                let mut order: Vec<usize> = (0..fields.len()).collect();
                rng.shuffle(&mut order);
                out.push('{');
                for (i, at) in order.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    space(rng, out);
                    Json::Str(fields[at].0.clone()).write(rng, out);
                    out.push(':');
                    fields[at].1.write(rng, out);
                }
                out.push('}');
            }
        }
        space(rng, out);
    }

    fn text(&self, rng: &mut Rng) -> Vec<u8> {
        let mut out = String::new();
        self.write(rng, &mut out);
        out.into_bytes()
    }

    /// Changes one value somewhere, never to what it was.
    fn change(&mut self, rng: &mut Rng) {
        match self {
            Json::Obj(fields) if !fields.is_empty() && rng.chance(70) => {
                let at = rng.below(fields.len());
                fields[at].1.change(rng);
            }
            Json::Arr(items) if !items.is_empty() && rng.chance(70) => {
                let at = rng.below(items.len());
                items[at].change(rng);
            }
            Json::Num(n) => *n = n.wrapping_add(1),
            other => *other = Json::Arr(vec![std::mem::replace(other, Json::Null)]),
        }
    }

    fn set(&mut self, name: &str, value: Json) {
        if let Json::Obj(fields) = self {
            fields.retain(|(n, _)| n != name);
            fields.push((name.to_owned(), value));
        }
    }
}

#[tokio::test]
async fn json_retries_replay_under_a_policy_and_changed_intents_get_422() {
    let policy = FingerprintPolicy::new()
        .exclude(["/client_ts", "/meta/trace_id"])
        .ignore_query_params(["attempt"]);
    let server = server(
        IdempotencyLayer::new(MemoryStore::new()).with_route_fingerprint_policy("/orders", policy),
    );
    let mut rng = Rng(seed());
    let json = "application/json".to_owned();
    let triples = (0..pairs())
        .map(|_| {
            let mut doc = Json::object(&mut rng, 1);
            let meta = |rng: &mut Rng, doc: &mut Json| {
                doc.set("client_ts", Json::Num(rng.next() as i64));
                let mut meta = Json::Obj(vec![("source".into(), Json::Str("app".into()))]);
                meta.set("trace_id", Json::Str(rng.word()));
                doc.set("meta", meta);
            };
            meta(&mut rng, &mut doc);
            let original = Sent {
                uri: "/orders?attempt=1&region=eu".to_owned(),
                content_type: json.clone(),
                body: doc.text(&mut rng),
            };
            let mut retried = doc.clone();
            meta(&mut rng, &mut retried);
            let retry = Sent {
                uri: format!("/orders?attempt={}&region=eu", 2 + rng.below(5)),
                content_type: json.clone(),
                body: retried.text(&mut rng),
            };
            let mut changed = doc.clone();
            if let Json::Obj(fields) = &mut changed {
                // Any field but the excluded ones.
                let included: Vec<usize> = (0..fields.len())
                    .filter(|&i| fields[i].0 != "client_ts" && fields[i].0 != "meta")
                    .collect();
                match included.is_empty() || rng.chance(10) {
                    true => fields.push(("added".into(), Json::Null)),
                    false => fields[included[rng.below(included.len())]]
                        .1
                        .change(&mut rng),
                }
            }
            let changed = Sent {
                uri: original.uri.clone(),
                content_type: json.clone(),
                body: changed.text(&mut rng),
            };
            (original, retry, changed)
        })
        .collect();
    server.run("json", triples).await;
}

/// Form fields, written with escapes chosen at random.
fn form_text(rng: &mut Rng, fields: &[(String, String)]) -> Vec<u8> {
    let encode = |rng: &mut Rng, text: &str| {
        let mut out = String::new();
        for byte in text.bytes() {
            let plain = byte.is_ascii_alphanumeric() || b"-_.*".contains(&byte);
            match byte {
                b' ' if rng.chance(50) => out.push('+'),
                _ if plain && !rng.chance(10) => out.push(byte as char),
                _ if rng.chance(50) => out.push_str(&format!("%{byte:02X}")),
                _ => out.push_str(&format!("%{byte:02x}")),
            }
        }
        out
    };
    let pieces: Vec<String> = fields
        .iter()
        .map(|(name, value)| format!("{}={}", encode(rng, name), encode(rng, value)))
        .collect();
    pieces.join("&").into_bytes()
}

/// The same fields with the order of distinct names shuffled and the order
/// of one name's values kept.
fn regroup<T: Clone>(rng: &mut Rng, fields: &[(String, T)]) -> Vec<(String, T)> {
    let mut names: Vec<&String> = Vec::new();
    for (name, _) in fields {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    rng.shuffle(&mut names);
    // Interleave names at random while keeping each name's own order.
    let mut queues: Vec<Vec<(String, T)>> = names
        .iter()
        .map(|n| fields.iter().filter(|(m, _)| m == *n).cloned().collect())
        .collect();
    let mut out = Vec::new();
    while queues.iter().any(|q| !q.is_empty()) {
        let live: Vec<usize> = (0..queues.len())
            .filter(|&i| !queues[i].is_empty())
            .collect();
        let pick = live[rng.below(live.len())];
        out.push(queues[pick].remove(0));
    }
    out
}

#[tokio::test]
async fn form_retries_replay_and_changed_intents_get_422() {
    let server = server(IdempotencyLayer::new(MemoryStore::new()));
    let mut rng = Rng(seed() ^ 1);
    let ct = "application/x-www-form-urlencoded".to_owned();
    let triples = (0..pairs())
        .map(|_| {
            let mut fields: Vec<(String, String)> = (0..1 + rng.below(8))
                .map(|_| (format!("f{}", rng.below(6)), rng.word()))
                .collect();
            if rng.chance(30) {
                fields.push(("amount".into(), "1 250".into()));
            }
            let original = Sent {
                uri: "/charges".into(),
                content_type: ct.clone(),
                body: form_text(&mut rng, &fields),
            };
            let regrouped = regroup(&mut rng, &fields);
            let retry = Sent {
                uri: "/charges".into(),
                content_type: ct.clone(),
                body: form_text(&mut rng, &regrouped),
            };
            let mut changed = fields.clone();
            let at = rng.below(changed.len());
            let twin = (0..changed.len()).find(|&j| {
                j != at && changed[j].0 == changed[at].0 && changed[j].1 != changed[at].1
            });
            match (rng.below(3), twin) {
                // Two values of one name in the other order.
                (0, Some(j)) => changed.swap(at, j),
                (1, _) => changed.push((changed[at].0.clone(), "another".into())),
                _ => changed[at].1.push('x'),
            }
            let changed = Sent {
                uri: "/charges".into(),
                content_type: ct.clone(),
                body: form_text(&mut rng, &changed),
            };
            (original, retry, changed)
        })
        .collect();
    server.run("form", triples).await;
}

/// A part: name, file name and content type (for a file), bytes.
#[derive(Clone)]
struct Part {
    filename: Option<String>,
    content_type: Option<String>,
    data: Vec<u8>,
}

fn multipart_text(rng: &mut Rng, boundary: &str, parts: &[(String, Part)]) -> Vec<u8> {
    let mut out = Vec::new();
    if rng.chance(20) {
        out.extend_from_slice(b"a preamble to ignore\r\n");
    }
    for (name, part) in parts {
        let disposition = ["Content-Disposition", "content-disposition"][rng.below(2)];
        out.extend_from_slice(
            format!("--{boundary}\r\n{disposition}: form-data; name=\"{name}\"").as_bytes(),
        );
        if let Some(filename) = &part.filename {
            out.extend_from_slice(format!("; filename=\"{filename}\"").as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        if let Some(content_type) = &part.content_type {
            out.extend_from_slice(format!("Content-Type: {content_type}\r\n").as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&part.data);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    out
}

#[tokio::test]
async fn multipart_retries_replay_with_a_new_boundary_and_changed_intents_get_422() {
    let server = server(IdempotencyLayer::new(MemoryStore::new()));
    let mut rng = Rng(seed() ^ 2);
    let boundary = |rng: &mut Rng| format!("----formdata-{:016x}", rng.next());
    let sent = |rng: &mut Rng, parts: &[(String, Part)]| {
        let b = boundary(rng);
        Sent {
            uri: "/uploads".into(),
            content_type: format!("multipart/form-data; boundary={b}"),
            body: multipart_text(rng, &b, parts),
        }
    };
    let triples = (0..pairs())
        .map(|_| {
            let parts: Vec<(String, Part)> = (0..1 + rng.below(5))
                .map(|_| {
                    let file = rng.chance(50);
                    let part = Part {
                        filename: file.then(|| format!("{}.bin", rng.below(100))),
                        content_type: file
                            .then(|| ["image/png", "application/pdf"][rng.below(2)].into()),
                        data: (0..rng.below(200)).map(|_| rng.next() as u8).collect(),
                    };
                    (format!("p{}", rng.below(4)), part)
                })
                .collect();
            let original = sent(&mut rng, &parts);
            let regrouped = regroup(&mut rng, &parts);
            let retry = sent(&mut rng, &regrouped);
            let mut changed = parts.clone();
            let at = rng.below(changed.len());
            let part = &mut changed[at].1;
            match rng.below(4) {
                // Another file: other bytes.
                0 if !part.data.is_empty() => {
                    let i = rng.below(part.data.len());
                    part.data[i] ^= 1 + rng.below(255) as u8;
                }
                1 => {
                    part.filename = Some(format!(
                        "{}other.bin",
                        part.filename.clone().unwrap_or_default()
                    ))
                }
                2 => {
                    part.content_type = Some(format!(
                        "{}x",
                        part.content_type.clone().unwrap_or_default()
                    ))
                }
                _ => part.data.push(b'!'),
            }
            let changed = sent(&mut rng, &changed);
            (original, retry, changed)
        })
        .collect();
    server.run("multipart", triples).await;
}
