//! The command line of the `proxy-operator` binary, as clap reads it. In the library rather than
//! in main.rs so tests can render it (docs/configuration.md's flag tables, the completion scripts).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use super::plugin::RunFunction;

#[derive(Debug, Parser)]
#[command(
    name = "proxy-operator",
    version = crate::support::version::VERSION,
    about = "Healthy egress proxies for crawler fleets"
)]
pub struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `proxy_operator=debug`.
    #[arg(long, env = "LOG_LEVEL", default_value = "info", global = true)]
    pub log_level: String,
    /// Log format.
    #[arg(
        long,
        env = "LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the operator: reconcile Proxies through the configured providers.
    Run(Box<super::run::RunArgs>),
    /// Run the gateway: one proxy endpoint (HTTP, CONNECT, SOCKS5) that carries each request
    /// through a proxy of the fleet the leader picks (docs/gateway.md).
    Gateway(Box<super::gateway::GatewayArgs>),
    /// Print the CRD manifests generated from the Rust types, or write them into a directory.
    Crds {
        /// Write one file per CRD here (e.g. `deploy/crds`) instead of printing.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Tools for plugin authors: inspect, validate and call a provider component.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
    /// Print the shell completion script of this command line, e.g.
    /// `proxy-operator completions bash > ~/.local/share/bash-completion/completions/proxy-operator`.
    Completions {
        /// The shell the script is for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// The completion script of `shell` for the whole command line, from the same definition clap
/// parses with, so it cannot miss a flag.
pub fn completions(shell: clap_complete::Shell) -> Vec<u8> {
    use clap::CommandFactory;
    completion_script(shell, &mut Cli::command(), BIN)
}

/// The completion script of `shell` for `command`, a binary called `bin` (also `kubectl-px`'s).
pub fn completion_script(
    shell: clap_complete::Shell,
    command: &mut clap::Command,
    bin: &str,
) -> Vec<u8> {
    let mut script = Vec::new();
    clap_complete::generate(shell, command, bin, &mut script);
    if shell != clap_complete::Shell::Bash {
        return script;
    }
    // clap_complete's bash script spells a hyphenated binary's name one way in the loop that
    // finds the subcommand (`proxy__operator__subcmd__run`) and another in the branches that
    // complete it (`proxy__subcmd__operator__subcmd__run`), so nothing past the subcommand
    // completes (clap-rs/clap#6421, open in 4.6.12). Spelled as the loop does; a no-op once fixed.
    let script = String::from_utf8(script).expect("clap_complete writes UTF-8");
    let loop_spelling = bin.replace('-', "__");
    script
        .replace(&bin.replace('-', "__subcmd__"), &loop_spelling)
        .into_bytes()
}

/// The binary's name, as the shells complete it.
const BIN: &str = "proxy-operator";

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Show a component's WIT version, exports, imports, capabilities, size and sha256; with
    /// `--config`, also which capabilities it declares against those the entry grants.
    Inspect {
        file: PathBuf,
        /// A providers-config entry (YAML or JSON) whose `grants` to compare with the declared
        /// capabilities.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Check configs as the operator does (the plugin's JSON Schema, the grants, then
    /// `validate-config`): one entry against a component, or a whole providers config.
    Validate {
        /// The component (with `--config`).
        #[arg(required_unless_present = "providers_config", requires = "config")]
        file: Option<PathBuf>,
        /// A providers-config entry (YAML or JSON): `config` and `grants`.
        #[arg(long, conflicts_with = "providers_config")]
        config: Option<PathBuf>,
        /// A whole providers config: every entry, its plugin from `--plugins-dir` (or its URL).
        #[arg(long)]
        providers_config: Option<PathBuf>,
        /// Where the built-in plugins are, as the operator's `--plugins-dir`.
        #[arg(long, env = "PLUGINS_DIR", default_value = "/plugins")]
        plugins_dir: PathBuf,
    },
    /// Call one provider function against real capabilities.
    Run {
        file: PathBuf,
        /// A providers-config entry (YAML or JSON): `config` and `grants`.
        #[arg(long)]
        config: PathBuf,
        /// For `grants.libvirt`: the SSH private key (OpenSSH, unencrypted) to reach hypervisors.
        #[arg(long, requires = "known_hosts")]
        ssh_key: Option<PathBuf>,
        /// For `grants.libvirt`: the known_hosts file the hypervisors' host keys are checked against.
        #[arg(long, requires = "ssh_key")]
        known_hosts: Option<PathBuf>,
        /// For `grants.kube`: the cluster (default `KUBECONFIG`, then `~/.kube/config`).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        #[command(subcommand)]
        function: RunFunction,
    },
    /// Run the conformance suite against a component: one line per check, non-zero exit when
    /// one fails (docs/plugin-authoring.md, "Testing a provider").
    Test {
        file: PathBuf,
        /// A providers-config entry (YAML or JSON): a good `config` and its `grants`.
        #[arg(long)]
        config: PathBuf,
        /// An instance spec (YAML or JSON) to create instead of the default one.
        #[arg(long)]
        spec: Option<PathBuf>,
        /// Print one JSON document (for CI) instead of lines.
        #[arg(long)]
        json: bool,
        /// For `grants.libvirt`: the SSH private key (OpenSSH, unencrypted) to reach hypervisors.
        #[arg(long, requires = "known_hosts")]
        ssh_key: Option<PathBuf>,
        /// For `grants.libvirt`: the known_hosts file the hypervisors' host keys are checked against.
        #[arg(long, requires = "ssh_key")]
        known_hosts: Option<PathBuf>,
    },
    /// Write a new provider crate (SDK, JSON Schema, every function, README, small release
    /// profile) that passes `plugin test` as generated.
    New(super::scaffold::NewArgs),
    /// Serve the instances API the scaffold's provider talks to, in memory on loopback, so a
    /// new provider can be tried and tested offline.
    DevApi {
        /// Where to listen; `127.0.0.1:0` picks a free port (printed on stdout).
        #[arg(long, default_value = "127.0.0.1:8787")]
        listen: std::net::SocketAddr,
    },
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// clap's own checks of the definitions (conflicting names, `requires` of a missing
    /// argument), which otherwise only fire when that subcommand is parsed.
    #[test]
    fn the_command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }

    #[test]
    fn each_shell_gets_a_script_naming_every_subcommand() {
        use clap::ValueEnum;
        let cli = super::Cli::command();
        let subcommands: Vec<&str> = cli.get_subcommands().map(|c| c.get_name()).collect();
        assert!(subcommands.contains(&"completions"), "{subcommands:?}");
        for shell in clap_complete::Shell::value_variants() {
            let script = String::from_utf8(super::completions(*shell)).expect("UTF-8");
            // Flags of `run` and `gateway` without their dashes: fish writes `-l providers-config`.
            for name in subcommands
                .iter()
                .chain(&["providers-config", "discovery-url"])
            {
                assert!(script.contains(name), "{shell}: no `{name}` in\n{script}");
            }
        }
    }
}
