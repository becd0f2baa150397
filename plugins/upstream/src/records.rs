//! Which upstream went to which Proxy: one ConfigMap per instance (named by `spec.name`), kept
//! through the host's `kube` capability, since a plugin is stateless. The host labels the
//! ConfigMaps with the provider instance and shows this plugin only those. Pure: building,
//! reading and choosing; `lib.rs` makes the calls.

use proxy_operator_sdk::{Instance, InstanceSpec, InstanceState, Owner, ProviderError};
use serde_json::{Value, json};

use crate::config::{Config, Upstream};

/// The record's label: which ConfigMaps of the namespace are this plugin's records.
pub const RECORD_LABEL: &str = "plugin.proxy-operator.dev/upstream-record";
pub const RECORD_SELECTOR: &str = "plugin.proxy-operator.dev/upstream-record=true";

/// Where a record's upstream came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `config.upstreams`: held by one Proxy at a time.
    Config,
    /// The Proxy's `providerOptions.url`: its own, whoever else names it.
    ProviderOptions,
}

impl Source {
    fn as_str(self) -> &'static str {
        match self {
            Source::Config => "config",
            Source::ProviderOptions => "providerOptions",
        }
    }
}

/// A record, as read back.
#[derive(Debug, Clone)]
pub struct Record {
    pub name: String,
    pub url: String,
    pub source: Source,
    /// The upstream's zone.
    pub zone: Option<String>,
    /// The zone the Proxy asked for (to pick again in it).
    pub asked_zone: Option<String>,
    pub owner: Option<Owner>,
    /// A listed upstream's record is checked once after it is written: no other Proxy took the
    /// same upstream at the same moment.
    pub verified: bool,
}

impl Record {
    /// A new record of `spec.name` holding `upstream`.
    pub fn new(
        spec: &InstanceSpec,
        upstream: &Upstream,
        source: Source,
        zone: Option<&str>,
    ) -> Record {
        Record {
            name: spec.name.clone(),
            url: upstream.url(),
            source,
            zone: zone.map(str::to_string),
            asked_zone: spec.zone.clone(),
            owner: Some(spec.owner.clone()),
            // A Proxy's own URL is its own whoever else names it: nothing to check.
            verified: source == Source::ProviderOptions,
        }
    }

    /// The ConfigMap that keeps it.
    pub fn object(&self) -> Value {
        let mut data = json!({"url": self.url, "source": self.source.as_str()});
        let mut put = |key: &str, value: Option<&str>| {
            if let Some(value) = value {
                data[key] = json!(value);
            }
        };
        put("zone", self.zone.as_deref());
        put("askedZone", self.asked_zone.as_deref());
        put("verified", self.verified.then_some("true"));
        if let Some(owner) = &self.owner {
            put("ownerNamespace", Some(&owner.namespace));
            put("ownerName", Some(&owner.name));
            put("ownerUid", Some(&owner.uid));
            put("operatorId", Some(&owner.operator_id));
        }
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": self.name, "labels": {RECORD_LABEL: "true"}},
            "data": data,
        })
    }
}

/// A record from its ConfigMap; `None` for a ConfigMap that is not a readable record.
pub fn record_of(object: &Value) -> Option<Record> {
    let data = &object["data"];
    let text = |key: &str| data[key].as_str().map(str::to_string);
    let source = match data["source"].as_str()? {
        "config" => Source::Config,
        "providerOptions" => Source::ProviderOptions,
        _ => return None,
    };
    let owner = match (
        text("ownerNamespace"),
        text("ownerName"),
        text("ownerUid"),
        text("operatorId"),
    ) {
        (Some(namespace), Some(name), Some(uid), Some(operator_id)) => Some(Owner {
            namespace,
            name,
            uid,
            operator_id,
        }),
        _ => None,
    };
    Some(Record {
        name: object["metadata"]["name"].as_str()?.to_string(),
        url: text("url")?,
        source,
        zone: text("zone"),
        asked_zone: text("askedZone"),
        owner,
        verified: data["verified"] == "true",
    })
}

