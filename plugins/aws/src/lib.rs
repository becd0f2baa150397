//! The `aws` provider: a proxy is an EC2 instance, made through the EC2 Query API with the `http`
//! capability. The host signs every request with SigV4 (`grants.http.credentials` with
//! `valueFrom.awsCredentials`): this plugin never sees a key, a signature or a session token.
//!
//! The instance carries the Proxy's identity as tags (`proxy-operator-owner-*`), with
//! `proxy-operator-managed=true` for `list`; its name (derived by the operator from the Proxy
//! UID) is a tag and the `RunInstances` client token, so create is idempotent. cloud-init and the
//! managed squid's script are its user data. One security group per provider instance's rules
//! admits `allowFrom` on the proxy port, found again by its tag. Provider ids are instance ids.

pub mod config;
pub mod ec2;
pub mod query;

use proxy_operator_sdk::capabilities::{self, Level};
use proxy_operator_sdk::{
    Capability, CheckTarget, Instance, InstanceSpec, PluginInfo, Provider, ProviderError,
    export_provider,
};

use crate::config::Config;
use crate::ec2::Ec2Instance;
use crate::query::{Params, call};

pub const PROVIDER_TYPE: &str = "aws";

/// Most client tokens one create follows past terminated instances (see `create`).
const MAX_TOKEN_HOPS: usize = 5;

/// Most pages one `list` follows: a bound on a loop driven by the API's answers.
const MAX_LIST_PAGES: usize = 1000;

pub struct AwsProvider;

/// The live instances matching `params` (one page of at most `MaxResults` if set).
fn describe(
    config: &Config,
    params: &Params,
) -> Result<(Vec<Ec2Instance>, Option<String>), ProviderError> {
    ec2::instances(&call(&config.endpoint(), params)?)
}

/// The live instance made for `name` by an earlier try, if any.
fn find_by_name(config: &Config, name: &str) -> Result<Option<Ec2Instance>, ProviderError> {
    let mut params = Params::action("DescribeInstances");
    params
        .filter(&format!("tag:{}", ec2::NAME_TAG), &[name])
        .filter("instance-state-name", &ec2::LIVE_STATES);
    Ok(describe(config, &params)?
        .0
        .into_iter()
        .find(Ec2Instance::managed))
}

