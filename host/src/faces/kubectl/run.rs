//! `kubectl-px`'s entry: parse, run the command against the cluster (and the discovery API),
//! print the table or the JSON / YAML, exit with a code a script can use (`exit.rs`).

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use kube::api::Api;
use serde::Serialize;
use serde_json::json;

use super::actions;
use super::args::{Cli, Command, Global, Output, ReportOutcome};
use super::complete::{self, Want};
use super::describe;
use super::exit::{Exit, Failure};
use super::fetch::{self, Cluster};
use super::fleet::{self, qualified_name};
use super::lease_api::{self, Answer, Discovery, Token};
use super::usage;
use super::why::{self, Leasing};
use crate::api::{Proxy, ProxyPool};
use crate::faces::status_page::usage_json::{USAGE_JSON_PATH, UsageReport};
use crate::leasing::leases::Outcome;
use crate::leasing::leases::store::{now_ms, persisted_target};

/// What a command printed and how it ends.
struct Done {
    text: String,
    exit: Exit,
}

impl Done {
    fn ok(text: String) -> Self {
        Done {
            text,
            exit: Exit::Ok,
        }
    }
}

/// The binary's `main`.
pub fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    let called = argv
        .first()
        .map(|a| a.rsplit('/').next().unwrap_or(a).to_string())
        .unwrap_or_default();
    if called == complete::COMPLETER {
        return completion(argv[1..].to_vec());
    }
    if argv.get(1).is_some_and(|a| a == "__complete") {
        return completion(argv[2..].to_vec());
    }
    let cli = Cli::try_parse().unwrap_or_else(|e| e.exit());
    if let Command::Completions { shell } = cli.command {
        return match std::io::stdout().write_all(&super::args::completions(shell)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: writing the completion script: {e}");
                ExitCode::from(Exit::Error.code())
            }
        };
    }
    let no_color = std::env::var_os("NO_COLOR");
    let colour =
        crate::faces::cli::logging::colour(std::io::stdout().is_terminal(), no_color.as_deref());
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::from(Exit::Error.code());
        }
    };
    match runtime.block_on(run(cli, colour)) {
        Ok(done) => {
            let _ = std::io::stdout().write_all(done.text.as_bytes());
            ExitCode::from(done.exit.code())
        }
        Err(failure) => {
            eprintln!("error: {}", failure.message);
            ExitCode::from(failure.exit.code())
        }
    }
}

async fn run(cli: Cli, colour: bool) -> Result<Done, Failure> {
    let global = &cli.global;
    match cli.command {
        Command::Usage {
            all_namespaces,
            by,
            metrics_url,
        } => usage(global, all_namespaces, by, metrics_url.as_deref(), colour).await,
        Command::Status {
            object,
            all_namespaces,
            target,
            metrics_url,
        } => {
            let asked = StatusOf {
                object,
                all_namespaces,
                target,
                metrics_url,
            };
            status(global, asked, colour).await
        }
        Command::Why { proxy } => why_not(global, &proxy, colour).await,
        Command::Lease {
            pool,
            session,
            target,
            proxy,
            provider,
            zone,
            selector,
            ttl,
        } => {
            let cluster = fetch::connect(global).await.ok();
            let namespace = namespace(global, cluster.as_ref());
            let body = lease_api::grant_body(
                &namespace,
                pool.as_deref(),
                proxy.as_deref(),
                session,
                target,
                provider,
                zone,
                &selector,
                ttl,
            )?;
            let body = serde_json::to_vec(&body).expect("a grant body serializes");
            let (answer, token) = call(
                global,
                cluster,
                reqwest::Method::POST,
                "/v1/leases",
                Some(body),
            )
            .await?;
            if answer.status != 200 && answer.status != 201 {
                return Err(lease_api::problem(&answer, &token.from));
            }
            output(global.output, &answer.body, || {
                lease_api::render_lease(answer.status, &answer.body, now_ms(), colour)
            })
        }
        Command::Release { id } => {
            let path = format!("/v1/leases/{id}");
            let (answer, token) = call(global, None, reqwest::Method::DELETE, &path, None).await?;
            if answer.status != 204 {
                return Err(lease_api::problem(&answer, &token.from));
            }
            output(global.output, &json!({"id": id, "released": true}), || {
                format!("Lease {id} released.\n")
            })
        }
        Command::Report {
            id,
            outcome,
            target,
        } => report(global, &id, outcome, target).await,
        Command::Drain { proxy, undo } => drain(global, &proxy, undo).await,
        Command::Recycle { proxy } => recycle(global, &proxy).await,
        Command::Scale { pool, replicas } => scale(global, &pool, replicas).await,
        Command::Completions { .. } => unreachable!("handled before the runtime"),
    }
}

