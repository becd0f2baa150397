//! The command line and the providers config as docs/configuration.md describes them. Its flag
//! tables are rendered here from clap's definition (`Cli::command()`, what `--help` prints), so
//! they cannot drift: a difference fails until `UPDATE_DOCS=1` rewrites them. Its providers-config
//! tables are held to the fields the parser accepts, and its example to the parser. And the
//! completion script the binary prints completes in a real bash.

use std::collections::BTreeSet;

use clap::CommandFactory;
use proxy_operator::faces::cli::command::Cli;

use super::repo;

const DOC: &str = "docs/configuration.md";
/// The generated parts of the doc, each between `<!-- generated: NAME … -->` and
/// `<!-- end generated: NAME -->`.
const SECTIONS: &[&str] = &["commands", "global", "run", "gateway"];

/// Text for one table cell: on one line, a `|` kept from ending the cell.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

fn code(text: &str) -> String {
    match cell(text) {
        empty if empty.is_empty() => "`\"\"`".into(),
        text => format!("`{text}`"),
    }
}

/// What an argument says about itself: its whole doc comment, and its values when clap knows them.
fn meaning(arg: &clap::Arg) -> String {
    let help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| code(v.get_name()))
        .collect();
    if values.is_empty() || !arg.get_action().takes_values() {
        return cell(&help);
    }
    cell(&format!("{help}; one of {}", values.join(", ")))
}

fn default_of(arg: &clap::Arg) -> Option<String> {
    let values: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    (!values.is_empty()).then(|| values.join(","))
}

fn name_of(arg: &clap::Arg) -> String {
    match arg.get_long() {
        Some(long) => format!("--{long}"),
        None => arg
            .get_value_names()
            .and_then(|names| names.first())
            .map(|n| n.to_string())
            .unwrap_or_else(|| arg.get_id().to_string().to_uppercase()),
    }
}

/// One row per flag: name, environment variable, default, meaning.
fn flag_table<'a>(args: impl Iterator<Item = &'a clap::Arg>) -> String {
    let mut out = String::from("| flag | environment | default | meaning |\n|---|---|---|---|\n");
    for arg in args.filter(|a| !a.is_hide_set()) {
        let env = arg.get_env().map(|e| code(&e.to_string_lossy()));
        let default = default_of(arg).map(|d| code(&d));
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            code(&name_of(arg)),
            env.as_deref().unwrap_or("—"),
            default.as_deref().unwrap_or("—"),
            meaning(arg)
        ));
    }
    out
}

/// A command's arguments on one line, for the table of commands.
fn arguments_of(command: &clap::Command) -> String {
    let mut parts: Vec<String> = command
        .get_arguments()
        .filter(|a| !a.is_global_set() && !a.is_hide_set())
        .map(|arg| {
            let mut part = code(&name_of(arg));
            if arg.get_long().is_none() && !arg.is_required_set() {
                part = format!("[{part}]");
            }
            let env = arg.get_env().map(|e| code(&e.to_string_lossy()));
            let default = default_of(arg).map(|d| format!("default {}", code(&d)));
            let notes: Vec<String> = env.into_iter().chain(default).collect();
            if notes.is_empty() {
                part
            } else {
                format!("{part} ({})", notes.join(", "))
            }
        })
        .collect();
    let functions: Vec<String> = command
        .get_subcommands()
        .map(|c| code(c.get_name()))
        .collect();
    if !functions.is_empty() {
        parts.push(format!("then one of {}", functions.join(", ")));
    }
    if parts.is_empty() {
        "—".into()
    } else {
        parts.join(", ")
    }
}

/// Every command a user runs, with its arguments and what it does; `run` and `gateway` point to
/// their own tables.
fn commands_table() -> String {
    let mut out = String::from("| command | arguments | what |\n|---|---|---|\n");
    for command in Cli::command().get_subcommands() {
        command_rows(
            &format!("proxy-operator {}", command.get_name()),
            command,
            &mut out,
        );
    }
    out
}

fn command_rows(path: &str, command: &clap::Command, out: &mut String) {
    // A group of commands without arguments of its own (`plugin`): its commands, in order.
    if command.has_subcommands() && command.get_arguments().next().is_none() {
        for sub in command.get_subcommands() {
            command_rows(&format!("{path} {}", sub.get_name()), sub, out);
        }
        return;
    }
    let arguments = match path {
        "proxy-operator run" | "proxy-operator gateway" => {
            format!("the flags [below](#{})", path.replace(' ', "-"))
        }
        _ => arguments_of(command),
    };
    let about = command
        .get_about()
        .map(|a| a.to_string())
        .unwrap_or_default();
    out.push_str(&format!(
        "| {} | {arguments} | {} |\n",
        code(path),
        cell(&about)
    ));
}

