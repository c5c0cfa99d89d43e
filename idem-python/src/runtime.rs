//! The tokio runtime the extension runs on: one per process, made on first
//! use, so a server that imports the app and then forks its workers gets a
//! working runtime in each worker.
//!
//! A fork copies memory but only the forking thread. A lock that one of
//! the extension's threads (tokio's workers, SQLite's writer) held at that
//! instant stays held in the child forever: SQLite's allocator mutex, a
//! half-run `Once`. And SQLite keeps per-process state about each open
//! file (its locks, its WAL index) that a child must not inherit. So,
//! before every `os.fork()`, when no call is in flight, the extension stops
//! its threads and closes its stores; both processes open them again on
//! first use. A fork while calls are in flight cannot stop them: the child
//! then refuses every call with a `StoreError` instead of risking a hang or
//! a second run (`forked_while_busy`).

use std::cell::OnceCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3_async_runtimes::generic::{ContextExt, JoinError, Runtime as GenericRuntime};
use pyo3_async_runtimes::TaskLocals;
use tokio::runtime::{Handle, Runtime};

use crate::store;

// The runtime, a handle to it, and the process it was made in. A forked
// child inherits them but none of the runtime's threads: a different
// process id means it is dead here. The handle is what callers get: a
// `&'static Handle` for as long as they use it, while the runtime itself
// stays owned here, so that a fork can shut it down.
struct Current {
    pid: u32,
    handle: &'static Handle,
    runtime: Runtime,
}

static CURRENT: Mutex<Option<Current>> = Mutex::new(None);

fn current() -> MutexGuard<'static, Option<Current>> {
    CURRENT.lock().unwrap_or_else(|e| e.into_inner())
}

/// Calls in flight and whether a fork is being prepared.
struct Gate {
    /// Store operations running and calls holding a lease.
    active: usize,
    /// Set by the fork hook while it stops the threads: new calls wait.
    forking: bool,
    /// In a child forked while calls were in flight: how many.
    busy_at_fork: Option<usize>,
}

static GATE: Mutex<Gate> = Mutex::new(Gate {
    active: 0,
    forking: false,
    busy_at_fork: None,
});
static GATE_OPENED: Condvar = Condvar::new();
static HOOKS: AtomicBool = AtomicBool::new(false);

fn gate() -> MutexGuard<'static, Gate> {
    GATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A call in flight: while one lives, a fork does not stop the threads.
pub(crate) struct Active(());

impl Active {
    /// Counts a call, first waiting (GIL released) for a fork being
    /// prepared to finish.
    pub(crate) fn enter(py: Python<'_>) -> Active {
        {
            let mut gate = gate();
            if !gate.forking {
                gate.active += 1;
                return Active(());
            }
        }
        py.detach(|| {
            let mut gate = gate();
            while gate.forking {
                gate = GATE_OPENED.wait(gate).unwrap_or_else(|e| e.into_inner());
            }
            gate.active += 1;
        });
        Active(())
    }

    /// Another count for work that outlives this call (a lease held while
    /// the function runs). Only inside a counted call, so no fork is being
    /// prepared.
    pub(crate) fn also(&self) -> Active {
        gate().active += 1;
        Active(())
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        gate().active -= 1;
    }
}

/// In a child forked while `n` calls were in flight, `Some(n)`: the
/// extension refuses to run there.
pub(crate) fn forked_while_busy() -> Option<usize> {
    gate().busy_at_fork
}

/// Waits (GIL released) while a fork is being prepared.
fn wait_for_fork(py: Python<'_>) {
    if gate().forking {
        py.detach(|| {
            let mut gate = gate();
            while gate.forking {
                gate = GATE_OPENED.wait(gate).unwrap_or_else(|e| e.into_inner());
            }
        });
    }
}