/// kubectl's plugin completion: candidates for the last of `args`, names from the cluster at
/// most 5 s away (a cluster that does not answer completes nothing rather than hanging).
fn completion(args: Vec<String>) -> ExitCode {
    use clap::CommandFactory;
    let (want, namespace) = complete::want(&Cli::command(), &args);
    let word = args.last().cloned().unwrap_or_default();
    let candidates = match want {
        Want::Words(words) => words,
        Want::Nothing => Vec::new(),
        objects => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map(|runtime| {
                runtime.block_on(async {
                    tokio::time::timeout(
                        std::time::Duration::from_secs(5),
                        names(objects, namespace),
                    )
                    .await
                    .unwrap_or_default()
                })
            })
            .unwrap_or_default(),
    };
    let _ = std::io::stdout().write_all(complete::answer(&candidates, &word).as_bytes());
    ExitCode::SUCCESS
}

/// The names of the objects `want` asks for, in `namespace` (else the kubeconfig's).
async fn names(want: Want, namespace: Option<String>) -> Vec<String> {
    let global = Global {
        kubeconfig: None,
        context: None,
        namespace,
        output: Output::Table,
        operator_namespace: String::new(),
        operator_id: String::new(),
        discovery_url: None,
        discovery_ca_file: None,
        token: None,
        token_file: None,
    };
    let Ok(cluster) = fetch::connect(&global).await else {
        return Vec::new();
    };
    let params = kube::api::ListParams::default();
    let ns = cluster.namespace.as_str();
    let mut names = Vec::new();
    if matches!(want, Want::Pools | Want::Objects) {
        let api: Api<ProxyPool> = Api::namespaced(cluster.client.clone(), ns);
        if let Ok(list) = api.list_metadata(&params).await {
            names.extend(list.items.into_iter().filter_map(|m| m.metadata.name));
        }
    }
    if matches!(want, Want::Proxies | Want::Objects) {
        let api: Api<Proxy> = Api::namespaced(cluster.client.clone(), ns);
        if let Ok(list) = api.list_metadata(&params).await {
            names.extend(list.items.into_iter().filter_map(|m| m.metadata.name));
        }
    }
    if want == Want::Namespaces {
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(cluster.client.clone());
        if let Ok(list) = api.list_metadata(&params).await {
            names.extend(list.items.into_iter().filter_map(|m| m.metadata.name));
        }
    }
    names.sort();
    names.dedup();
    names
}

/// The table for people, or the value as JSON or YAML.
fn output<T: Serialize>(
    format: Output,
    value: &T,
    table: impl FnOnce() -> String,
) -> Result<Done, Failure> {
    let text = match format {
        Output::Table => table(),
        Output::Json => serde_json::to_string_pretty(value).expect("views serialize") + "\n",
        Output::Yaml => crate::support::yaml::to_string(value).expect("views serialize"),
    };
    Ok(Done::ok(text))
}

fn namespace(global: &Global, cluster: Option<&Cluster>) -> String {
    global
        .namespace
        .clone()
        .or_else(|| cluster.map(|c| c.namespace.clone()))
        .unwrap_or_else(|| "default".into())
}