/// What a look at a record finds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Look {
    /// The upstream is this record's: running as far as the provider knows (the operator's
    /// health probe says whether it answers).
    Running,
    /// Written, not yet checked against the others: mark it checked.
    Verify,
    /// Another record of the same listed upstream sorts first and keeps it (every look sees the
    /// same answer, so exactly one gives it up): take another upstream.
    Move { kept_by: String },
}

/// What to do about `record`, seeing every record (`all`, which may include it).
pub fn look(record: &Record, all: &[Record]) -> Look {
    if record.source != Source::Config {
        return Look::Running;
    }
    let first = all
        .iter()
        .filter(|o| o.source == Source::Config && o.url == record.url && o.name < record.name)
        .map(|o| o.name.as_str())
        .min();
    match (first, record.verified) {
        (Some(first), _) => Look::Move {
            kept_by: first.to_string(),
        },
        (None, false) => Look::Verify,
        (None, true) => Look::Running,
    }
}

/// The instance a record stands for, in `state`.
pub fn instance_of(
    record: &Record,
    state: InstanceState,
    message: String,
) -> Result<Instance, ProviderError> {
    let upstream = Upstream::parse(&record.url).map_err(|problem| {
        ProviderError::Permanent(format!(
            "the record {} holds a bad url: {problem}",
            record.name
        ))
    })?;
    Ok(Instance {
        provider_id: record.name.clone(),
        name: record.name.clone(),
        state,
        address: Some(upstream.host),
        port: upstream.port,
        zone: record.zone.clone(),
        created_at: None,
        owner: record.owner.clone(),
        message: Some(message),
    })
}

