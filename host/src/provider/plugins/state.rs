//! The per-call store data: WASI with nothing granted, the memory limiter (`memory.rs`), the CPU budget, the
//! captured stderr (for panic messages) and the provider instance's capabilities.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::memory::MemoryLimiter;
use crate::provider::capabilities::CallContext;

/// How much of a plugin's stderr is kept to explain a trap (its panic message is at the end).
const STDERR_TAIL_BYTES: usize = 4096;

/// The data of one call's `Store`.
pub struct HostState {
    wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) limiter: MemoryLimiter,
    pub(crate) context: Arc<CallContext>,
    /// Epoch ticks of CPU the call may still use.
    pub(crate) cpu_ticks_left: u64,
    pub(crate) cpu_exhausted: bool,
    pub(crate) stderr: TailPipe,
}

impl HostState {
    pub(crate) fn new(context: Arc<CallContext>, limiter: MemoryLimiter, cpu_ticks: u64) -> Self {
        let stderr = TailPipe::default();
        // No preopens, no environment, no arguments, and the default socket policy: WASI grants
        // nothing. Plugins reach the world only through the proxy-operator capabilities.
        let wasi = WasiCtx::builder().stderr(stderr.clone()).build();
        HostState {
            wasi,
            table: ResourceTable::new(),
            limiter,
            context,
            cpu_ticks_left: cpu_ticks,
            cpu_exhausted: false,
            stderr,
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// A stderr that keeps only its last few KiB and never fails a write, so a chatty plugin is not
/// broken by its own logging while the panic message at the end is still there.
#[derive(Clone, Default)]
pub struct TailPipe {
    buffer: Arc<Mutex<Vec<u8>>>,
}

impl TailPipe {
    fn push(&self, bytes: &[u8]) {
        let mut buffer = self.buffer.lock().unwrap_or_else(|p| p.into_inner());
        buffer.extend_from_slice(bytes);
        if buffer.len() > STDERR_TAIL_BYTES {
            let excess = buffer.len() - STDERR_TAIL_BYTES;
            buffer.drain(..excess);
        }
    }

    /// The last lines written, trimmed.
    pub fn tail(&self) -> String {
        let buffer = self.buffer.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&buffer).trim().to_string()
    }
}

impl IsTerminal for TailPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for TailPipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl OutputStream for TailPipe {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        self.push(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }
    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(STDERR_TAIL_BYTES)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for TailPipe {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for TailPipe {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
