//! The command line of `kubectl-px` (`kubectl px …`), as clap reads it. In the library so tests
//! and the completion scripts see the same definition.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use crate::api::MAX_POOL_REPLICAS;

/// The binary's name: kubectl runs `kubectl-px` for `kubectl px` (`kubectl-proxy` would never
/// run: kubectl's own `kubectl proxy` takes precedence over a plugin of that name).
pub const BIN: &str = "kubectl-px";

#[derive(Debug, Parser)]
#[command(
    name = "kubectl-px",
    bin_name = "kubectl px",
    version = crate::support::version::VERSION,
    about = "The proxy fleet at a glance: status, why a Proxy is not Ready, leases from a shell, drain, recycle and scale",
    after_help = "Exit codes: 0 done; 1 error; 2 usage; 3 not Ready (`why`, `status` of one Proxy or pool); 4 try again later (the discovery API answered with Retry-After)."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every command takes.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Global options")]
pub struct Global {
    /// The kubeconfig file (default: `KUBECONFIG`, then `~/.kube/config`).
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The namespace of the Proxies and pools (default: the context's, else `default`).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// Output format: a table for people, or JSON / YAML for scripts.
    #[arg(short = 'o', long, global = true, value_enum, default_value = "table")]
    pub output: Output,
    /// Namespace the operator runs in (its lease table and discovery Secret are there).
    #[arg(
        long,
        global = true,
        env = "PROXY_OPERATOR_NAMESPACE",
        default_value = "proxy-operator"
    )]
    pub operator_namespace: String,
    /// The operator's `--operator-id` (its lease table is the ConfigMap `<id>-leases`).
    #[arg(
        long,
        global = true,
        env = "PROXY_OPERATOR_ID",
        default_value = "proxy-operator"
    )]
    pub operator_id: String,
    /// The discovery API (`lease`, `release`, `report`), e.g. `https://localhost:8090` after
    /// `kubectl -n proxy-operator port-forward svc/proxy-operator-discovery 8090`.
    #[arg(long, global = true, env = "DISCOVERY_URL", value_name = "URL")]
    pub discovery_url: Option<String>,
    /// The CA certificate(s) (PEM) the discovery API's certificate is checked against, and only
    /// they: the ca.crt of its TLS Secret. Unset: the system's roots.
    #[arg(long, global = true, env = "DISCOVERY_CA_FILE", value_name = "FILE")]
    pub discovery_ca_file: Option<PathBuf>,
    /// The discovery API's bearer token. Default: the kubeconfig user's token, then the
    /// operator's static token from the Secret `proxy-operator-discovery`.
    #[arg(long, global = true, env = "DISCOVERY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A file holding the discovery API's bearer token (read at each run).
    #[arg(
        long,
        global = true,
        env = "DISCOVERY_TOKEN_FILE",
        value_name = "FILE",
        conflicts_with = "token"
    )]
    pub token_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
    Yaml,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The fleet in one screen (pools, providers, proxies, blocks), or one pool or Proxy.
    Status {
        /// A ProxyPool or a Proxy (`pool/NAME` or `proxy/NAME` when both have the name).
        object: Option<String>,
        /// Every namespace's pools and Proxies.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        /// A host crawlers report blocks for: which proxies cool down for it, and until when
        /// (the lease table keeps hosts only as digests).
        #[arg(long, value_name = "HOST")]
        target: Option<String>,
        /// The leader's metrics port, for the recent blocks by target host (e.g.
        /// `http://localhost:9090`); by default reached through the API server's pod proxy.
        #[arg(long, env = "PROXY_OPERATOR_METRICS_URL", value_name = "URL")]
        metrics_url: Option<String>,
    },
    /// What a team used and spent (instance-hours, spend, leases, gateway bytes) over the last
    /// hour, the last day and since the leader's usage book began.
    Usage {
        /// Every namespace's usage (else the namespace's: `-n`, the context's).
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        /// Rows per namespace (default), or per pool or provider instance within it.
        #[arg(long, value_enum, default_value = "namespace")]
        by: super::usage::By,
        /// The leader's metrics port (e.g. `http://localhost:9090`); by default reached
        /// through the API server's pod proxy.
        #[arg(long, env = "PROXY_OPERATOR_METRICS_URL", value_name = "URL")]
        metrics_url: Option<String>,
    },
    /// Why a Proxy is not Ready: the first step that fails, its message, what to do.
    Why {
        /// The Proxy.
        proxy: String,
    },
    /// Lease a proxy from the discovery API.
    Lease {
        /// A ProxyPool: `NAME` (in the namespace) or `NAMESPACE/NAME`.
        #[arg(long)]
        pool: Option<String>,
        /// A sticky session key: the same proxy for the same session.
        #[arg(long)]
        session: Option<String>,
        /// The host you will visit: proxies cooling down for it are skipped.
        #[arg(long, value_name = "HOST")]
        target: Option<String>,
        /// One particular Proxy: `NAME` (in the namespace) or `NAMESPACE/NAME`.
        #[arg(long)]
        proxy: Option<String>,
        /// Only proxies of this provider instance.
        #[arg(long)]
        provider: Option<String>,
        /// Only proxies in this zone.
        #[arg(long)]
        zone: Option<String>,
        /// Labels the Proxy must carry, `key=value` (repeat, or separate with commas).
        #[arg(short = 'l', long, value_name = "KEY=VALUE", value_delimiter = ',')]
        selector: Vec<String>,
        /// The lease's lifetime (`30s`, `10m`); default the operator's `--default-lease-ttl`.
        #[arg(long, value_parser = crate::support::durations::parse)]
        ttl: Option<Duration>,
    },
    /// Release a lease (idempotent).
    Release {
        /// The lease id `lease` printed.
        id: String,
    },
    /// Report how a leased proxy did: `blocked` ends the lease and cools the proxy down.
    Report {
        /// The lease id.
        id: String,
        /// What happened.
        #[arg(value_enum)]
        outcome: ReportOutcome,
        /// With `blocked`: the host that blocked the proxy (it cools down for that host only).
        #[arg(long, value_name = "HOST")]
        target: Option<String>,
    },
    /// Take a Proxy out of leasing: no new lease; its pool replaces it and deletes it once its
    /// lease ends.
    Drain {
        /// The Proxy.
        proxy: String,
        /// Lease it again (remove the drain).
        #[arg(long)]
        undo: bool,
    },
    /// Have a pool replace one of its Proxies: a new one first, then this one is drained and
    /// deleted once its lease ends, within the pool's maxSurge / maxUnavailable.
    Recycle {
        /// The Proxy (of a pool).
        proxy: String,
    },
    /// Set a pool's number of Proxies.
    Scale {
        /// The ProxyPool.
        pool: String,
        /// Proxies it keeps.
        #[arg(value_parser = clap::value_parser!(i32).range(0..=MAX_POOL_REPLICAS as i64))]
        replicas: i32,
    },
    /// Print a shell completion script, e.g. `kubectl-px completions bash >
    /// ~/.local/share/bash-completion/completions/kubectl-px`.
    Completions {
        /// The shell the script is for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportOutcome {
    Success,
    Failure,
    Blocked,
}

