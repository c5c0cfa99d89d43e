//! The tokio runtime the extension runs on: one per process, made on first
//! use, so a server that imports the app and then forks its workers gets a
//! working runtime in each worker.

use std::cell::OnceCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3_async_runtimes::generic::{ContextExt, JoinError, Runtime as GenericRuntime};
use pyo3_async_runtimes::TaskLocals;
use tokio::runtime::Runtime;

// The runtime and the process it was made in. A forked child inherits it
// but none of its threads: a different process id means it is dead here.
// Callers hold the GIL, as does the thread that forks, so no other thread
// is inside this lock when a child is forked.
static CURRENT: Mutex<Option<(u32, &'static Runtime)>> = Mutex::new(None);

/// This process's runtime, made on first use. Call it holding the GIL.
pub(crate) fn runtime(_attached: Python<'_>) -> &'static Runtime {
    let pid = std::process::id();
    let mut current = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
    match *current {
        Some((owner, runtime)) if owner == pid => runtime,
        _ => {
            // The parent's runtime is leaked, never dropped: dropping it
            // would join worker threads that do not exist in this process.
            let runtime: &'static Runtime = Box::leak(Box::new(
                tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .thread_name("idempotence")
                    .build()
                    .expect("cannot start a tokio runtime (out of threads or file descriptors)"),
            ));
            *current = Some((pid, runtime));
            runtime
        }
    }
}

/// Runs `future` on this process's runtime with the GIL released, for a
/// synchronous call.
pub(crate) fn block_on<F>(py: Python<'_>, future: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    let runtime = runtime(py);
    py.detach(|| runtime.block_on(future))
}

/// Makes `future` an asyncio awaitable, run on this process's runtime.
pub(crate) fn awaitable<F>(py: Python<'_>, future: F) -> PyResult<Bound<'_, PyAny>>
where
    F: Future<Output = PyResult<Py<PyAny>>> + Send + 'static,
{
    // Made here, with the GIL held, before the bridge spawns on it.
    let _ = runtime(py);
    pyo3_async_runtimes::generic::future_into_py::<ProcessRuntime, _, _>(py, future)
}

/// The bridge's view of this process's runtime.
struct ProcessRuntime;

tokio::task_local! {
    static TASK_LOCALS: OnceCell<TaskLocals>;
}

/// A join error of the runtime's tasks, as the bridge wants it.
struct TaskError(tokio::task::JoinError);

impl JoinError for TaskError {
    fn is_panic(&self) -> bool {
        self.0.is_panic()
    }

    fn into_panic(self) -> Box<dyn std::any::Any + Send + 'static> {
        self.0.into_panic()
    }
}

impl GenericRuntime for ProcessRuntime {
    type JoinError = TaskError;
    type JoinHandle = Pin<Box<dyn Future<Output = Result<(), TaskError>> + Send>>;

    fn spawn<F>(fut: F) -> Self::JoinHandle
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let task = Python::attach(runtime).spawn(fut);
        Box::pin(async move { task.await.map_err(TaskError) })
    }

    fn spawn_blocking<F>(f: F) -> Self::JoinHandle
    where
        F: FnOnce() + Send + 'static,
    {
        let task = Python::attach(runtime).spawn_blocking(f);
        Box::pin(async move { task.await.map_err(TaskError) })
    }
}

impl ContextExt for ProcessRuntime {
    fn scope<F, R>(locals: TaskLocals, fut: F) -> Pin<Box<dyn Future<Output = R> + Send>>
    where
        F: Future<Output = R> + Send + 'static,
    {
        let cell = OnceCell::new();
        let _ = cell.set(locals);
        Box::pin(TASK_LOCALS.scope(cell, fut))
    }

    fn get_task_locals() -> Option<TaskLocals> {
        TASK_LOCALS
            .try_with(|cell| cell.get().cloned())
            .unwrap_or_default()
    }
}
