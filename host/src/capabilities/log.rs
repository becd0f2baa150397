//! The `log` capability: a plugin's log lines go into the operator's log, tagged with the plugin
//! and provider instance, bounded in size so a chatty plugin cannot flood it.

use super::CallContext;

const MAX_MESSAGE_CHARS: usize = 4096;
const MAX_FIELDS: usize = 32;

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
pub fn log(context: &CallContext, level: Level, message: &str, fields: &[(String, String)]) {
    let message = truncate(message);
    let fields: Vec<String> = fields
        .iter()
        .take(MAX_FIELDS)
        .map(|(k, v)| format!("{}={}", truncate(k), truncate(v)))
        .collect();
    let fields = fields.join(" ");
    let (plugin, provider) = (context.plugin.as_str(), context.provider.as_str());
    // tracing needs the level at compile time, hence one arm per level.
    match level {
        Level::Trace => tracing::trace!(target: "plugin", plugin, provider, fields, "{message}"),
        Level::Debug => tracing::debug!(target: "plugin", plugin, provider, fields, "{message}"),
        Level::Info => tracing::info!(target: "plugin", plugin, provider, fields, "{message}"),
        Level::Warn => tracing::warn!(target: "plugin", plugin, provider, fields, "{message}"),
        Level::Error => tracing::error!(target: "plugin", plugin, provider, fields, "{message}"),
    }
}
