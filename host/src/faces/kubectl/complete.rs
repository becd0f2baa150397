//! Completion of `kubectl px …` inside kubectl's own (bash, zsh, fish, powershell): kubectl 1.26+
//! runs `kubectl_complete-px ARGS… WORD` from PATH and reads one candidate per line and a last
//! line `:<directive>` (cobra's protocol). `kubectl-px` answers when called by that name (a
//! link to it) or as `kubectl-px __complete`. What to offer is decided here from clap's own
//! definition (pure); names of Proxies and pools come from the cluster (`run.rs`).

use clap::Command;

/// What the word being completed should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Want {
    Words(Vec<String>),
    Proxies,
    Pools,
    /// `status`'s object: pools and Proxies.
    Objects,
    Namespaces,
    Nothing,
}

/// cobra's `ShellCompDirectiveNoFileComp`: the candidates only, no file names.
pub const NO_FILES: &str = ":4";

/// The name kubectl looks for.
pub const COMPLETER: &str = "kubectl_complete-px";

/// What to offer for the last of `args` (the words after `px`; the last is the one being
/// typed, maybe empty), and the namespace the words name with `-n` / `--namespace`.
pub fn want(command: &Command, args: &[String]) -> (Want, Option<String>) {
    let mut command = command.clone();
    command.build();
    let (word, done) = match args.split_last() {
        Some((word, done)) => (word.as_str(), done),
        None => ("", &[][..]),
    };
    let mut current = &command;
    let mut positional = 0;
    let mut value_of: Option<String> = None;
    let mut namespace = None;
    for arg in done {
        if let Some(id) = value_of.take() {
            if id == "namespace" {
                namespace = Some(arg.clone());
            }
            continue;
        }
        if let Some(flag) = arg.strip_prefix('-').filter(|f| !f.is_empty()) {
            let (name, inline) = match flag.strip_prefix('-') {
                Some(long) => match long.split_once('=') {
                    Some((name, value)) => (name.to_string(), Some(value.to_string())),
                    None => (long.to_string(), None),
                },
                None => (
                    flag.chars().take(1).collect(),
                    (flag.len() > 1).then(|| flag[1..].to_string()),
                ),
            };
            let found = current.get_arguments().find(|a| {
                a.get_long() == Some(name.as_str())
                    || a.get_short().is_some_and(|s| s.to_string() == name)
            });
            if let Some(found) = found.filter(|a| a.get_action().takes_values()) {
                match inline {
                    Some(value) if found.get_id() == "namespace" => namespace = Some(value),
                    Some(_) => {}
                    None => value_of = Some(found.get_id().to_string()),
                }
            }
            continue;
        }
        if let Some(sub) = current.find_subcommand(arg) {
            current = sub;
            positional = 0;
            continue;
        }
        positional += 1;
    }
    if let Some(id) = value_of {
        let arg = current.get_arguments().find(|a| a.get_id() == id.as_str());
        return (arg.map_or(Want::Nothing, by_arg), namespace);
    }
    if word.starts_with('-') {
        let flags = current
            .get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .collect();
        return (Want::Words(flags), namespace);
    }
    if current.has_subcommands() {
        let names = current
            .get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help")
            .map(|s| s.get_name().to_string())
            .collect();
        return (Want::Words(names), namespace);
    }
    let want = current
        .get_positionals()
        .nth(positional)
        .map_or(Want::Nothing, by_arg);
    (want, namespace)
}

/// What a value of `arg` may be: its possible values, or the objects its name says.
fn by_arg(arg: &clap::Arg) -> Want {
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| v.get_name().to_string())
        .collect();
    if !values.is_empty() {
        return Want::Words(values);
    }
    match arg.get_id().as_str() {
        "proxy" => Want::Proxies,
        "pool" => Want::Pools,
        "object" => Want::Objects,
        "namespace" | "operator_namespace" => Want::Namespaces,
        _ => Want::Nothing,
    }
}

/// The lines kubectl reads: the candidates starting with `word`, then the directive.
pub fn answer(candidates: &[String], word: &str) -> String {
    let mut out: String = candidates
        .iter()
        .filter(|c| c.starts_with(word))
        .map(|c| format!("{c}\n"))
        .collect();
    out.push_str(NO_FILES);
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;
    use crate::faces::kubectl::args::Cli;

    fn want_for(words: &[&str]) -> (Want, Option<String>) {
        let args: Vec<String> = words.iter().map(|w| w.to_string()).collect();
        want(&Cli::command(), &args)
    }

    fn words(want: Want) -> Vec<String> {
        match want {
            Want::Words(words) => words,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn each_position_offers_what_fits_there() {
        let commands = words(want_for(&[""]).0);
        for name in [
            "status", "why", "lease", "release", "report", "drain", "recycle", "scale",
        ] {
            assert!(commands.iter().any(|c| c == name), "{commands:?}");
        }
        assert!(
            !commands.iter().any(|c| c == "help" || c.starts_with("__")),
            "{commands:?}"
        );
        assert_eq!(want_for(&["why", "eg"]), (Want::Proxies, None));
        assert_eq!(
            want_for(&["-n", "crawl", "drain", ""]),
            (Want::Proxies, Some("crawl".into()))
        );
        assert_eq!(
            want_for(&["status", "--namespace=c2", ""]),
            (Want::Objects, Some("c2".into()))
        );
        assert_eq!(want_for(&["scale", ""]).0, Want::Pools);
        assert_eq!(want_for(&["scale", "egress", ""]).0, Want::Nothing);
        assert_eq!(
            words(want_for(&["report", "0123", ""]).0),
            ["success", "failure", "blocked"]
        );
        assert_eq!(
            words(want_for(&["status", "-o", ""]).0),
            ["table", "json", "yaml"]
        );
        assert_eq!(want_for(&["lease", "--pool", ""]).0, Want::Pools);
        assert_eq!(want_for(&["-n", ""]).0, Want::Namespaces);
        let flags = words(want_for(&["lease", "--"]).0);
        for flag in [
            "--pool",
            "--session",
            "--target",
            "--ttl",
            "--discovery-url",
            "--namespace",
        ] {
            assert!(flags.iter().any(|f| f == flag), "{flags:?}");
        }
        assert!(words(want_for(&["completions", ""]).0).contains(&"fish".to_string()));
    }

    #[test]
    fn the_answer_is_cobras() {
        let candidates = vec!["egress-a".to_string(), "egress-b".into(), "lone".into()];
        assert_eq!(answer(&candidates, "eg"), "egress-a\negress-b\n:4\n");
        assert_eq!(answer(&[], ""), ":4\n");
    }
}