/// `pool/NAME`, `proxy/NAME` (and the short names), or a bare name.
enum Object<'a> {
    Pool(&'a str),
    Proxy(&'a str),
    Either(&'a str),
}

fn object(text: &str) -> Object<'_> {
    match text.split_once('/') {
        Some(("pool" | "pools" | "pp" | "proxypool" | "proxypools", name)) => Object::Pool(name),
        Some(("proxy" | "proxies" | "px", name)) => Object::Proxy(name),
        _ => Object::Either(text),
    }
}

/// What `status` was asked.
struct StatusOf {
    object: Option<String>,
    all_namespaces: bool,
    target: Option<String>,
    metrics_url: Option<String>,
}

/// `usage`: the leader's usage book, for the namespace (or every one), grouped `by`.
async fn usage(
    global: &Global,
    all_namespaces: bool,
    by: usage::By,
    metrics_url: Option<&str>,
    colour: bool,
) -> Result<Done, Failure> {
    let cluster = fetch::connect(global).await?;
    let (source, body) = fetch::leader_json(
        &cluster,
        &global.operator_namespace,
        metrics_url,
        USAGE_JSON_PATH,
    )
    .await
    .map_err(Failure::error)?;
    let report: UsageReport = serde_json::from_str(&body).map_err(|e| {
        Failure::error(format!(
            "{source} did not answer with the usage book ({e}); is it the operator's metrics port?"
        ))
    })?;
    if report.replica != "leader" {
        let who = report.leader.as_deref().unwrap_or("unknown yet");
        return Err(Failure::error(format!(
            "{source} is a {} replica: only the leader keeps the usage book (leader: {who})",
            report.replica
        )));
    }
    let namespaces = [cluster.namespace.clone()];
    let scope = (!all_namespaces).then_some(&namespaces[..]);
    let view = usage::view(&report, scope, by);
    output(global.output, &view, || usage::render(&view, by, colour))
}

async fn status(global: &Global, asked: StatusOf, colour: bool) -> Result<Done, Failure> {
    let StatusOf {
        object: target_object,
        all_namespaces,
        target,
        metrics_url,
    } = asked;
    let cluster = fetch::connect(global).await?;
    let now = now_ms();
    let target = target
        .map(|host| {
            persisted_target(&host)
                .map(|digest| (host.clone(), digest))
                .map_err(|e| Failure::usage(format!("--target `{host}`: {e}")))
        })
        .transpose()?;
    let Some(text) = target_object else {
        let scope = (!all_namespaces).then_some(cluster.namespace.as_str());
        let mut fleet = fetch::fleet(&cluster, scope, global, now).await?;
        fleet.target = target;
        let recent =
            fetch::recent_blocks(&cluster, &global.operator_namespace, metrics_url.as_deref());
        fleet.recent_blocks = Some(recent.await);
        let view = fleet::view(&fleet);
        return output(global.output, &view, || {
            fleet::render(&view, all_namespaces, now, colour)
        });
    };
    let ns = cluster.namespace.as_str();
    let pools: Api<ProxyPool> = Api::namespaced(cluster.client.clone(), ns);
    let proxies: Api<Proxy> = Api::namespaced(cluster.client.clone(), ns);
    let (pool, proxy) = match object(&text) {
        Object::Pool(name) => (fetch::get_opt(&pools, name, "ProxyPool").await?, None),
        Object::Proxy(name) => (None, fetch::get_opt(&proxies, name, "Proxy").await?),
        Object::Either(name) => (
            fetch::get_opt(&pools, name, "ProxyPool").await?,
            fetch::get_opt(&proxies, name, "Proxy").await?,
        ),
    };
    match (pool, proxy) {
        (Some(_), Some(_)) => Err(Failure::usage(format!(
            "both a ProxyPool and a Proxy are named {text} in {ns}: say pool/{text} or proxy/{text}"
        ))),
        (Some(pool), None) => {
            let fleet = fetch::fleet(&cluster, Some(ns), global, now).await?;
            let view = describe::pool_view(&pool, &fleet);
            let mut done = output(global.output, &view, || {
                describe::render_pool(&view, now, colour)
            })?;
            if !view.ready {
                done.exit = Exit::NotReady;
            }
            Ok(done)
        }
        (None, Some(proxy)) => {
            let health =
                fetch::provider_health(&cluster.client, &proxy.spec.provider, &global.operator_id)
                    .await;
            let fleet = fleet::Fleet {
                leases: fetch::lease_facts(
                    &cluster.client,
                    &global.operator_namespace,
                    &global.operator_id,
                    now,
                )
                .await,
                now_ms: now,
                target,
                ..Default::default()
            };
            let view = describe::proxy_view(&proxy, health.as_ref(), &fleet);
            let mut done = output(global.output, &view, || {
                describe::render_proxy(&view, now, colour)
            })?;
            if !view.ready {
                done.exit = Exit::NotReady;
            }
            Ok(done)
        }
        (None, None) => Err(Failure::error(format!(
            "no ProxyPool or Proxy named {text} in namespace {ns}"
        ))),
    }
}

async fn the_proxy(cluster: &Cluster, name: &str) -> Result<(Api<Proxy>, Proxy), Failure> {
    let api: Api<Proxy> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    match fetch::get_opt(&api, name, "Proxy").await? {
        Some(proxy) => Ok((api, proxy)),
        None => Err(Failure::error(format!(
            "no Proxy {name} in namespace {}",
            cluster.namespace
        ))),
    }
}

async fn why_not(global: &Global, name: &str, colour: bool) -> Result<Done, Failure> {
    let cluster = fetch::connect(global).await?;
    let (_, proxy) = the_proxy(&cluster, name).await?;
    let now = now_ms();
    let health =
        fetch::provider_health(&cluster.client, &proxy.spec.provider, &global.operator_id).await;
    let events = fetch::events(&cluster.client, &cluster.namespace, name, 5).await;
    let facts = fetch::lease_facts(
        &cluster.client,
        &global.operator_namespace,
        &global.operator_id,
        now,
    )
    .await;
    let row = fleet::proxy_row(&proxy, &facts);
    let leasing = Leasing {
        draining: row.draining,
        cooling_until_ms: row.cooling_down_until_ms,
        leased_until_ms: row.lease.as_ref().map(|l| l.expires_at_ms),
        holder: row.lease.as_ref().map(|l| l.holder.clone()),
    };
    let explanation = why::explain(&proxy, health.as_ref(), events, &leasing, now);
    let mut done = output(global.output, &explanation, || {
        why::render(&explanation, now, colour)
    })?;
    if !explanation.ready {
        done.exit = Exit::NotReady;
    }
    Ok(done)
}

/// One request to the discovery API with the first token that is not refused: `--token` /
/// `--token-file`, else the kubeconfig user's bearer token, else (also after a `401` for that
/// one) the operator's static token from its Secret, read with the kubeconfig's credentials.
async fn call(
    global: &Global,
    cluster: Option<Cluster>,
    method: reqwest::Method,
    path: &str,
    body: Option<Vec<u8>>,
) -> Result<(Answer, Token), Failure> {
    let url = global.discovery_url.as_deref().ok_or_else(|| {
        Failure::usage(
            "the discovery API's address is needed: --discovery-url URL (or DISCOVERY_URL), e.g. \
             https://localhost:8090 (with --discovery-ca-file) after `kubectl -n proxy-operator port-forward \
             svc/proxy-operator-discovery 8090` (the API server's service proxy drops the bearer \
             token the API needs)",
        )
    })?;
    let discovery = Discovery::new(url, global.discovery_ca_file.as_deref())?;
    let explicit = match (&global.token, &global.token_file) {
        (Some(token), _) => Some(Token {
            value: token.clone(),
            from: "--token / DISCOVERY_TOKEN".into(),
        }),
        (None, Some(file)) => Some(Token {
            value: std::fs::read_to_string(file)
                .map_err(|e| Failure::error(format!("--token-file {}: {e}", file.display())))?
                .trim()
                .to_string(),
            from: format!("from {}", file.display()),
        }),
        (None, None) => None,
    };
    if let Some(token) = explicit {
        let answer = discovery.call(method, path, body, &token.value).await?;
        return Ok((answer, token));
    }
    let cluster = match cluster {
        Some(cluster) => cluster,
        None => fetch::connect(global).await?,
    };
    let mut refused = None;
    if let Some(value) = fetch::kubeconfig_token(&cluster.config) {
        let token = Token {
            value,
            from: "the kubeconfig user's".into(),
        };
        let answer = discovery
            .call(method.clone(), path, body.clone(), &token.value)
            .await?;
        if answer.status != 401 {
            return Ok((answer, token));
        }
        refused = Some((answer, token));
    }
    match fetch::discovery_secret_token(&cluster.client, &global.operator_namespace).await {
        Ok(value) => {
            let token = Token {
                value,
                from: format!(
                    "the static token of Secret {}/proxy-operator-discovery",
                    global.operator_namespace
                ),
            };
            let answer = discovery.call(method, path, body, &token.value).await?;
            Ok((answer, token))
        }
        Err(_) if refused.is_some() => Ok(refused.expect("checked")),
        Err(why) => Err(Failure::error(format!(
            "no token for the discovery API: the kubeconfig user has none and {why}; pass --token or --token-file"
        ))),
    }
}

async fn report(
    global: &Global,
    id: &str,
    outcome: ReportOutcome,
    target: Option<String>,
) -> Result<Done, Failure> {
    let outcome = match outcome {
        ReportOutcome::Success => Outcome::Success,
        ReportOutcome::Failure => Outcome::Failure,
        ReportOutcome::Blocked => Outcome::Blocked,
    };
    let body = serde_json::to_vec(&lease_api::report_body(outcome, target.clone()))
        .expect("a report serializes");
    let path = format!("/v1/leases/{id}/report");
    let (answer, token) = call(global, None, reqwest::Method::POST, &path, Some(body)).await?;
    if answer.status != 200 {
        return Err(lease_api::problem(&answer, &token.from));
    }
    output(global.output, &answer.body, || {
        lease_api::render_report(id, outcome, target.as_deref(), &answer.body)
    })
}

async fn drain(global: &Global, name: &str, undo: bool) -> Result<Done, Failure> {
    let cluster = fetch::connect(global).await?;
    let (api, _) = the_proxy(&cluster, name).await?;
    let proxy = actions::apply(&api, name, &actions::drain_patch(undo), "draining Proxy").await?;
    let now = now_ms();
    let key = qualified_name(&cluster.namespace, name);
    let lease_until = if undo {
        None
    } else {
        fetch::lease_facts(
            &cluster.client,
            &global.operator_namespace,
            &global.operator_id,
            now,
        )
        .await
        .lease(&key)
        .map(|l| l.expires_at_ms)
    };
    let value = json!({
        "proxy": key,
        "draining": !undo,
        "pool": kube::ResourceExt::labels(&proxy).get(crate::api::labels::POOL_LABEL),
        "leaseExpiresAt": lease_until.map(super::table::rfc3339),
    });
    output(global.output, &value, || {
        actions::drained(&proxy, undo, lease_until, now)
    })
}

async fn recycle(global: &Global, name: &str) -> Result<Done, Failure> {
    let cluster = fetch::connect(global).await?;
    let (api, proxy) = the_proxy(&cluster, name).await?;
    let pool = actions::check_recyclable(&proxy)?;
    let proxy = actions::apply(&api, name, &actions::recycle_patch(), "recycling Proxy").await?;
    let value =
        json!({"proxy": qualified_name(&cluster.namespace, name), "pool": pool, "recycle": true});
    output(global.output, &value, || actions::recycled(&proxy, &pool))
}

async fn scale(global: &Global, name: &str, replicas: i32) -> Result<Done, Failure> {
    let cluster = fetch::connect(global).await?;
    let api: Api<ProxyPool> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let Some(pool) = fetch::get_opt(&api, name, "ProxyPool").await? else {
        return Err(Failure::error(format!(
            "no ProxyPool {name} in namespace {}",
            cluster.namespace
        )));
    };
    let from = pool.spec.replicas;
    actions::apply(
        &api,
        name,
        &actions::scale_patch(replicas),
        "scaling ProxyPool",
    )
    .await?;
    let key = qualified_name(&cluster.namespace, name);
    let value = json!({"pool": key, "from": from, "to": replicas});
    output(global.output, &value, || {
        actions::scaled(&key, from, replicas)
    })
}