/// This process's runtime, made on first use. Call it holding the GIL.
pub(crate) fn runtime(py: Python<'_>) -> &'static Handle {
    wait_for_fork(py);
    let pid = std::process::id();
    let made = {
        let mut current = current();
        if let Some(current) = &*current {
            if current.pid == pid {
                return current.handle;
            }
        }
        // The parent's runtime, if any, is forgotten, never dropped:
        // dropping it would join worker threads that do not exist in this
        // process.
        if let Some(inherited) = current.take() {
            std::mem::forget(inherited.runtime);
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("idempotence")
            .build()
            .expect("cannot start a tokio runtime (out of threads or file descriptors)");
        let handle: &'static Handle = Box::leak(Box::new(runtime.handle().clone()));
        *current = Some(Current {
            pid,
            handle,
            runtime,
        });
        handle
    };
    // Outside the lock: registering runs Python code.
    if !HOOKS.swap(true, Ordering::SeqCst) {
        if let Err(error) = register_fork_hooks(py) {
            error.write_unraisable(py, None);
        }
    }
    made
}

fn register_fork_hooks(py: Python<'_>) -> PyResult<()> {
    let hooks = PyDict::new(py);
    hooks.set_item("before", wrap_pyfunction!(before_fork, py)?)?;
    hooks.set_item(
        "after_in_parent",
        wrap_pyfunction!(after_fork_in_parent, py)?,
    )?;
    hooks.set_item("after_in_child", wrap_pyfunction!(after_fork_in_child, py)?)?;
    py.import("os")?
        .call_method("register_at_fork", (), Some(&hooks))?;
    Ok(())
}

/// `os.register_at_fork(before=…)`: with no call in flight, stops the
/// runtime's threads and closes the stores, so the fork copies no lock a
/// thread holds and no open SQLite file; otherwise leaves them running and
/// the child refuses calls.
#[pyfunction]
fn before_fork(py: Python<'_>) {
    let active = {
        let mut gate = gate();
        gate.forking = true;
        gate.active
    };
    if active > 0 {
        gate().busy_at_fork = Some(active);
        return;
    }
    gate().busy_at_fork = None;
    py.detach(quiesce);
}

/// Closes this process's stores and shuts its runtime down, waiting (a
/// bounded time) for their threads to end.
fn quiesce() {
    let pid = std::process::id();
    let runtime = {
        let mut current = current();
        match current.take() {
            Some(mine) if mine.pid == pid => mine.runtime,
            Some(inherited) => {
                // Already dead here: forgotten, as `runtime` does.
                std::mem::forget(inherited.runtime);
                return;
            }
            None => return,
        }
    };
    // Dropped inside the runtime, as a pool's connections expect.
    let writers: Vec<_> = {
        let _entered = runtime.enter();
        let stores = store::close_all();
        stores.iter().filter_map(|store| store.wakeups()).collect()
    };
    // No call is in flight (the gate counts them) and new ones wait at the
    // gate, so nothing uses the runtime now.
    runtime.shutdown_timeout(Duration::from_secs(5));
    // A SQLite store's writer thread closes its connection and then drops
    // its share of the waiters' registry: the registry shared only with us
    // means the thread is done with SQLite.
    let deadline = Instant::now() + Duration::from_secs(5);
    for writer in writers {
        while std::sync::Arc::strong_count(&writer) > 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[pyfunction]
fn after_fork_in_parent() {
    let mut gate = gate();
    gate.forking = false;
    gate.busy_at_fork = None;
    GATE_OPENED.notify_all();
}

#[pyfunction]
fn after_fork_in_child() {
    // The parent's calls in flight are not this process's: their threads
    // were not copied.
    let mut gate = gate();
    gate.forking = false;
    gate.active = 0;
}

/// Runs `future` on this process's runtime with the GIL released, for a
/// synchronous call.
pub(crate) fn block_on<F>(py: Python<'_>, future: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    let active = Active::enter(py);
    let runtime = runtime(py);
    py.detach(|| {
        let output = runtime.block_on(future);
        drop(active);
        output
    })
}

/// Makes `future` an asyncio awaitable, run on this process's runtime.
pub(crate) fn awaitable<F>(py: Python<'_>, future: F) -> PyResult<Bound<'_, PyAny>>
where
    F: Future<Output = PyResult<Py<PyAny>>> + Send + 'static,
{
    let active = Active::enter(py);
    // Made here, with the GIL held, before the bridge spawns on it.
    let _ = runtime(py);
    pyo3_async_runtimes::generic::future_into_py::<ProcessRuntime, _, _>(py, async move {
        let output = future.await;
        drop(active);
        output
    })
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
