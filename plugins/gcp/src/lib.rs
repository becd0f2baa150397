//! The `gcp` provider: a proxy is a Compute Engine VM, made through the REST API with the `http`
//! capability. The host adds the OAuth token (`grants.http.credentials` with
//! `valueFrom.gcpServiceAccountKey`): this plugin never sees a credential.
//!
//! The VM is named after the instance (derived by the operator from the Proxy UID), so create is
//! idempotent; the Proxy's identity is in the VM's metadata (`proxy-operator-owner`), with the
//! label `proxy-operator-managed=true` for `list`. cloud-init is passed as `user-data` metadata.
//! Provider ids are `<zone>/<name>`.

pub mod compute;
pub mod config;

use proxy_operator_sdk::capabilities::{self, Level, Response, json_request};
use proxy_operator_sdk::{
    Capability, CheckTarget, Instance, InstanceSpec, PluginInfo, Provider, ProviderError,
    export_provider,
};

use crate::config::Config;

pub const PROVIDER_TYPE: &str = "gcp";

pub struct GcpProvider;

fn zone_url(config: &Config, zone: &str) -> String {
    format!(
        "{}/compute/v1/projects/{}/zones/{zone}",
        config.api_base.trim_end_matches('/'),
        config.project
    )
}

fn call(
    method: &str,
    url: &str,
    body: Option<&serde_json::Value>,
) -> Result<Response, ProviderError> {
    Ok(capabilities::http_send(&json_request(method, url, body))?)
}

fn parse(what: &str, response: &Response) -> Result<serde_json::Value, ProviderError> {
    serde_json::from_slice(&response.body).map_err(|e| {
        ProviderError::Permanent(format!("{what}: the API answered invalid JSON: {e}"))
    })
}

/// Most pages one `list` follows per zone (500 VMs a page by default): a bound on a loop driven
/// by the API's answers.
const MAX_LIST_PAGES: usize = 100;

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// The error of the latest insert of VM `name` if it failed within the last minute (the insert
/// is an operation: Google accepts it, and it may fail afterwards: quota, image, permission).
fn failed_insert(
    config: &Config,
    zone: &str,
    name: &str,
) -> Result<Option<ProviderError>, ProviderError> {
    let what = format!("list the operations of instance {zone}/{name}");
    let target = format!("{}/instances/{name}", zone_url(config, zone));
    let filter: String = url_encode(&format!("targetLink = \"{target}\""));
    let response = call(
        "GET",
        &format!("{}/operations?filter={filter}", zone_url(config, zone)),
        None,
    )?;
    if response.status != 200 {
        return Err(compute::api_error(&what, response.status, &response.body));
    }
    let page = parse(&what, &response)?;
    let operations = page["items"].as_array().cloned().unwrap_or_default();
    Ok(compute::recent_failed_insert(&operations, now_unix()))
}

/// Percent-encodes a query value (RFC 3986 unreserved characters kept).
fn url_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// The VM `name` in `zone`, `None` when it does not exist.
fn find(config: &Config, zone: &str, name: &str) -> Result<Option<Instance>, ProviderError> {
    let what = format!("get instance {zone}/{name}");
    let response = call(
        "GET",
        &format!("{}/instances/{name}", zone_url(config, zone)),
        None,
    )?;
    match response.status {
        200 => Ok(Some(compute::instance(zone, &parse(&what, &response)?))),
        404 => Ok(None),
        status => Err(compute::api_error(&what, status, &response.body)),
    }
}

impl Provider for GcpProvider {
    type Config = Config;

    fn info() -> PluginInfo {
        PluginInfo {
            name: PROVIDER_TYPE.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Compute Engine VMs through the REST API".into(),
            capabilities: vec![Capability::Log, Capability::Http],
            config_schema: config::SCHEMA.to_string(),
        }
    }

    fn validate(config: &Config) -> Result<(), ProviderError> {
        config::validate(config)
    }

    fn create(config: Config, spec: InstanceSpec) -> Result<Instance, ProviderError> {
        // The host ran validate-config on the config before binding it.
        let zone = match &spec.zone {
            Some(zone) if config.zones.contains(zone) => zone.clone(),
            Some(zone) => {
                return Err(ProviderError::Permanent(format!(
                    "spec.placement.zone {zone} is not one of this provider's zones ({}); pick one or add it to config.zones",
                    config.zones.join(", ")
                )));
            }
            None => config.zones[0].clone(),
        };
        if !config::is_gce_name(&spec.name, 63) {
            return Err(ProviderError::Permanent(format!(
                "instance name `{}` is not a Compute Engine name",
                spec.name
            )));
        }
        // By name, in every configured zone: a try that was cut off (a restart, a timeout) may
        // have inserted the VM where the config pointed then (see `compute::search_order`).
        for (i, searched) in compute::search_order(&config.zones, &zone)
            .into_iter()
            .enumerate()
        {
            match find(&config, searched, &spec.name) {
                Ok(Some(existing)) => return Ok(existing),
                Ok(None) => {}
                // The zone it inserts into answers as before: its error is this create's.
                Err(e) if i == 0 => return Err(e),
                Err(e) => return Err(compute::search_failed(searched, &spec.name, e)),
            }
        }
        // An insert that failed after Google accepted it answers for a minute, instead of a new
        // insert at every retry.
        if let Some(error) = failed_insert(&config, &zone, &spec.name)? {
            return Err(error);
        }
        let managed_squid =
            proxy_operator_sdk::squid::managed(config.managed_squid, &spec.options)?;
        let body = compute::insert_body(&config, &spec, &zone, managed_squid)?;
        let what = format!("insert instance {zone}/{}", spec.name);
        let response = call(
            "POST",
            &format!("{}/instances", zone_url(&config, &zone)),
            Some(&body),
        )?;
        match response.status {
            // The insert is an operation: the VM exists from now on, provisioning.
            200 => {}
            // Made by an earlier call whose answer was lost: it is ours by name.
            409 => {}
            status => return Err(compute::api_error(&what, status, &response.body)),
        }
        capabilities::log(
            Level::Info,
            "inserted instance",
            &[("zone", &zone), ("name", &spec.name)],
        );
        if let Some(made) = find(&config, &zone, &spec.name)? {
            return Ok(made);
        }
        if let Some(error) = failed_insert(&config, &zone, &spec.name)? {
            return Err(error);
        }
        Err(proxy_operator_sdk::transient(
            format!("{what}: accepted, but not visible yet"),
            Some(2000),
        ))
    }