/// The upstream of `config.upstreams` a new instance gets: the first no record holds, in the
/// zone asked for (any zone when none is). The error says why none can be had.
pub fn pick<'a>(
    config: &'a Config,
    records: &[Record],
    zone: Option<&str>,
) -> Result<(Upstream, Option<&'a str>), ProviderError> {
    if config.upstreams.is_empty() {
        return Err(ProviderError::Permanent(
            "spec.providerOptions.url is not set and config.upstreams is empty: give the Proxy providerOptions: {url: http://HOST:PORT}, or list upstreams in the provider's config".into(),
        ));
    }
    let mut in_zone = 0;
    for entry in &config.upstreams {
        if zone.is_some() && entry.zone.as_deref() != zone {
            continue;
        }
        in_zone += 1;
        let upstream = Upstream::parse(&entry.url).map_err(|problem| {
            ProviderError::InvalidConfig(format!("config.upstreams: {problem}"))
        })?;
        let url = upstream.url();
        let held = records
            .iter()
            .any(|r| r.source == Source::Config && r.url == url);
        if !held {
            return Ok((upstream, entry.zone.as_deref()));
        }
    }
    let within = zone.map(|z| format!(" in zone {z}")).unwrap_or_default();
    if in_zone == 0 {
        return Err(ProviderError::Permanent(format!(
            "spec.placement.zone: no upstream of config.upstreams is{within}; use one of the zones listed there"
        )));
    }
    Err(ProviderError::Quota(format!(
        "all {in_zone} upstreams of config.upstreams{within} are held by other Proxies; list more upstreams or delete a Proxy"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::UpstreamEntry;

    fn spec(name: &str) -> InstanceSpec {
        InstanceSpec {
            name: name.into(),
            owner: Owner {
                namespace: "crawlers".into(),
                name: format!("proxy-{name}"),
                uid: format!("uid-{name}"),
                operator_id: "proxy-operator".into(),
            },
            zone: None,
            image: None,
            machine_type: None,
            user_data: vec![],
            vendor_data: vec![],
            install_guest_agent: false,
            port: 3128,
            labels: vec![],
            options: "{}".into(),
            credentials: None,
        }
    }

    fn config(entries: &[(&str, Option<&str>)]) -> Config {
        Config {
            upstreams: entries
                .iter()
                .map(|(url, zone)| UpstreamEntry {
                    url: url.to_string(),
                    zone: zone.map(str::to_string),
                })
                .collect(),
        }
    }

    fn held(name: &str, url: &str, source: Source) -> Record {
        let upstream = Upstream::parse(url).unwrap();
        record_of(&Record::new(&spec(name), &upstream, source, None).object()).unwrap()
    }

    #[test]
    fn a_record_reads_back_as_the_instance_with_its_owner() {
        let upstream = Upstream::parse("http://[fd00::7]:8000").unwrap();
        let mut asked = spec("px-1");
        asked.zone = Some("eu".into());
        let object = Record::new(&asked, &upstream, Source::Config, Some("eu")).object();
        let record = record_of(&object).unwrap();
        assert_eq!(record.asked_zone.as_deref(), Some("eu"));
        assert!(!record.verified);
        let instance = instance_of(&record, InstanceState::Running, String::new()).unwrap();
        assert_eq!(instance.provider_id, "px-1");
        assert_eq!(instance.address.as_deref(), Some("fd00::7"));
        assert_eq!(instance.port, 8000);
        assert_eq!(instance.zone.as_deref(), Some("eu"));
        assert_eq!(instance.owner.unwrap().uid, "uid-px-1");
        assert_eq!(object["metadata"]["labels"][RECORD_LABEL], "true");
        assert!(record_of(&json!({"data": {}})).is_none());
        let verified = Record {
            verified: true,
            ..record
        };
        assert!(record_of(&verified.object()).unwrap().verified);
    }

    #[test]
    fn the_first_free_upstream_is_picked_in_the_zone_asked_for() {
        let cfg = config(&[
            ("http://a:1", Some("eu")),
            ("http://b:1", Some("us")),
            ("http://c:1", Some("eu")),
        ]);
        let url = |r: Result<(Upstream, Option<&str>), ProviderError>| r.unwrap().0.url();
        assert_eq!(url(pick(&cfg, &[], None)), "http://a:1");
        let a = held("px-a", "http://a:1", Source::Config);
        assert_eq!(
            url(pick(&cfg, std::slice::from_ref(&a), None)),
            "http://b:1"
        );
        assert_eq!(
            url(pick(&cfg, std::slice::from_ref(&a), Some("eu"))),
            "http://c:1"
        );
        // A Proxy's own URL holds nothing of the list.
        let own = held("px-o", "http://a:1", Source::ProviderOptions);
        assert_eq!(url(pick(&cfg, &[own], None)), "http://a:1");
        let c = held("px-c", "http://c:1", Source::Config);
        assert!(
            matches!(pick(&cfg, &[a.clone(), c], Some("eu")), Err(ProviderError::Quota(m)) if m.contains("all 2 upstreams") && m.contains("zone eu"))
        );
        assert!(
            matches!(pick(&cfg, &[], Some("ap")), Err(ProviderError::Permanent(m)) if m.starts_with("spec.placement.zone:"))
        );
        assert!(
            matches!(pick(&config(&[]), &[], None), Err(ProviderError::Permanent(m)) if m.contains("providerOptions"))
        );
    }

    #[test]
    fn a_listed_upstream_is_verified_once_and_of_two_holders_the_first_name_keeps_it() {
        let first = held("px-a", "http://a:1", Source::Config);
        let second = held("px-b", "http://a:1", Source::Config);
        let all = [first.clone(), second.clone()];
        assert_eq!(look(&first, &all), Look::Verify);
        let checked = Record {
            verified: true,
            ..first.clone()
        };
        assert_eq!(look(&checked, &all), Look::Running);
        // Verified or not, the later name gives the upstream up.
        let moved = Look::Move {
            kept_by: "px-a".into(),
        };
        assert_eq!(look(&second, &all), moved);
        let second_checked = Record {
            verified: true,
            ..second
        };
        assert_eq!(look(&second_checked, &all), moved);
        // Proxies naming the same URL themselves share it.
        let own = [
            held("px-a", "http://a:1", Source::ProviderOptions),
            held("px-b", "http://a:1", Source::ProviderOptions),
        ];
        assert!(own[1].verified);
        assert_eq!(look(&own[1], &own), Look::Running);
    }
}
