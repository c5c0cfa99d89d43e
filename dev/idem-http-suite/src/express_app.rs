//! The app behind the `idempotence` npm package's Express middleware: the
//! same routes in Express (`express_app.js`), served by node in a process
//! of its own that opens the store by URL. The options cross as the
//! FastAPI app's do (`fastapi_app::middleware_options`).
//!
//! One node process serves every app of a run (`express_app.js`), each
//! with its own store, count of runs and gate: a node start per app cost
//! most of the suite's time.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;

use idem_http::Options;

use crate::backend::store_url;
use crate::fastapi_app::middleware_options;
use crate::Scope;

/// The node binary, from `IDEM_HTTP_SUITE_NODE` (idem-node/ci.sh sets it;
/// Express comes from idem-node's node_modules, which that script links).
pub(crate) fn node() -> Option<String> {
    std::env::var("IDEM_HTTP_SUITE_NODE")
        .ok()
        .filter(|p| !p.is_empty())
}

/// The node process serving the apps, started by the first app.
struct Host {
    _child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

static HOST: Mutex<Option<Host>> = Mutex::new(None);

impl Host {
    fn start() -> Host {
        let node = node().expect("IDEM_HTTP_SUITE_NODE names node");
        let suite = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let package = suite.join("../../idem-node");
        // `--expose-gc`: a closed app's store is collected at once, so its
        // connections close.
        let mut child = Command::new(&node)
            .arg("--expose-gc")
            .arg(suite.join("src/express_app.js"))
            .arg(package)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting the Express apps' process with {node}: {e}"));
        Host {
            stdin: child.stdin.take().expect("piped"),
            stdout: BufReader::new(child.stdout.take().expect("piped")),
            _child: child,
        }
    }
}

/// An app in the node process; dropping it closes it.
#[derive(Debug)]
pub(crate) struct App {
    id: String,
    addr: String,
}

impl App {
    /// Starts the app in front of `options`' store. Panics when the store
    /// has no URL (a store made in this process, or a wrapper of one): a
    /// case that needs one skips `Adapter::Express`.
    pub(crate) fn start(options: &Options, scope: Scope) -> App {
        let (url, name) = store_url(options.idempotent().store()).expect(
            "Adapter::Express needs a backend's store, which the app opens by URL in its process",
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
        let mut host = HOST.lock().unwrap_or_else(|e| e.into_inner());
        let host = host.get_or_insert_with(Host::start);
        writeln!(host.stdin, "{config}").expect("the apps' process reads its configs");
        let mut line = String::new();
        host.stdout
            .read_line(&mut line)
            .expect("the apps' process answers");
        let (id, port) = line
            .trim()
            .split_once(' ')
            .unwrap_or_else(|| panic!("the Express apps' process answered {line:?}"));
        App {
            id: id.to_owned(),
            addr: format!("127.0.0.1:{port}"),
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
        let mut host = HOST.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(host) = host.as_mut() {
            let _ = writeln!(host.stdin, "close {}", self.id);
        }
    }
}
