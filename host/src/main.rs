//! The operator binary: the composition root. Logging, and dispatch to subcommands (the flags
//! are `cli::command`).

use std::process::ExitCode;

use clap::Parser;
use proxy_operator::faces::cli::command::{Cli, Command, LogFormat, PluginCommand};
use proxy_operator::faces::cli::plugin;

/// Logs to stderr, coloured only on a terminal without `NO_COLOR` (`logging::colour`). A
/// `--log-level` that is not a filter is refused, not replaced by `info`.
fn init_logging(cli: &Cli) -> Result<(), String> {
    use proxy_operator::faces::cli::logging;
    use std::io::IsTerminal;
    let filter = logging::filter(&cli.log_level)?;
    let no_color = std::env::var_os("NO_COLOR");
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(logging::colour(
            std::io::stderr().is_terminal(),
            no_color.as_deref(),
        ))
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
    // Before the log set-up: a script is printed whatever LOG_LEVEL says.
    if let Command::Completions { shell } = cli.command {
        use std::io::Write;
        let written =
            std::io::stdout().write_all(&proxy_operator::faces::cli::command::completions(shell));
        return match written {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: writing the completion script: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Err(e) = init_logging(&cli) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    match &cli.command {
        Command::Run(args) => match proxy_operator::faces::cli::run::run((**args).clone()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e:#}");
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Gateway(args) => {
            match proxy_operator::faces::cli::gateway::run((**args).clone()).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e:#}");
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Crds { out } => match write_crds(out.as_deref()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Plugin { command } => plugin_command(command).await,
        Command::Completions { .. } => unreachable!("printed before the log set-up"),
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
            return proxy_operator::faces::cli::plugin_test::command(
                file, config, spec, ssh, *json,
            )
            .await;
        }
        PluginCommand::New(args) => return proxy_operator::faces::cli::scaffold::command(args),
        PluginCommand::DevApi { listen } => {
            return proxy_operator::faces::cli::dev_api::command(*listen).await;
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