fn render(section: &str) -> String {
    let cli = Cli::command();
    match section {
        "commands" => commands_table(),
        "global" => flag_table(cli.get_arguments()),
        "run" | "gateway" => flag_table(
            cli.find_subcommand(section)
                .expect("a subcommand of that name")
                .get_arguments(),
        ),
        other => panic!("no section {other}"),
    }
}

/// `text` with the lines between the markers of `section` replaced by `body`.
fn replace_section(text: &str, section: &str, body: &str) -> String {
    let begin = format!("<!-- generated: {section} ");
    let end = format!("<!-- end generated: {section} -->");
    let start = text
        .find(&begin)
        .and_then(|at| text[at..].find('\n').map(|line| at + line + 1))
        .unwrap_or_else(|| panic!("{DOC}: no `{begin}…-->` line"));
    let stop = text[start..]
        .find(&end)
        .map(|at| start + at)
        .unwrap_or_else(|| panic!("{DOC}: no `{end}` after `{begin}…`"));
    format!("{}{body}{}", &text[..start], &text[stop..])
}

#[test]
fn the_configuration_doc_has_the_flags_as_clap_defines_them() {
    let path = repo().join(DOC);
    let text = std::fs::read_to_string(&path).expect("read docs/configuration.md");
    let mut expected = text.clone();
    for section in SECTIONS {
        expected = replace_section(&expected, section, &render(section));
    }
    if expected == text {
        return;
    }
    if std::env::var("UPDATE_DOCS").as_deref() == Ok("1") {
        std::fs::write(&path, &expected).expect("write docs/configuration.md");
        eprintln!("{DOC}: flag tables rewritten; review and commit it");
        return;
    }
    let first = text
        .lines()
        .zip(expected.lines())
        .find(|(a, b)| a != b)
        .map(|(a, b)| format!("the doc has\n  {a}\nthe code says\n  {b}"))
        .unwrap_or_else(|| "one of them has more lines".into());
    panic!(
        "{DOC}: the flag tables differ from the command line ({first}).\nRegenerate them with \
         `UPDATE_DOCS=1 cargo test -p proxy-operator --test deploy configuration_doc` and commit \
         the doc; a flag's text is its doc comment in host/src/faces/cli/."
    );
}

/// Each level of the providers config with an unknown field `zz` first, so the parser's refusal
/// lists every field that level takes (`deny_unknown_fields` throughout). Paths as the doc's
/// tables write them: within one `providers[]` entry.
const LEVELS: &[(&str, &str)] = &[
    ("", "{zz: 1}"),
    ("", "providers: [{zz: 1}]"),
    (
        "plugin.",
        "providers: [{name: a, type: t, plugin: {zz: 1}}]",
    ),
    (
        "limits.",
        "providers: [{name: a, type: t, limits: {zz: 1}}]",
    ),
    (
        "grants.",
        "providers: [{name: a, type: t, grants: {zz: 1}}]",
    ),
    (
        "grants.http.",
        "providers: [{name: a, type: t, grants: {http: {zz: 1}}}]",
    ),
    (
        "grants.http.credentials[].",
        "providers: [{name: a, type: t, grants: {http: {allow: [], credentials: [{zz: 1}]}}}]",
    ),
    (
        "grants.http.credentials[].valueFrom.",
        "providers: [{name: a, type: t, grants: {http: {allow: [], credentials: [{url: u, header: h, valueFrom: {zz: 1}}]}}}]",
    ),
    (
        "grants.kube.",
        "providers: [{name: a, type: t, grants: {kube: {zz: 1}}}]",
    ),
    (
        "grants.kube.scheduling.",
        "providers: [{name: a, type: t, grants: {kube: {namespace: n, kinds: [], scheduling: {zz: 1}}}}]",
    ),
    (
        "grants.kube.scheduling.tolerations[].",
        "providers: [{name: a, type: t, grants: {kube: {namespace: n, kinds: [], scheduling: {tolerations: [{zz: 1}]}}}}]",
    ),
    (
        "grants.kube.quota.",
        "providers: [{name: a, type: t, grants: {kube: {namespace: n, kinds: [], quota: {zz: 1}}}}]",
    ),
    (
        "grants.libvirt.",
        "providers: [{name: a, type: t, grants: {libvirt: {zz: 1}}}]",
    ),
    (
        "grants.libvirt.hosts[].",
        "providers: [{name: a, type: t, grants: {libvirt: {hosts: [{zz: 1}]}}}]",
    ),
    (
        "upstream.",
        "providers: [{name: a, type: t, upstream: {zz: 1}}]",
    ),
    (
        "upstream.credentials.",
        "providers: [{name: a, type: t, upstream: {credentials: {zz: 1}}}]",
    ),
    (
        "upstream.credentials.passwordFrom.",
        "providers: [{name: a, type: t, upstream: {credentials: {username: u, passwordFrom: {zz: 1}}}}]",
    ),
    (
        "access.",
        "providers: [{name: a, type: t, access: {zz: 1}}]",
    ),
    (
        "access.namespaceSelector.",
        "providers: [{name: a, type: t, access: {namespaceSelector: {zz: 1}}}]",
    ),
    (
        "access.allow.",
        "providers: [{name: a, type: t, access: {allow: {zz: 1}}}]",
    ),
    (
        "grants.libvirt.hosts[].limits.",
        "providers: [{name: a, type: t, grants: {libvirt: {hosts: [{name: h, address: a, user: u, limits: {zz: 1}}]}}}]",
    ),
];

