//! The operator's log filter (`--log-level` / `LOG_LEVEL`), checked rather than guessed at.

use tracing_subscriber::EnvFilter;

/// Words other loggers use as levels. `EnvFilter` would take each for a target name and show
/// nothing at all, so they are refused with the levels that exist.
const NOT_LEVELS: &[&str] = &[
    "warning", "fatal", "critical", "verbose", "notice", "all", "none",
];

/// The filter `spec` describes (tracing's `EnvFilter` syntax, e.g. `info` or
/// `info,proxy_operator=debug`), or what is wrong with it, naming the flag and the variable.
pub fn filter(spec: &str) -> Result<EnvFilter, String> {
    let refuse = |why: String| {
        format!(
            "--log-level / LOG_LEVEL `{spec}`: {why}; use a level (trace, debug, info, warn, error, \
             off) or comma-separated `target=level` directives, e.g. `info,proxy_operator=debug`"
        )
    };
    if let Some(word) = spec
        .split(',')
        .map(str::trim)
        .find(|d| NOT_LEVELS.contains(&d.to_ascii_lowercase().as_str()))
    {
        return Err(refuse(format!("`{word}` is not a level")));
    }
    EnvFilter::try_new(spec).map_err(|e| refuse(format!("not a log filter: {e}")))
}

#[cfg(test)]
mod tests {
    use super::filter;

    #[test]
    fn log_filters_are_checked() {
        for good in [
            "info",
            "warn,proxy_operator=debug",
            "proxy_operator::gc=trace",
            "off",
        ] {
            assert!(filter(good).is_ok(), "{good}");
        }
        for bad in ["info,proxy_operator=loud", "warning", "debug,[{"] {
            let err = filter(bad).unwrap_err();
            assert!(err.contains("LOG_LEVEL") && err.contains(bad), "{err}");
        }
    }
}
