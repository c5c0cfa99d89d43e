//! The app behind the `idempotence` package's ASGI middleware: the same
//! routes in FastAPI (`fastapi_app.py`), served by uvicorn in a process of
//! its own that opens the store by URL, forked by one zygote process. The options cross the process
//! boundary as the middleware's keyword arguments (JSON in
//! `IDEM_OPTIONS`), read from `Options` through its public API.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use http::{HeaderMap, HeaderValue, Method};
use idem_http::{Admission, Options, Problem};

use crate::child_app::{config, ChildApp, Starter};
use crate::{Adapter, Scope};

/// The Python interpreter with `idempotence`, FastAPI and uvicorn, from
/// `IDEM_HTTP_SUITE_PYTHON` (idem-python/ci.sh sets it to its venv's).
pub(crate) fn python() -> Option<String> {
    std::env::var("IDEM_HTTP_SUITE_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
}

/// The process that forks the apps (`fastapi_app.py --zygote`), started
/// once: its imports, most of an app's start, are paid once.
static ZYGOTE: Mutex<Option<Starter>> = Mutex::new(None);

fn start_zygote() -> Starter {
    let python = python().expect("IDEM_HTTP_SUITE_PYTHON names the interpreter");
    let mut command = Command::new(python);
    command
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/fastapi_app.py"))
        .arg("--zygote");
    Starter::spawn(command, "the FastAPI apps' zygote")
}

/// Starts the app in a child process in front of `options`' store;
/// dropping it kills the process. Panics when the store has no URL: a
/// case that needs one skips `Adapter::FastApi`.
pub(crate) fn start(options: &Options, scope: Scope) -> ChildApp {
    let config = config(options, scope, Adapter::FastApi);
    let mut zygote = ZYGOTE.lock().unwrap_or_else(|e| e.into_inner());
    let (pid, addr) = zygote.get_or_insert_with(start_zygote).start(&config);
    ChildApp::new(addr, move || {
        // The zygote reaps it.
        let _ = Command::new("kill").args(["-KILL", &pid]).status();
    })
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