/// The fields the providers config parser accepts, as paths (`grants.http.allow`).
pub(crate) fn accepted_fields() -> BTreeSet<String> {
    let mut fields = BTreeSet::new();
    for (prefix, probe) in LEVELS {
        let refusal = proxy_operator::provider::config::ProvidersConfig::parse(probe)
            .expect_err("an unknown field is refused");
        let (_, expected) = refusal
            .split_once("expected ")
            .unwrap_or_else(|| panic!("{probe}: no field list in `{refusal}`"));
        let names: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        assert!(!names.is_empty(), "{probe}: no field list in `{refusal}`");
        fields.extend(names.iter().map(|name| format!("{prefix}{name}")));
    }
    fields
}

#[test]
fn the_configuration_doc_has_a_row_for_each_providers_config_field() {
    let text = std::fs::read_to_string(repo().join(DOC)).expect("read docs/configuration.md");
    let section = text
        .split_once("\n## The providers config")
        .and_then(|(_, rest)| rest.split("\n## ").next())
        .expect("docs/configuration.md: a `## The providers config` section");
    // The first cell of each table row, when it is one code span: `| `grants.http.allow` | …`.
    let documented: BTreeSet<String> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once("` |").map(|(field, _)| field.to_string()))
        .collect();
    // The example parses as the operator would read it.
    let example = section
        .split_once("```yaml\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("docs/configuration.md: a ```yaml example in `## The providers config`")
        .0;
    if let Err(e) = proxy_operator::provider::config::ProvidersConfig::parse(example) {
        panic!("{DOC}: the providers config example is refused: {e}");
    }
    let accepted = accepted_fields();
    let missing: Vec<&String> = accepted.difference(&documented).collect();
    let unknown: Vec<&String> = documented.difference(&accepted).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "{DOC}, `## The providers config`: a row `| `FIELD` | …` for each field the parser \
         takes (host/src/provider/config.rs, host/src/provider/capabilities/grants/).\n  without a row: \
         {missing:?}\n  rows of no field: {unknown:?}"
    );
}

/// What `proxy-operator completions bash` prints, sourced in bash: the subcommands complete, and
/// so do a subcommand's own flags (which clap_complete's script alone misses for a hyphenated
/// binary name, see `cli::command::completions`).
#[test]
fn the_bash_completion_script_completes_subcommands_and_their_flags() {
    let script = std::process::Command::new(env!("CARGO_BIN_EXE_proxy-operator"))
        .args(["completions", "bash"])
        .output()
        .expect("running proxy-operator completions bash");
    assert!(script.status.success(), "{script:?}");
    let script = String::from_utf8(script.stdout).expect("UTF-8");
    let complete = |words: &[&str]| -> String {
        let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
        let driver = format!(
            "COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
             _proxy__operator proxy-operator \"${{COMP_WORDS[COMP_CWORD]}}\" \
             \"${{COMP_WORDS[COMP_CWORD-1]}}\"; echo \"${{COMPREPLY[*]}}\"",
            words = quoted.join(" ")
        );
        let out = std::process::Command::new("bash")
            .args(["-c", &format!("{script}\n{driver}")])
            .output()
            .expect("running bash");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let subcommands = complete(&["proxy-operator", ""]);
    for name in ["run", "gateway", "crds", "plugin", "completions"] {
        assert!(
            subcommands.split(' ').any(|w| w == name),
            "`proxy-operator <TAB>` offers {subcommands:?}, not {name}"
        );
    }
    assert_eq!(
        complete(&["proxy-operator", "gateway", "--discovery-u"]),
        "--discovery-url"
    );
    assert_eq!(
        complete(&["proxy-operator", "plugin", "dev-api", "--lis"]),
        "--listen"
    );
    assert!(complete(&["proxy-operator", "completions", ""]).contains("bash elvish fish"));
}
