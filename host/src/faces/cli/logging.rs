//! The operator's log filter (`--log-level` / `LOG_LEVEL`), checked rather than guessed at, and
//! whether its log is coloured.

use std::ffi::OsStr;

use tracing_subscriber::EnvFilter;

/// Whether the log gets ANSI colour: only on a terminal (log files and container logs get plain
/// text), and never when `NO_COLOR` is set and not empty (https://no-color.org). clap's own help
/// and errors already follow both rules.
pub fn colour(is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    is_terminal && no_color.is_none_or(OsStr::is_empty)
}

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
    use super::{colour, filter};
    use std::ffi::OsStr;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        let table: [(bool, Option<&str>, bool); 8] = [
            (true, None, true),
            // Set but empty counts as unset, as no-color.org says.
            (true, Some(""), true),
            (true, Some("1"), false),
            (true, Some("0"), false),
            (false, None, false),
            (false, Some(""), false),
            (false, Some("1"), false),
            (false, Some("yes"), false),
        ];
        for (terminal, no_color, expected) in table {
            assert_eq!(
                colour(terminal, no_color.map(OsStr::new)),
                expected,
                "terminal {terminal}, NO_COLOR {no_color:?}"
            );
        }
    }

    #[test]
    fn log_filters_are_checked() {
        for good in [
            "info",
            "warn,proxy_operator=debug",
            "proxy_operator::lifecycle::gc=trace",
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
