//! The app behind the `idempotence` package's ASGI middleware: the same
//! routes in FastAPI (`fastapi_app.py`), served by uvicorn in a process of
//! its own that opens the store by URL, forked by one zygote process. The options cross the process
//! boundary as the middleware's keyword arguments (JSON in
//! `IDEM_OPTIONS`), read from `Options` through its public API.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;

use http::{HeaderMap, HeaderValue, Method};
use idem_http::{Admission, Options, Problem};

use crate::backend::store_url;
use crate::Scope;

/// The Python interpreter with `idempotence`, FastAPI and uvicorn, from
/// `IDEM_HTTP_SUITE_PYTHON` (idem-python/ci.sh sets it to its venv's).
pub(crate) fn python() -> Option<String> {
    std::env::var("IDEM_HTTP_SUITE_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
}

/// The process that forks the apps (`fastapi_app.py --zygote`), started
/// once: its imports, most of an app's start, are paid once.
struct Zygote {
    _child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

static ZYGOTE: Mutex<Option<Zygote>> = Mutex::new(None);

/// The app in its child process; dropping it kills the process.
#[derive(Debug)]
pub(crate) struct App {
    pid: String,
    addr: String,
}

impl App {
    /// Starts the app in front of `options`' store. Panics when the store
    /// has no URL (a store made in this process, or a wrapper of one): a
    /// case that needs one skips `Adapter::FastApi`.
    pub(crate) fn start(options: &Options, scope: Scope) -> App {
        let (url, name) = store_url(options.idempotent().store()).expect(
            "Adapter::FastApi needs a backend's store, which the app opens by URL in its process",
        );
        let config = serde_json::json!({
            "IDEM_STORE_URL": url,
            "IDEM_STORE_NAME": name,
            "IDEM_OPTIONS": middleware_options(options).to_string(),
            "IDEM_SCOPE": match scope {
                Scope::TenantHeader => "tenant-header",
                Scope::Shared => "",
            },
        });
        let mut zygote = ZYGOTE.lock().unwrap_or_else(|e| e.into_inner());
        let zygote = zygote.get_or_insert_with(Zygote::start);
        writeln!(zygote.stdin, "{config}").expect("the zygote reads its configs");
        let mut line = String::new();
        zygote
            .stdout
            .read_line(&mut line)
            .expect("the zygote answers");
        let (pid, addr) = line
            .trim()
            .split_once(' ')
            .unwrap_or_else(|| panic!("the zygote answered {line:?}"));
        App {
            pid: pid.to_owned(),
            addr: addr.to_owned(),
        }
    }

    /// Its address, `127.0.0.1:PORT`.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// How many times its handlers ran (`GET /effects`).
    pub(crate) fn runs(&self) -> usize {
        let body = self.call("GET", "/effects");
        body.trim()
            .parse()
            .unwrap_or_else(|_| panic!("GET /effects answered {body:?}"))
    }

    /// Lets one request waiting at its gate through (`POST /gate`).
    pub(crate) fn open_gate(&self) {
        self.call("POST", "/gate");
    }

    fn call(&self, method: &str, path: &str) -> String {
        let mut stream = TcpStream::connect(&self.addr).expect("the app is up");
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: {}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            self.addr
        );
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).unwrap();
        let answer = String::from_utf8_lossy(&answer);
        let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
        assert!(head.starts_with("HTTP/1.1 2"), "{method} {path}: {head}");
        body.to_owned()
    }
}

impl Drop for App {
    fn drop(&mut self) {
        // The zygote reaps it.
        let _ = Command::new("kill").args(["-KILL", &self.pid]).status();
    }
}

impl Zygote {
    fn start() -> Zygote {
        let python = python().expect("IDEM_HTTP_SUITE_PYTHON names the interpreter");
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/fastapi_app.py");
        let mut child = Command::new(&python)
            .arg(script)
            .arg("--zygote")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting the FastAPI apps' zygote with {python}: {e}"));
        Zygote {
            stdin: child.stdin.take().expect("piped"),
            stdout: BufReader::new(child.stdout.take().expect("piped")),
            _child: child,
        }
    }
}

/// What the middleware needs of `options`, read through their public API:
/// getters, and what `admit`, `wait_for` and `request_context` answer.
/// Options no public call reveals (`record_server_errors`, `fail_open`,
/// a key source, fingerprint policies) do not cross: cases that set them
/// skip `Adapter::FastApi`.
pub(crate) fn middleware_options(options: &Options) -> serde_json::Value {
    let idem = options.idempotent();
    let no_headers = HeaderMap::new();
    let require_key = matches!(
        options.admit(&Method::POST, &no_headers),
        Admission::Refuse(Problem::MissingKey(_))
    );
    let mut prefer = HeaderMap::new();
    prefer.insert("prefer", HeaderValue::from_static("wait=100000000"));
    let max_wait = options
        .wait_for(&prefer)
        .map_or(0.0, |wait| wait.as_secs_f64());
    let shared = options.request_context(&no_headers).caller.is_none();
    serde_json::json!({
        "namespace": idem.namespace(),
        "lease": idem.lease().as_secs_f64(),
        "retention": idem.retention().as_secs_f64(),
        "header": options.header_name().as_str(),
        "require_key": require_key,
        "max_request_body": options.max_request_body(),
        "max_response_body": options.max_response_body(),
        "max_streamed_body": options.max_streamed_body(),
        "max_wait": max_wait,
        "shared_across_callers": shared,
    })
}
