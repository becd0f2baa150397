//! The `log` capability: a plugin's log lines go into the operator's log, tagged with the plugin
//! and provider instance, bounded in size and rate so a chatty plugin cannot flood it.

use std::sync::Mutex;
use std::time::Instant;

const MAX_MESSAGE_CHARS: usize = 4096;
const MAX_FIELDS: usize = 32;
/// Lines one provider instance (all its calls together) may log per second, on average.
pub const LOG_LINES_PER_SECOND: f64 = 50.0;
/// Lines it may log at once before the rate applies.
pub const LOG_BURST: f64 = 200.0;

/// Where a provider instance's plugin log lines go: its names, and its rate budget.
#[derive(Debug)]
pub struct PluginLog {
    pub plugin: String,
    pub provider: String,
    budget: LogBudget,
    /// Whether the plugin declared `log`; if not, its lines are dropped (said once).
    declared: bool,
    undeclared_said: std::sync::atomic::AtomicBool,
}

impl PluginLog {
    pub fn new(plugin: &str, provider: &str, declared: bool) -> Self {
        PluginLog {
            plugin: plugin.to_string(),
            provider: provider.to_string(),
            budget: LogBudget::default(),
            declared,
            undeclared_said: Default::default(),
        }
    }
}

/// A token bucket per provider instance, shared by all its calls. Written here rather than taken
/// from a rate-limiting crate: it is one counter and a timestamp under a lock.
#[derive(Debug)]
pub struct LogBudget(Mutex<Bucket>);

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    refilled: Instant,
    dropped: u64,
}

/// Whether a line may be written; `Some(n)`: yes, after `n` lines were dropped. `first`: the
/// first line dropped since the last one written.
enum Admit {
    Write(Option<u64>),
    Drop { first: bool },
}

impl Default for LogBudget {
    fn default() -> Self {
        LogBudget(Mutex::new(Bucket {
            tokens: LOG_BURST,
            refilled: Instant::now(),
            dropped: 0,
        }))
    }
}

impl LogBudget {
    fn admit(&self) -> Admit {
        let mut bucket = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let earned = now.duration_since(bucket.refilled).as_secs_f64() * LOG_LINES_PER_SECOND;
        bucket.tokens = (bucket.tokens + earned).min(LOG_BURST);
        bucket.refilled = now;
        if bucket.tokens < 1.0 {
            bucket.dropped += 1;
            return Admit::Drop {
                first: bucket.dropped == 1,
            };
        }
        bucket.tokens -= 1.0;
        let dropped = std::mem::take(&mut bucket.dropped);
        Admit::Write((dropped > 0).then_some(dropped))
    }
}

/// Log levels a plugin can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

fn truncate(text: &str) -> &str {
    match text.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

/// Writes one plugin log line.
pub fn log(log: &PluginLog, level: Level, message: &str, fields: &[(String, String)]) {
    let (plugin, provider) = (log.plugin.as_str(), log.provider.as_str());
    if !log.declared {
        if !log
            .undeclared_said
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            let refusal = super::declared::undeclared("log");
            tracing::warn!(target: "plugin", plugin, provider, "{refusal}");
        }
        return;
    }
    match log.budget.admit() {
        Admit::Drop { first: true } => {
            tracing::warn!(
                target: "plugin",
                plugin,
                provider,
                "plugin log lines dropped from here on: more than {LOG_BURST} at once or {LOG_LINES_PER_SECOND} a second"
            );
            return;
        }
        Admit::Drop { first: false } => return,
        Admit::Write(Some(dropped)) => tracing::warn!(
            target: "plugin",
            plugin,
            provider,
            dropped,
            "plugin log lines dropped: {dropped} since the last one written"
        ),
        Admit::Write(None) => {}
    }
    let message = truncate(message);
    let fields: Vec<String> = fields
        .iter()
        .take(MAX_FIELDS)
        .map(|(k, v)| format!("{}={}", truncate(k), truncate(v)))
        .collect();
    let fields = fields.join(" ");
    // tracing needs the level at compile time, hence one arm per level.
    match level {
        Level::Trace => tracing::trace!(target: "plugin", plugin, provider, fields, "{message}"),
        Level::Debug => tracing::debug!(target: "plugin", plugin, provider, fields, "{message}"),
        Level::Info => tracing::info!(target: "plugin", plugin, provider, fields, "{message}"),
        Level::Warn => tracing::warn!(target: "plugin", plugin, provider, fields, "{message}"),
        Level::Error => tracing::error!(target: "plugin", plugin, provider, fields, "{message}"),
    }
}
