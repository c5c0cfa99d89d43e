//! The app behind the `idempotence` npm package's Express middleware: the
//! same routes in Express (`express_app.js`), served by node in a process
//! of its own that opens the store by URL. The options cross as the
//! FastAPI app's do (`fastapi_app::middleware_options`).
//!
//! One node process serves every app of a run (`express_app.js`), each
//! with its own store, count of runs and gate: a node start per app cost
//! most of the suite's time.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use idem_http::Options;

use crate::child_app::{config, ChildApp, Starter};
use crate::{Adapter, Scope};

/// The node binary, from `IDEM_HTTP_SUITE_NODE` (idem-node/ci.sh sets it;
/// Express comes from idem-node's node_modules, which that script links).
pub(crate) fn node() -> Option<String> {
    std::env::var("IDEM_HTTP_SUITE_NODE")
        .ok()
        .filter(|p| !p.is_empty())
}

/// The node process serving the apps, started by the first app.
static HOST: Mutex<Option<Starter>> = Mutex::new(None);

fn start_host() -> Starter {
    let node = node().expect("IDEM_HTTP_SUITE_NODE names node");
    let suite = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut command = Command::new(node);
    // `--expose-gc`: a closed app's store is collected at once, so its
    // connections close.
    command
        .arg("--expose-gc")
        .arg(suite.join("src/express_app.js"))
        .arg(suite.join("../../idem-node"));
    Starter::spawn(command, "the Express apps' process")
}

/// Starts an app in the node process in front of `options`' store;
/// dropping it closes it. Panics when the store has no URL: a case that
/// needs one skips `Adapter::Express`.
pub(crate) fn start(options: &Options, scope: Scope) -> ChildApp {
    let config = config(options, scope, Adapter::Express);
    let mut host = HOST.lock().unwrap_or_else(|e| e.into_inner());
    let (id, port) = host.get_or_insert_with(start_host).start(&config);
    ChildApp::new(format!("127.0.0.1:{port}"), move || {
        let mut host = HOST.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(host) = host.as_mut() {
            let _ = host.tell(&format!("close {id}"));
        }
    })
}