impl ReportOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            ReportOutcome::Success => "success",
            ReportOutcome::Failure => "failure",
            ReportOutcome::Blocked => "blocked",
        }
    }
}

/// The completion script of `shell` for this command line.
pub fn completions(shell: clap_complete::Shell) -> Vec<u8> {
    use clap::CommandFactory;
    // The scripts complete the binary as it is on PATH (`kubectl-px`); `kubectl px` completes
    // through kubectl's own plugin completion (docs/kubectl-plugin.md).
    let mut command = Cli::command().bin_name(BIN);
    crate::faces::cli::command::completion_script(shell, &mut command, BIN)
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn each_shell_gets_a_script_naming_every_subcommand() {
        let subcommands: Vec<String> = Cli::command()
            .get_subcommands()
            .map(|c| c.get_name().to_string())
            .collect();
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let script = String::from_utf8(completions(shell)).unwrap();
            for name in subcommands
                .iter()
                .map(String::as_str)
                .chain(["discovery-url"])
            {
                assert!(script.contains(name), "{shell}: no `{name}`");
            }
            assert!(script.contains(BIN), "{shell}: completes {BIN}");
        }
    }

    /// Global flags go before or after the command, as kubectl's do.
    #[test]
    fn flags_go_anywhere_and_bad_input_is_a_usage_error() {
        let cli =
            Cli::try_parse_from(["kubectl-px", "-n", "crawl", "status", "-o", "json"]).unwrap();
        assert_eq!(cli.global.namespace.as_deref(), Some("crawl"));
        assert_eq!(cli.global.output, Output::Json);
        let scale = Cli::try_parse_from(["kubectl-px", "scale", "egress", "10001"]).unwrap_err();
        assert_eq!(scale.exit_code(), 2);
        let report = Cli::try_parse_from(["kubectl-px", "report", "x", "banned"]).unwrap_err();
        assert_eq!(report.exit_code(), 2);
        let lease = Cli::try_parse_from([
            "kubectl-px",
            "lease",
            "-l",
            "tier=cheap,zone=a",
            "--ttl",
            "10m",
        ])
        .unwrap();
        let Command::Lease { selector, ttl, .. } = lease.command else {
            panic!()
        };
        assert_eq!(selector, ["tier=cheap", "zone=a"]);
        assert_eq!(ttl, Some(Duration::from_secs(600)));
    }
}
