//! A fixture started once per test binary ([`crate::ControlPlane::shared`],
//! [`crate::node::Cluster::shared`]): on its own thread and tokio runtime, so nothing of it
//! depends on the runtime of the test that came first (every `#[tokio::test]` has its own).

use std::future::Future;
use std::sync::OnceLock;

/// The process-wide instance of a fixture, or why it failed to start.
pub struct Shared<T: 'static> {
    cell: OnceLock<Result<T, String>>,
    /// Names the start thread and the panic of every use after a failed start.
    what: &'static str,
}

impl<T: Send + Sync + 'static> Shared<T> {
    pub const fn new(what: &'static str) -> Self {
        Shared {
            cell: OnceLock::new(),
            what,
        }
    }

    /// The instance, started with `start` on first use (from async code: the start blocks a
    /// blocking-pool thread, not the caller's runtime).
    ///
    /// # Panics
    /// If the fixture cannot start: every later call panics with the same message.
    pub async fn get<F, Fut>(&'static self, start: F) -> &'static T
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = anyhow::Result<T>>,
    {
        if let Some(started) = self.cell.get() {
            return self.unwrap(started);
        }
        match tokio::task::spawn_blocking(move || self.get_blocking(start)).await {
            Ok(instance) => instance,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }

    /// [`Shared::get`] for synchronous code (blocks the thread).
    pub fn get_blocking<F, Fut>(&'static self, start: F) -> &'static T
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = anyhow::Result<T>>,
    {
        self.unwrap(self.cell.get_or_init(|| {
            std::thread::Builder::new()
                .name(format!("harness-{}", self.what.replace(' ', "-")))
                .spawn(|| {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| format!("tokio runtime: {e}"))?
                        .block_on(start())
                        .map_err(|e| format!("{e:#}"))
                })
                .expect("spawn the shared fixture's thread")
                .join()
                .unwrap_or_else(|panic| {
                    Err(panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "panicked".into()))
                })
        }))
    }

    fn unwrap(&self, started: &'static Result<T, String>) -> &'static T {
        match started {
            Ok(instance) => instance,
            Err(e) => panic!("the shared {} failed to start: {e}", self.what),
        }
    }
}
