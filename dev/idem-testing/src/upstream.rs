//! Upstreams written in other languages, for the proxy's tests: the
//! example services of `examples/proxy-python` and `examples/proxy-node`,
//! started as child processes on a free port of 127.0.0.1.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use crate::skip;

/// The language an upstream is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    /// `examples/proxy-python/upstream.py`, on the standard library's
    /// `http.server` (`ThreadingHTTPServer`).
    Python,
    /// `examples/proxy-node/upstream.js`, on `node:http`.
    Node,
}

impl Language {
    /// Both, in the order tests run them.
    pub const ALL: [Language; 2] = [Language::Python, Language::Node];

    /// The interpreter's command.
    pub fn interpreter(self) -> &'static str {
        match self {
            Language::Python => "python3",
            Language::Node => "node",
        }
    }

    fn script(self) -> PathBuf {
        let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        match self {
            Language::Python => examples.join("proxy-python/upstream.py"),
            Language::Node => examples.join("proxy-node/upstream.js"),
        }
    }

    /// Whether the interpreter runs here; if not, skips with a printed
    /// reason (`false`), or panics when `CI` is set.
    pub fn available(self) -> bool {
        let runs = Command::new(self.interpreter())
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        runs || skip::<()>(&format!(
            "`{}` is not installed (.ci/setup-debian installs it)",
            self.interpreter()
        ))
        .is_some()
    }
}

/// A running upstream; dropping it kills the process.
#[derive(Debug)]
pub struct Upstream {
    child: Child,
    addr: String,
    language: Language,
}

/// One run the upstream made: its path, the key it was sent, and when (in
/// seconds since the Unix epoch, on the machine's clock).
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The request's path.
    pub path: String,
    /// The `Idempotency-Key` it carried.
    pub key: Option<String>,
    /// When the upstream began it.
    pub at: f64,
}

impl Upstream {
    /// Starts the upstream written in `language`. Panics if it does not
    /// start: call [`Language::available`] first.
    pub fn start(language: Language) -> Upstream {
        let mut child = Command::new(language.interpreter())
            .arg(language.script())
            .args(["--port", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting the {language:?} upstream: {e}"));
        let mut line = String::new();
        let stdout = child.stdout.take().expect("piped");
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the upstream prints its address");
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("the {language:?} upstream printed {line:?}"))
            .to_owned();
        Upstream {
            child,
            addr,
            language,
        }
    }

    /// Its language.
    pub fn language(&self) -> Language {
        self.language
    }

    /// Its base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many runs it has made, on every route (`GET /effects`). A
    /// blocking call on a connection of its own.
    pub fn runs(&self) -> usize {
        let body = self.call("GET", "/effects");
        body.trim()
            .parse()
            .unwrap_or_else(|_| panic!("GET /effects answered {body:?}"))
    }

    /// Every run it has made, in order (`GET /runs`).
    pub fn log(&self) -> Vec<Run> {
        let body = self.call("GET", "/runs");
        let runs: Vec<(String, Option<String>, f64)> =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET /runs: {e}: {body}"));
        runs.into_iter()
            .map(|(path, key, at)| Run { path, key, at })
            .collect()
    }

    /// Lets one request waiting at `/gated` through (`POST /gate`).
    pub fn open_gate(&self) {
        self.call("POST", "/gate");
    }

    fn call(&self, method: &str, path: &str) -> String {
        call(&self.addr, method, path)
    }
}

/// Sends `method path` with an empty body to the server at `addr`
/// (`127.0.0.1:PORT`) on a connection of its own, and answers the body.
/// Blocking; panics on anything but a 2xx answer.
pub fn call(addr: &str, method: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("the upstream is up");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(
        head.starts_with("HTTP/1.1 2") || head.starts_with("HTTP/1.0 2"),
        "{method} {path}: {head}"
    );
    body.to_owned()
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
