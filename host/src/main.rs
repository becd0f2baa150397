//! The operator binary: the composition root. Flags, logging, and dispatch to subcommands.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use proxy_operator::cli::plugin::{self, RunFunction};

#[derive(Debug, Parser)]
#[command(
    name = "proxy-operator",
    version,
    about = "Healthy egress proxies for crawler fleets"
)]
struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `proxy_operator=debug`.
    #[arg(long, env = "LOG_LEVEL", default_value = "info", global = true)]
    log_level: String,
    /// Log format.
    #[arg(
        long,
        env = "LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the operator: reconcile Proxies through the configured providers.
    Run(Box<proxy_operator::cli::run::RunArgs>),
    /// Run the gateway: one proxy endpoint (HTTP, CONNECT, SOCKS5) that carries each request
    /// through a proxy of the fleet the leader picks (docs/gateway.md).
    Gateway(Box<proxy_operator::cli::gateway::GatewayArgs>),
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
}

#[derive(Debug, Subcommand)]
enum PluginCommand {
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
    New(proxy_operator::cli::scaffold::NewArgs),
    /// Serve the instances API the scaffold's provider talks to, in memory on loopback, so a
    /// new provider can be tried and tested offline.
    DevApi {
        /// Where to listen; `127.0.0.1:0` picks a free port (printed on stdout).
        #[arg(long, default_value = "127.0.0.1:8787")]
        listen: std::net::SocketAddr,
    },
}

/// Logs to stderr, coloured only when stderr is a terminal (log files and container logs get
/// plain text). A `--log-level` that is not a filter is refused, not replaced by `info`.
fn init_logging(cli: &Cli) -> Result<(), String> {
    use std::io::IsTerminal;
    let filter = proxy_operator::cli::logging::filter(&cli.log_level)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

fn write_crds(out: Option<&std::path::Path>) -> anyhow::Result<()> {
    use anyhow::Context;
    let manifests = proxy_operator::api::crd_manifests();
    match out {
        None => {
            for (_, yaml) in manifests {
                println!("---\n{yaml}");
            }
        }
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            for (file, yaml) in manifests {
                let path = dir.join(file);
                std::fs::write(&path, yaml)
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = init_logging(&cli) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    match &cli.command {
        Command::Run(args) => match proxy_operator::cli::run::run((**args).clone()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e:#}");
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Gateway(args) => match proxy_operator::cli::gateway::run((**args).clone()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e:#}");
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Crds { out } => match write_crds(out.as_deref()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Plugin { command } => plugin_command(command).await,
    }
}

/// `proxy-operator plugin …`: `test`, `new` and `dev-api` say their own result; the others answer
/// one JSON document.
async fn plugin_command(command: &PluginCommand) -> ExitCode {
    let result = match command {
        PluginCommand::Test {
            file,
            config,
            spec,
            json,
            ssh_key,
            known_hosts,
        } => {
            let ssh = ssh_key.as_deref().zip(known_hosts.as_deref());
            let spec = spec.as_deref();
            return proxy_operator::cli::plugin_test::command(file, config, spec, ssh, *json).await;
        }
        PluginCommand::New(args) => return proxy_operator::cli::scaffold::command(args),
        PluginCommand::DevApi { listen } => {
            return proxy_operator::cli::dev_api::command(*listen).await;
        }
        PluginCommand::Inspect { file, config } => plugin::inspect(file, config.as_deref()).await,
        PluginCommand::Validate {
            file,
            config,
            providers_config,
            plugins_dir,
        } => match (file, config, providers_config) {
            (Some(file), Some(config), _) => plugin::validate(file, config).await,
            (_, _, Some(providers_config)) => {
                plugin::validate_providers_config(providers_config, plugins_dir).await
            }
            _ => unreachable!("clap requires FILE --config or --providers-config"),
        },
        PluginCommand::Run {
            file,
            config,
            ssh_key,
            known_hosts,
            kubeconfig,
            function,
        } => {
            let access = plugin::RunAccess {
                ssh: ssh_key.as_deref().zip(known_hosts.as_deref()),
                kubeconfig: kubeconfig.as_deref(),
            };
            plugin::run(file, config, access, function).await
        }
    };
    print_json(result)
}

/// Prints a tool's JSON answer. `plugin inspect` of a file that cannot load, or `plugin validate`
/// of a bad config, still prints what it found but fails, so a script or a CI step can tell.
fn print_json(result: anyhow::Result<serde_json::Value>) -> ExitCode {
    match result {
        Ok(value) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&value).expect("JSON values always serialize")
            );
            let refused = serde_json::Value::Bool(false);
            if value.get("loads") == Some(&refused) || value.get("valid") == Some(&refused) {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
