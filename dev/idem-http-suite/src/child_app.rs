//! What the apps in other processes (`fastapi_app`, `express_app`) share:
//! the config an app starts from, the process that starts apps, and the
//! handle of a started app, which calls its test routes.

use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use idem_http::Options;
use idem_testing::upstream;

use crate::backend::store_url;
use crate::fastapi_app::middleware_options;
use crate::{Adapter, Scope};

/// The config of an app in front of `options`' store, as the starting
/// process reads it. Panics when the store has no URL (a store made in
/// this process, or a wrapper of one): a case that needs one skips
/// `adapter`.
pub(crate) fn config(options: &Options, scope: Scope, adapter: Adapter) -> serde_json::Value {
    let (url, name) = store_url(options.idempotent().store()).unwrap_or_else(|| {
        panic!(
            "Adapter::{adapter:?} needs a backend's store, which the app opens by URL in its process"
        )
    });
    serde_json::json!({
        "IDEM_STORE_URL": url,
        "IDEM_STORE_NAME": name,
        "IDEM_OPTIONS": middleware_options(options).to_string(),
        "IDEM_SCOPE": match scope {
            Scope::TenantHeader => "tenant-header",
            Scope::Shared => "",
        },
    })
}

/// A process that starts apps: it reads a config a line and answers each
/// with a line of two words (the app's name there, and where it listens).
pub(crate) struct Starter {
    _child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    what: &'static str,
}

impl Starter {
    /// Spawns `command`, which `what` names in panics.
    pub(crate) fn spawn(mut command: Command, what: &'static str) -> Starter {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| {
                let program = command.get_program().to_string_lossy();
                panic!("starting {what} with {program}: {e}")
            });
        Starter {
            stdin: child.stdin.take().expect("piped"),
            stdout: BufReader::new(child.stdout.take().expect("piped")),
            _child: child,
            what,
        }
    }

    /// Sends `config` and answers the two words of the answer.
    pub(crate) fn start(&mut self, config: &serde_json::Value) -> (String, String) {
        let what = self.what;
        writeln!(self.stdin, "{config}").unwrap_or_else(|e| panic!("{what} reads configs: {e}"));
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("{what} answers: {e}"));
        let (first, second) = line
            .trim()
            .split_once(' ')
            .unwrap_or_else(|| panic!("{what} answered {line:?}"));
        (first.to_owned(), second.to_owned())
    }

    /// Sends `line`, expecting no answer.
    pub(crate) fn tell(&mut self, line: &str) -> std::io::Result<()> {
        writeln!(self.stdin, "{line}")
    }
}

/// An app in another process; dropping it ends the app.
pub(crate) struct ChildApp {
    addr: String,
    end: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl ChildApp {
    /// The app listening at `addr`, `127.0.0.1:PORT`, which `end` ends.
    pub(crate) fn new(addr: String, end: impl FnOnce() + Send + Sync + 'static) -> ChildApp {
        ChildApp {
            addr,
            end: Some(Box::new(end)),
        }
    }

    /// Its address, `127.0.0.1:PORT`.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// How many times its handlers ran (`GET /effects`).
    pub(crate) fn runs(&self) -> usize {
        let body = upstream::call(&self.addr, "GET", "/effects");
        body.trim()
            .parse()
            .unwrap_or_else(|_| panic!("GET /effects answered {body:?}"))
    }

    /// Lets one request waiting at its gate through (`POST /gate`).
    pub(crate) fn open_gate(&self) {
        upstream::call(&self.addr, "POST", "/gate");
    }
}

impl fmt::Debug for ChildApp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChildApp")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Drop for ChildApp {
    fn drop(&mut self) {
        if let Some(end) = self.end.take() {
            end();
        }
    }
}
