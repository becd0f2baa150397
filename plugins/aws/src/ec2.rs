//! EC2 shapes: the `RunInstances` parameters of a proxy instance, the security group that
//! admits `allowFrom` on the proxy port, and instances read back from EC2's XML. Plain functions,
//! tested natively.

use proxy_operator_sdk::cloudinit;
use proxy_operator_sdk::squid;
use proxy_operator_sdk::{Instance, InstanceSpec, InstanceState, Owner, ProviderError};

use crate::config::Config;
use crate::query::Params;

/// On every instance: what `list` filters on, and what `delete` checks before terminating.
pub const MANAGED_TAG: &str = "proxy-operator-managed";
/// The instance's name (from the Proxy UID): how a retried create finds an earlier try's.
pub const NAME_TAG: &str = "proxy-operator-name";
pub const OWNER_NAMESPACE_TAG: &str = "proxy-operator-owner-namespace";
pub const OWNER_NAME_TAG: &str = "proxy-operator-owner-name";
pub const OWNER_UID_TAG: &str = "proxy-operator-owner-uid";
pub const OPERATOR_ID_TAG: &str = "proxy-operator-operator-id";
pub const PORT_TAG: &str = "proxy-operator-port";
/// On the security group: the key of its rules, so it is found again.
pub const SECURITY_GROUP_TAG: &str = "proxy-operator-security-group";

/// EC2's limit on user data (before base64).
pub const MAX_USER_DATA: usize = 16 * 1024;

/// The states an instance is listed and found in; `terminated` and `shutting-down` are gone.
pub const LIVE_STATES: [&str; 4] = ["pending", "running", "stopping", "stopped"];

/// The key of the security group for proxies on `port` admitting `allow_from`: one group per
/// provider instance's rules, shared by its Proxies on that port.
pub fn security_group_key(config: &Config, port: u16) -> String {
    let mut ranges = config.allow_from.clone();
    ranges.sort();
    let text = format!(
        "{}|{}|{port}|{}",
        config.region,
        config.vpc_id.as_deref().unwrap_or("default"),
        ranges.join(",")
    );
    format!("{:016x}", proxy_operator_sdk::hash::fnv1a(text.as_bytes()))
}

/// `CreateSecurityGroup` of the group keyed `key`.
pub fn create_security_group(config: &Config, key: &str, port: u16) -> Params {
    let mut params = Params::action("CreateSecurityGroup");
    params
        .set("GroupName", format!("proxy-operator-{key}"))
        .set(
            "GroupDescription",
            format!("proxy-operator proxies: port {port} from allowFrom"),
        )
        .set("TagSpecification.1.ResourceType", "security-group")
        .set("TagSpecification.1.Tag.1.Key", SECURITY_GROUP_TAG)
        .set("TagSpecification.1.Tag.1.Value", key)
        .set("TagSpecification.1.Tag.2.Key", MANAGED_TAG)
        .set("TagSpecification.1.Tag.2.Value", "true");
    if let Some(vpc) = &config.vpc_id {
        params.set("VpcId", vpc);
    }
    params
}

/// `AuthorizeSecurityGroupIngress`: TCP `port` from each `allowFrom` range, nothing else.
pub fn authorize_ingress(config: &Config, group_id: &str, port: u16) -> Params {
    let mut params = Params::action("AuthorizeSecurityGroupIngress");
    params
        .set("GroupId", group_id)
        .set("IpPermissions.1.IpProtocol", "tcp")
        .set("IpPermissions.1.FromPort", port.to_string())
        .set("IpPermissions.1.ToPort", port.to_string());
    let (mut v4, mut v6) = (0, 0);
    for range in &config.allow_from {
        if range.contains(':') {
            v6 += 1;
            params.set(format!("IpPermissions.1.Ipv6Ranges.{v6}.CidrIpv6"), range);
        } else {
            v4 += 1;
            params.set(format!("IpPermissions.1.IpRanges.{v4}.CidrIp"), range);
        }
    }
    params
}

/// The user data of a proxy instance: the user's cloud-init, the vendor-data the host adds, and
/// (with the managed squid) its setup script, as one MIME multipart when there are several.
pub fn user_data(
    config: &Config,
    spec: &InstanceSpec,
    managed_squid: bool,
) -> Result<Vec<u8>, ProviderError> {
    let script = if managed_squid {
        squid::vm_setup(&config.squid(), spec, spec.port, &[])?
    } else {
        String::new()
    };
    let data = cloudinit::combine(&[&spec.user_data, &spec.vendor_data, script.as_bytes()])
        .unwrap_or_default();
    if data.len() > MAX_USER_DATA {
        return Err(ProviderError::Permanent(format!(
            "the instance's user data is {} bytes, over EC2's {MAX_USER_DATA}; shorten spec.cloudInit",
            data.len()
        )));
    }
    Ok(data)
}