    fn get(config: Config, provider_id: String) -> Result<Instance, ProviderError> {
        let (zone, name) = compute::parse_provider_id(&provider_id)?;
        find(&config, zone, name)?.ok_or_else(|| {
            ProviderError::NotFound(format!(
                "instance {name} not found in zone {zone} of project {}",
                config.project
            ))
        })
    }

    fn delete(config: Config, provider_id: String) -> Result<(), ProviderError> {
        let Ok((zone, name)) = compute::parse_provider_id(&provider_id) else {
            capabilities::log(
                Level::Warn,
                "delete: provider id is not <zone>/<name>; nothing to delete",
                &[("providerId", &provider_id)],
            );
            return Ok(());
        };
        // The id is the Proxy's status, which can be edited: delete only a VM this operator made.
        let what = format!("get instance {zone}/{name}");
        let url = format!("{}/instances/{name}", zone_url(&config, zone));
        let found = call("GET", &url, None)?;
        match found.status {
            200 => {
                if let Some(refusal) = compute::not_ours(&parse(&what, &found)?) {
                    return Err(ProviderError::NotFound(refusal));
                }
            }
            404 => return Ok(()),
            status => return Err(compute::api_error(&what, status, &found.body)),
        }
        let response = call("DELETE", &url, None)?;
        match response.status {
            200 | 404 => Ok(()),
            status => Err(compute::api_error(
                &format!("delete instance {zone}/{name}"),
                status,
                &response.body,
            )),
        }
    }

    fn list(config: Config) -> Result<Vec<Instance>, ProviderError> {
        let mut instances = Vec::new();
        for zone in &config.zones {
            let what = format!("list instances in {zone}");
            let first = format!(
                "{}/instances?filter=labels.{}%20%3D%20%22true%22",
                zone_url(&config, zone),
                compute::MANAGED_LABEL
            );
            let mut url = first.clone();
            let mut complete = false;
            // A zone with more VMs than one page answers `nextPageToken`: follow it.
            for _ in 0..MAX_LIST_PAGES {
                let response = call("GET", &url, None)?;
                if response.status != 200 {
                    return Err(compute::api_error(&what, response.status, &response.body));
                }
                let page = parse(&what, &response)?;
                instances.extend(
                    page["items"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|vm| compute::instance(zone, vm))
                        .filter(|i| i.owner.is_some()),
                );
                match page["nextPageToken"].as_str() {
                    Some(token) if !token.is_empty() => {
                        url = format!("{first}&pageToken={}", url_encode(token));
                    }
                    _ => {
                        complete = true;
                        break;
                    }
                }
            }
            // A part of the list would hide instances from the garbage collector: say so.
            if !complete {
                return Err(ProviderError::Permanent(format!(
                    "{what}: more than {MAX_LIST_PAGES} pages; the list is not complete"
                )));
            }
        }
        Ok(instances)
    }

    fn check(config: Config) -> Result<Vec<CheckTarget>, ProviderError> {
        let mut targets = Vec::new();
        for zone in &config.zones {
            let (ok, reason, message) = match call("GET", &zone_url(&config, zone), None) {
                Ok(r) if r.status == 200 => (true, "Ok".to_string(), String::new()),
                Ok(r) => {
                    let reason = match r.status {
                        401 => "Unauthorized",
                        403 => "Forbidden",
                        404 => "ZoneNotFound",
                        _ => "ApiError",
                    };
                    let error = compute::api_error(zone, r.status, &r.body);
                    (false, reason.to_string(), format!("{error:?}"))
                }
                Err(ProviderError::Denied(m)) => (false, "Forbidden".into(), m),
                Err(e) => (false, "Unreachable".into(), format!("{e:?}")),
            };
            targets.push(CheckTarget {
                target: format!("{}/{zone}", config.project),
                ok,
                reason,
                message,
                latency_ms: 0,
            });
        }
        Ok(targets)
    }
}

export_provider!(GcpProvider);
