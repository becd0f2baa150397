use super::*;
use proxy_operator_sdk::{Owner, ProxyCredentials};

fn config() -> Config {
    serde_json::from_value(serde_json::json!({
        "region": "eu-west-1",
        "amis": {"eu-west-1": "ami-12c6146b"},
        "allowFrom": ["203.0.113.0/24", "2001:db8::/32"],
    }))
    .unwrap()
}

fn spec() -> InstanceSpec {
    InstanceSpec {
        name: "px-1".into(),
        owner: Owner {
            namespace: "crawlers".into(),
            name: "egress-1".into(),
            uid: "u-1".into(),
            operator_id: "proxy-operator".into(),
        },
        zone: None,
        image: None,
        machine_type: None,
        user_data: b"#cloud-config\n".to_vec(),
        vendor_data: Vec::new(),
        install_guest_agent: false,
        port: 3128,
        labels: vec![("team".into(), "web".into()), ("aws:x".into(), "no".into())],
        options: "{}".into(),
        credentials: Some(ProxyCredentials {
            username: "px-1".into(),
            password_hash: "$6$salt$hash".into(),
        }),
    }
}

#[test]
fn run_instances_carries_the_image_type_tags_token_and_spot_options() {
    let mut config = config();
    config.spot = true;
    let data = user_data(&config, &spec(), true).unwrap();
    let params = run_instances(&config, &spec(), Some("eu-west-1b"), "sg-1", &data, "px-1");
    assert_eq!(params.get("ImageId"), Some("ami-12c6146b"));
    assert_eq!(params.get("InstanceType"), Some("t3.micro"));
    assert_eq!(params.get("ClientToken"), Some("px-1"));
    assert_eq!(params.get("Placement.AvailabilityZone"), Some("eu-west-1b"));
    assert_eq!(params.get("InstanceMarketOptions.MarketType"), Some("spot"));
    let tags: Vec<(&str, &str)> = (1..20)
        .filter_map(|i| {
            Some((
                params.get(&format!("TagSpecification.1.Tag.{i}.Key"))?,
                params.get(&format!("TagSpecification.1.Tag.{i}.Value"))?,
            ))
        })
        .collect();
    assert!(tags.contains(&(MANAGED_TAG, "true")));
    assert!(tags.contains(&(OWNER_UID_TAG, "u-1")));
    assert!(tags.contains(&(OPERATOR_ID_TAG, "proxy-operator")));
    assert!(tags.contains(&("team", "web")));
    assert!(!tags.iter().any(|(k, _)| k.starts_with("aws:")));
    // The user's cloud-config and the managed squid's script, one multipart.
    let text = String::from_utf8(data).unwrap();
    assert!(text.starts_with("Content-Type: multipart/mixed"), "{text}");
    assert!(text.contains("#cloud-config\n"));
    assert!(text.contains("http_port 3128"), "{text}");
    assert!(text.contains("basic_ncsa_auth"));
}

#[test]
fn the_security_group_admits_allow_from_on_the_port_only() {
    let params = authorize_ingress(&config(), "sg-1", 3128);
    assert_eq!(params.get("IpPermissions.1.FromPort"), Some("3128"));
    assert_eq!(params.get("IpPermissions.1.ToPort"), Some("3128"));
    assert_eq!(params.get("IpPermissions.1.IpProtocol"), Some("tcp"));
    assert_eq!(
        params.get("IpPermissions.1.IpRanges.1.CidrIp"),
        Some("203.0.113.0/24")
    );
    assert_eq!(
        params.get("IpPermissions.1.Ipv6Ranges.1.CidrIpv6"),
        Some("2001:db8::/32")
    );
    assert_eq!(params.get("IpPermissions.1.IpRanges.2.CidrIp"), None);
    // Same rules, same group; another port or range, another group.
    let key = security_group_key(&config(), 3128);
    assert_eq!(key, security_group_key(&config(), 3128));
    assert_ne!(key, security_group_key(&config(), 8080));
    let mut other = config();
    other.allow_from = vec!["198.51.100.0/24".into()];
    assert_ne!(key, security_group_key(&other, 3128));
}