/// The `RunInstances` parameters of the proxy instance `spec` in `zone` (none: AWS picks).
pub fn run_instances(
    config: &Config,
    spec: &InstanceSpec,
    zone: Option<&str>,
    group_id: &str,
    user_data: &[u8],
    client_token: &str,
) -> Params {
    let mut params = Params::action("RunInstances");
    params
        .set("ImageId", spec.image.as_deref().unwrap_or(config.ami()))
        .set(
            "InstanceType",
            spec.machine_type
                .as_deref()
                .unwrap_or(&config.instance_type),
        )
        .set("MinCount", "1")
        .set("MaxCount", "1")
        // Idempotency: a retried RunInstances with the same token makes no second instance.
        .set("ClientToken", client_token)
        .set("SecurityGroupId.1", group_id);
    if !user_data.is_empty() {
        params.set(
            "UserData",
            cloudinit::base64_lines(user_data).replace('\n', ""),
        );
    }
    if let Some(zone) = zone {
        params.set("Placement.AvailabilityZone", zone);
    }
    if let Some(subnet) = &config.subnet_id {
        params.set("SubnetId", subnet);
    }
    if let Some(key) = &config.key_name {
        params.set("KeyName", key);
    }
    if config.spot {
        params
            .set("InstanceMarketOptions.MarketType", "spot")
            .set(
                "InstanceMarketOptions.SpotOptions.SpotInstanceType",
                "one-time",
            )
            .set(
                "InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior",
                "terminate",
            );
        if let Some(price) = &config.spot_max_price {
            params.set("InstanceMarketOptions.SpotOptions.MaxPrice", price);
        }
    }
    let mut tags: Vec<(String, String)> = vec![
        ("Name".into(), spec.name.clone()),
        (MANAGED_TAG.into(), "true".into()),
        (NAME_TAG.into(), spec.name.clone()),
        (OWNER_NAMESPACE_TAG.into(), spec.owner.namespace.clone()),
        (OWNER_NAME_TAG.into(), spec.owner.name.clone()),
        (OWNER_UID_TAG.into(), spec.owner.uid.clone()),
        (OPERATOR_ID_TAG.into(), spec.owner.operator_id.clone()),
        (PORT_TAG.into(), spec.port.to_string()),
    ];
    // The Proxy's labels, as far as EC2 takes them (no `aws:` keys, 128/256 characters).
    for (key, value) in &spec.labels {
        if !key.starts_with("aws:")
            && !tags.iter().any(|(k, _)| k == key)
            && key.len() <= 128
            && value.len() <= 256
        {
            tags.push((key.clone(), value.clone()));
        }
    }
    params.set("TagSpecification.1.ResourceType", "instance");
    for (i, (key, value)) in tags.iter().enumerate() {
        params
            .set(format!("TagSpecification.1.Tag.{}.Key", i + 1), key)
            .set(format!("TagSpecification.1.Tag.{}.Value", i + 1), value);
    }
    params
}

/// The client token after `gone` (the terminated instance the last token answered with): at
/// most 40 + 1 + 19 of EC2's 64 characters.
pub fn next_client_token(name: &str, gone: &str) -> String {
    format!("{name}-{gone}")
}

/// The text of the child `name` of `node`.
fn child_text(node: roxmltree::Node, name: &str) -> Option<String> {
    node.children()
        .find(|n| n.has_tag_name(name))
        .and_then(|n| n.text())
        .map(|t| t.trim().to_string())
}

fn child<'a, 'i>(node: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    node.children().find(|n| n.has_tag_name(name))
}

/// One instance as EC2 describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Ec2Instance {
    pub id: String,
    pub state: String,
    pub state_reason: Option<String>,
    pub tags: Vec<(String, String)>,
    pub public_ip: Option<String>,
    pub private_ip: Option<String>,
    pub zone: Option<String>,
    pub launch_time: Option<String>,
    pub spot: bool,
}