/// The instance `id`; `None` when EC2 does not know it.
fn find_by_id(config: &Config, id: &str) -> Result<Option<Ec2Instance>, ProviderError> {
    let mut params = Params::action("DescribeInstances");
    params.set("InstanceId.1", id);
    match describe(config, &params) {
        Ok((found, _)) => Ok(found.into_iter().find(|i| i.id == id)),
        Err(ProviderError::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The id of the security group for proxies on `port`, made (and its one ingress rule added)
/// the first time. The key tag goes on last, so a group found by it has its rule.
fn security_group(config: &Config, port: u16) -> Result<String, ProviderError> {
    let key = ec2::security_group_key(config, port);
    let endpoint = config.endpoint();
    let mut find = Params::action("DescribeSecurityGroups");
    find.filter(&format!("tag:{}", ec2::SECURITY_GROUP_TAG), &[&key]);
    if let Some(id) = ec2::group_id(&call(&endpoint, &find)?) {
        return Ok(id);
    }
    let id = match call(&endpoint, &ec2::create_security_group(config, &key, port)) {
        Ok(xml) => ec2::group_id(&xml),
        // Made by a try cut off before it tagged the group: the same name, so the same rules.
        Err(ProviderError::Permanent(m)) if m.contains("InvalidGroup.Duplicate") => {
            let mut by_name = Params::action("DescribeSecurityGroups");
            by_name.filter("group-name", &[&format!("proxy-operator-{key}")]);
            if let Some(vpc) = &config.vpc_id {
                by_name.filter("vpc-id", &[vpc]);
            }
            ec2::group_id(&call(&endpoint, &by_name)?)
        }
        Err(e) => return Err(e),
    }
    .ok_or_else(|| {
        ProviderError::Permanent("CreateSecurityGroup: the answer has no groupId".into())
    })?;
    match call(&endpoint, &ec2::authorize_ingress(config, &id, port)) {
        Ok(_) => {}
        Err(ProviderError::Permanent(m)) if m.contains("InvalidPermission.Duplicate") => {}
        Err(e) => return Err(e),
    }
    let mut tag = Params::action("CreateTags");
    tag.set("ResourceId.1", &id)
        .set("Tag.1.Key", ec2::SECURITY_GROUP_TAG)
        .set("Tag.1.Value", &key);
    call(&endpoint, &tag)?;
    capabilities::log(
        Level::Info,
        "made the proxies' security group",
        &[("groupId", &id), ("port", &port.to_string())],
    );
    Ok(id)
}

/// The zone `spec` goes to: its own (one of `config.zones` when that lists any), else the first
/// configured, else none (AWS picks).
fn zone_of<'a>(
    config: &'a Config,
    spec: &'a InstanceSpec,
) -> Result<Option<&'a str>, ProviderError> {
    match &spec.zone {
        Some(zone) if config.zones.is_empty() || config.zones.contains(zone) => Ok(Some(zone)),
        Some(zone) => Err(ProviderError::Permanent(format!(
            "spec.placement.zone {zone} is not one of this provider's zones ({}); pick one or add it to config.zones",
            config.zones.join(", ")
        ))),
        None => Ok(config.zones.first().map(String::as_str)),
    }
}

/// What `check` asks: the region's zones (any key that may call EC2 may ask it).
fn zones_request() -> Params {
    Params::action("DescribeAvailabilityZones")
}

impl Provider for AwsProvider {
    type Config = Config;

    fn info() -> PluginInfo {
        PluginInfo {
            name: PROVIDER_TYPE.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "EC2 instances through the EC2 Query API".into(),
            capabilities: vec![Capability::Log, Capability::Http],
            config_schema: config::SCHEMA.to_string(),
        }
    }

    fn validate(config: &Config) -> Result<(), ProviderError> {
        config::validate(config)
    }

    fn create(config: Config, spec: InstanceSpec) -> Result<Instance, ProviderError> {
        let zone = zone_of(&config, &spec)?;
        if spec.name.is_empty() || spec.name.len() > 40 || !spec.name.is_ascii() {
            return Err(ProviderError::Permanent(format!(
                "instance name `{}` must be 1-40 ASCII characters (it makes the RunInstances client token)",
                spec.name
            )));
        }
        // An earlier try (a restart, a lost answer) may have made it: that one is the answer.
        if let Some(existing) = find_by_name(&config, &spec.name)? {
            return Ok(existing.instance());
        }
        let managed_squid =
            proxy_operator_sdk::squid::managed(config.managed_squid, &spec.options)?;
        let user_data = ec2::user_data(&config, &spec, managed_squid)?;
        let group = security_group(&config, spec.port)?;
        let mut token = spec.name.clone();
        for _ in 0..MAX_TOKEN_HOPS {
            let params = ec2::run_instances(&config, &spec, zone, &group, &user_data, &token);
            let (made, _) = ec2::instances(&call(&config.endpoint(), &params)?)?;
            let made = made.into_iter().next().ok_or_else(|| {
                ProviderError::Permanent("RunInstances: the answer lists no instance".into())
            })?;
            if !made.gone() {
                capabilities::log(
                    Level::Info,
                    "ran instance",
                    &[("instanceId", &made.id), ("name", &spec.name)],
                );
                return Ok(made.instance());
            }
            // EC2 answers a client token with its instance for 24 h after that instance is
            // terminated (a Proxy recreated after a loss): the next token is derived from the
            // gone instance, so a retry of this very create uses the same one again.
            token = ec2::next_client_token(&spec.name, &made.id);
        }
        Err(proxy_operator_sdk::transient(
            format!(
                "RunInstances answered {MAX_TOKEN_HOPS} terminated instances for {}; trying again later",
                spec.name
            ),
            Some(60_000),
        ))
    }

    fn get(config: Config, provider_id: String) -> Result<Instance, ProviderError> {
        match find_by_id(&config, &provider_id)? {
            Some(found) if found.gone() => Err(ProviderError::NotFound(ec2::gone_reason(&found))),
            Some(found) => Ok(found.instance()),
            None => Err(ProviderError::NotFound(format!(
                "instance {provider_id} not found in {}",
                config.region
            ))),
        }
    }

    fn delete(config: Config, provider_id: String) -> Result<(), ProviderError> {
        if !config::is_resource_id(&provider_id, "i") {
            capabilities::log(
                Level::Warn,
                "delete: provider id is not an instance id; nothing to delete",
                &[("providerId", &provider_id)],
            );
            return Ok(());
        }
        // The id is the Proxy's status, which can be edited: terminate only what this made.
        match find_by_id(&config, &provider_id)? {
            None => return Ok(()),
            Some(found) if found.gone() => return Ok(()),
            Some(found) if !found.managed() => {
                return Err(ProviderError::NotFound(format!(
                    "instance {provider_id} has no tag {}=true: proxy-operator did not make it, so it is not terminated",
                    ec2::MANAGED_TAG
                )));
            }
            Some(_) => {}
        }
        let mut params = Params::action("TerminateInstances");
        params.set("InstanceId.1", &provider_id);
        match call(&config.endpoint(), &params) {
            Ok(_) | Err(ProviderError::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn list(config: Config) -> Result<Vec<Instance>, ProviderError> {
        let mut first = Params::action("DescribeInstances");
        first
            .filter(&format!("tag:{}", ec2::MANAGED_TAG), &["true"])
            .filter("tag-key", &[ec2::OWNER_UID_TAG])
            .filter("instance-state-name", &ec2::LIVE_STATES)
            .set("MaxResults", config.list_page_size.to_string());
        let mut params = first.clone();
        let mut listed = Vec::new();
        for _ in 0..MAX_LIST_PAGES {
            let (page, next) = describe(&config, &params)?;
            listed.extend(
                page.iter()
                    .filter(|i| i.managed() && !i.gone())
                    .map(Ec2Instance::instance)
                    .filter(|i| i.owner.is_some()),
            );
            let Some(token) = next else {
                return Ok(listed);
            };
            params = first.clone();
            params.set("NextToken", token);
        }
        // A part of the list would hide instances from the garbage collector: say so.
        Err(ProviderError::Permanent(format!(
            "DescribeInstances: more than {MAX_LIST_PAGES} pages; the list is not complete"
        )))
    }

    fn check(config: Config) -> Result<Vec<CheckTarget>, ProviderError> {
        let (ok, reason, message) = match call(&config.endpoint(), &zones_request()) {
            Ok(xml) => {
                let missing: Vec<&String> = config
                    .zones
                    .iter()
                    .filter(|z| !xml.contains(&format!("<zoneName>{z}</zoneName>")))
                    .collect();
                if missing.is_empty() {
                    (true, "Ok".to_string(), String::new())
                } else {
                    let zones: Vec<&str> = missing.iter().map(|z| z.as_str()).collect();
                    let message = format!("zones not in {}: {}", config.region, zones.join(", "));
                    (false, "ZoneNotFound".to_string(), message)
                }
            }
            Err(ProviderError::Unauthorized(m)) => (false, "Unauthorized".into(), m),
            Err(ProviderError::Denied(m)) => (false, "Forbidden".into(), m),
            Err(ProviderError::Quota(m)) => (false, "QuotaExceeded".into(), m),
            Err(ProviderError::Transient(t)) => (false, "Unreachable".into(), t.message),
            Err(e) => (false, "ApiError".into(), format!("{e:?}")),
        };
        Ok(vec![CheckTarget {
            target: config.region.clone(),
            ok,
            reason,
            message,
            latency_ms: 0,
        }])
    }
}

export_provider!(AwsProvider);