const DESCRIBED: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>r</requestId>
  <reservationSet><item><reservationId>r-1</reservationId><instancesSet>
    <item>
      <instanceId>i-0123456789abcdef0</instanceId>
      <instanceState><code>16</code><name>running</name></instanceState>
      <privateIpAddress>10.0.0.5</privateIpAddress>
      <ipAddress>54.1.2.3</ipAddress>
      <placement><availabilityZone>eu-west-1b</availabilityZone></placement>
      <launchTime>2026-12-04T21:00:00.000Z</launchTime>
      <networkInterfaceSet><item><groupSet><item><groupId>sg-1</groupId></item></groupSet></item></networkInterfaceSet>
      <tagSet>
        <item><key>proxy-operator-managed</key><value>true</value></item>
        <item><key>proxy-operator-name</key><value>px-1</value></item>
        <item><key>proxy-operator-owner-namespace</key><value>crawlers</value></item>
        <item><key>proxy-operator-owner-name</key><value>egress-1</value></item>
        <item><key>proxy-operator-owner-uid</key><value>u-1</value></item>
        <item><key>proxy-operator-operator-id</key><value>proxy-operator</value></item>
        <item><key>proxy-operator-port</key><value>8080</value></item>
      </tagSet>
    </item>
    <item>
      <instanceId>i-0000000000000000f</instanceId>
      <instanceState><code>48</code><name>terminated</name></instanceState>
      <instanceLifecycle>spot</instanceLifecycle>
      <stateReason><code>Server.SpotInstanceTermination</code><message>Server.SpotInstanceTermination: Spot instance termination</message></stateReason>
      <tagSet/>
    </item>
  </instancesSet></item></reservationSet>
  <nextToken>page-2</nextToken>
</DescribeInstancesResponse>"#;

#[test]
fn described_instances_read_back_with_owner_address_and_paging() {
    let (found, next) = instances(DESCRIBED).unwrap();
    assert_eq!(next.as_deref(), Some("page-2"));
    assert_eq!(found.len(), 2);
    let instance = found[0].instance();
    assert_eq!(instance.provider_id, "i-0123456789abcdef0");
    assert_eq!(instance.name, "px-1");
    assert_eq!(instance.state, InstanceState::Running);
    assert_eq!(instance.address.as_deref(), Some("54.1.2.3"));
    assert_eq!(instance.port, 8080);
    assert_eq!(instance.zone.as_deref(), Some("eu-west-1b"));
    assert_eq!(instance.owner.unwrap().uid, "u-1");
    assert!(instance.created_at.is_some());
    assert!(found[1].gone() && found[1].spot);
    let reason = gone_reason(&found[1]);
    assert!(
        reason.starts_with("spot instance i-0000000000000000f was interrupted (terminated)"),
        "{reason}"
    );
    assert!(found[1].instance().owner.is_none());
    assert_eq!(group_id(DESCRIBED).as_deref(), Some("sg-1"));
}

#[test]
fn user_data_over_the_ec2_limit_is_refused() {
    let mut big = spec();
    big.user_data = vec![b'a'; MAX_USER_DATA + 1];
    match user_data(&config(), &big, false) {
        Err(ProviderError::Permanent(m)) => assert!(m.contains("over EC2's 16384"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_token_after_a_terminated_instance_is_new_and_stable() {
    let next = next_client_token("px-0123456789abcdef", "i-0123456789abcdef0");
    assert_eq!(next, "px-0123456789abcdef-i-0123456789abcdef0");
    assert_eq!(
        next,
        next_client_token("px-0123456789abcdef", "i-0123456789abcdef0")
    );
    assert!(next.len() <= 64);
}