impl Ec2Instance {
    pub fn tag(&self, key: &str) -> Option<&str> {
        self.tags
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn managed(&self) -> bool {
        self.tag(MANAGED_TAG) == Some("true")
    }

    /// Gone: terminated or on its way there (a spot interruption ends here too).
    pub fn gone(&self) -> bool {
        matches!(self.state.as_str(), "terminated" | "shutting-down")
    }

    /// The instance as the operator sees it; the address only once it runs.
    pub fn instance(&self) -> Instance {
        let state = match self.state.as_str() {
            "pending" => InstanceState::Provisioning,
            "running" => InstanceState::Running,
            "stopping" | "shutting-down" => InstanceState::Stopping,
            "stopped" | "terminated" => InstanceState::Stopped,
            _ => InstanceState::Unknown,
        };
        let owner = (|| {
            Some(Owner {
                namespace: self.tag(OWNER_NAMESPACE_TAG)?.into(),
                name: self.tag(OWNER_NAME_TAG)?.into(),
                uid: self.tag(OWNER_UID_TAG)?.into(),
                operator_id: self.tag(OPERATOR_ID_TAG)?.into(),
            })
        })();
        let address = (state == InstanceState::Running)
            .then(|| self.public_ip.clone().or_else(|| self.private_ip.clone()))
            .flatten();
        Instance {
            provider_id: self.id.clone(),
            name: self
                .tag(NAME_TAG)
                .map(str::to_string)
                .unwrap_or_else(|| self.id.clone()),
            state,
            address,
            port: self
                .tag(PORT_TAG)
                .and_then(|p| p.parse().ok())
                .unwrap_or(3128),
            zone: self.zone.clone(),
            created_at: self
                .launch_time
                .as_deref()
                .and_then(proxy_operator_sdk::time::unix_seconds),
            owner,
            message: self.state_reason.clone(),
        }
    }
}

/// Every instance in an answer of `RunInstances` or `DescribeInstances` (the `item`s of each
/// `instancesSet`), and the answer's `nextToken`.
pub fn instances(xml: &str) -> Result<(Vec<Ec2Instance>, Option<String>), ProviderError> {
    let document = roxmltree::Document::parse(xml).map_err(|e| {
        ProviderError::Permanent(format!("EC2 answered XML that does not parse: {e}"))
    })?;
    let root = document.root_element();
    let next = child_text(root, "nextToken").filter(|t| !t.is_empty());
    let found = document
        .descendants()
        .filter(|n| {
            n.has_tag_name("item") && n.parent().is_some_and(|p| p.has_tag_name("instancesSet"))
        })
        .map(|item| {
            let tags = child(item, "tagSet")
                .into_iter()
                .flat_map(|set| set.children().filter(|n| n.has_tag_name("item")))
                .filter_map(|tag| {
                    Some((
                        child_text(tag, "key")?,
                        child_text(tag, "value").unwrap_or_default(),
                    ))
                })
                .collect();
            let state_reason = child(item, "stateReason").and_then(|r| {
                let code = child_text(r, "code").filter(|c| !c.is_empty())?;
                Some(format!(
                    "{code}: {}",
                    child_text(r, "message").unwrap_or_default()
                ))
            });
            let public_ip = child_text(item, "ipAddress").or_else(|| {
                item.descendants()
                    .find(|n| n.has_tag_name("association"))
                    .and_then(|a| child_text(a, "publicIp"))
            });
            Ec2Instance {
                id: child_text(item, "instanceId").unwrap_or_default(),
                state: child(item, "instanceState")
                    .and_then(|s| child_text(s, "name"))
                    .unwrap_or_default(),
                state_reason,
                tags,
                public_ip,
                private_ip: child_text(item, "privateIpAddress"),
                zone: child(item, "placement").and_then(|p| child_text(p, "availabilityZone")),
                launch_time: child_text(item, "launchTime"),
                spot: child_text(item, "instanceLifecycle").as_deref() == Some("spot"),
            }
        })
        .collect();
    Ok((found, next))
}

/// The id of the first security group in a `DescribeSecurityGroups` answer (or the `groupId` of
/// a `CreateSecurityGroup` one).
pub fn group_id(xml: &str) -> Option<String> {
    let document = roxmltree::Document::parse(xml).ok()?;
    document
        .descendants()
        .find(|n| n.has_tag_name("groupId"))
        .and_then(|n| n.text())
        .map(|t| t.trim().to_string())
}

/// Why `gone` is a lost instance: AWS's state reason, named as an interruption for spot.
pub fn gone_reason(instance: &Ec2Instance) -> String {
    let reason = instance
        .state_reason
        .clone()
        .unwrap_or_else(|| "no reason given".into());
    if instance.spot || reason.contains("Spot") {
        format!(
            "spot instance {} was interrupted ({}): {reason}",
            instance.id, instance.state
        )
    } else {
        format!("instance {} is {}: {reason}", instance.id, instance.state)
    }
}

#[cfg(test)]
mod tests;
