//! The aws provider component through the real runtime against moto (the AWS emulator the AWS
//! SDKs test with, `harness::Moto`): EC2 keeps the instances, security groups and tags, STS
//! exchanges a web identity. The host signs every request (SigV4); the plugin makes Query API
//! calls. Between them a recording front relays each request to moto and notes its action and
//! `Authorization` (moto checks no signature; the host's unit and runtime tests check those),
//! and can answer `RunInstances` with one of AWS's documented errors, which moto never gives. It
//! also keeps AWS's documented `ClientToken` idempotency, which moto does not: a token seen before
//! answers with its instance, terminated or not.

use std::sync::{Arc, Mutex};

use base64::Engine;
use proxy_operator::api::{Phase, Proxy};
use proxy_operator::provider::plugins::ProviderInstance;
use proxy_operator::provider::plugins::types::{InstanceState, ProviderError};

use super::common::own_network;
use super::common::{spec, test_options};
use super::{
    Operator, bound_provider, control_plane, phase, providers_with, proxy_yaml, refused, wait_for,
};

const REGION: &str = "eu-west-1";
/// One of the AMIs moto knows in every region.
const AMI: &str = "ami-12c6146b";

#[derive(Default)]
struct FrontState {
    /// (Action, Authorization) of every request relayed.
    seen: Vec<(String, String)>,
    /// Answer `RunInstances` with this AWS error code (HTTP 400) instead of relaying it.
    run_fails_with: Option<String>,
    /// The instance each `RunInstances` client token made.
    tokens: std::collections::HashMap<String, String>,
}

/// The recording front of a moto.
struct Front {
    url: String,
    state: Arc<Mutex<FrontState>>,
    moto: harness::Moto,
}

impl Front {
    async fn start() -> Front {
        let moto = harness::Moto::start().await.unwrap();
        let state: Arc<Mutex<FrontState>> = Arc::default();
        let (record, upstream) = (state.clone(), moto.url());
        let client = reqwest::Client::new();
        let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
            let (record, upstream, client) = (record.clone(), upstream.clone(), client.clone());
            async move { relay(request, &record, &upstream, &client).await }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Front { url, state, moto }
    }

    fn with<T>(&self, f: impl FnOnce(&mut FrontState) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    fn calls(&self, action: &str) -> usize {
        self.with(|s| s.seen.iter().filter(|(a, _)| a == action).count())
    }

    /// EC2 at moto directly (not through the host): what a user would see with the AWS CLI.
    async fn ec2(&self, params: &[(&str, &str)]) -> String {
        let mut form = url::form_urlencoded::Serializer::new(String::new());
        form.append_pair("Version", "2016-11-15");
        for (k, v) in params {
            form.append_pair(k, v);
        }
        let body = form.finish();
        reqwest::Client::new()
            .post(self.moto.url())
            .header("content-type", "application/x-www-form-urlencoded")
            // moto takes the region from the credential scope.
            .header(
                "authorization",
                format!("AWS4-HMAC-SHA256 Credential=AKIDTEST/20260101/{REGION}/ec2/aws4_request, SignedHeaders=host, Signature=0"),
            )
            .body(body)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

async fn relay(
    request: axum::extract::Request,
    record: &Mutex<FrontState>,
    upstream: &str,
    client: &reqwest::Client,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    let param = |name: &str| {
        url::form_urlencoded::parse(&body)
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default()
    };
    let (action, token) = (param("Action"), param("ClientToken"));
    let authorization = parts
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let fail = {
        let mut state = record.lock().unwrap();
        state.seen.push((action.clone(), authorization));
        state
            .run_fails_with
            .clone()
            .filter(|_| action == "RunInstances")
    };
    if let Some(code) = fail {
        let xml = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code><Message>You have requested more instances (1) than your current instance limit of 0 allows for the specified instance type.</Message></Error></Errors><RequestID>front</RequestID></Response>"
        );
        return (axum::http::StatusCode::BAD_REQUEST, xml).into_response();
    }
    let known = record.lock().unwrap().tokens.get(&token).cloned();
    let body = match (&known, action.as_str()) {
        // AWS: the same token answers with the same instance (for 24 h after it terminates).
        (Some(id), "RunInstances") => {
            format!("Action=DescribeInstances&Version=2016-11-15&InstanceId.1={id}").into()
        }
        _ => body,
    };
    let mut forwarded = client.post(upstream).body(body);
    // Not the length: the body may be another one.
    let relayed = |n: &axum::http::HeaderName| *n != "host" && *n != "content-length";
    for (name, value) in parts.headers.iter().filter(|(n, _)| relayed(n)) {
        forwarded = forwarded.header(name, value);
    }
    let answer = forwarded.send().await.unwrap();
    let status = answer.status().as_u16();
    let text = answer.text().await.unwrap();
    if action == "RunInstances" && known.is_none() && status == 200 {
        let id = texts(&text, "instanceId").remove(0);
        record.lock().unwrap().tokens.insert(token, id);
    }
    (axum::http::StatusCode::from_u16(status).unwrap(), text).into_response()
}

/// Static keys in files of `dir`, as a mounted Secret holds them.
fn static_keys(dir: &std::path::Path) -> serde_json::Value {
    std::fs::write(dir.join("access-key-id"), "AKIDPROXYOPERATOR\n").unwrap();
    std::fs::write(dir.join("secret-access-key"), "proxy-operator-secret\n").unwrap();
    serde_json::json!({
        "region": REGION,
        "accessKeyIdFrom": {"file": dir.join("access-key-id")},
        "secretAccessKeyFrom": {"file": dir.join("secret-access-key")},
    })
}

/// The providers-config entry of an aws provider instance against `front`.
fn entry(front: &Front, keys: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "config": {
            "region": REGION,
            "amis": {REGION: AMI},
            "zones": ["eu-west-1a", "eu-west-1b"],
            "endpoint": front.url,
            "allowFrom": ["203.0.113.0/24"],
        },
        "grants": {"http": {
            "allow": [front.url],
            "credentials": [{"url": front.url, "valueFrom": {"awsCredentials": keys}}],
        }},
    })
}

async fn aws_provider(entry: &serde_json::Value) -> ProviderInstance {
    bound_provider(
        test_options(),
        "aws",
        "aws-eu",
        &entry["config"],
        entry["grants"].clone(),
    )
    .await
    .unwrap()
}

/// The controller of `ns` with one aws provider instance `aws-eu` of `entry`.
async fn aws_operator(ns: &harness::TestNamespace, mut entry: serde_json::Value) -> Operator {
    entry["name"] = "aws-eu".into();
    entry["type"] = "aws".into();
    let providers = providers_with(
        test_options(),
        &serde_json::json!({"providers": [entry]}).to_string(),
    )
    .await;
    Operator::with_providers(ns.client(), ns, providers)
}

/// The text of every element `name` in `xml`.
fn texts(xml: &str, name: &str) -> Vec<String> {
    let document = roxmltree::Document::parse(xml).unwrap();
    document
        .descendants()
        .filter(|n| n.has_tag_name(name))
        .filter_map(|n| n.text().map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_runs_with_the_squid_user_data_and_owner_tags_and_is_terminated() {
    let front = Front::start().await;
    let dir = tempfile::tempdir().unwrap();
    let provider = aws_provider(&entry(&front, static_keys(dir.path()))).await;
    let checked = provider.check().await.unwrap();
    assert!(checked.iter().all(|t| t.ok), "{checked:?}");

    let mut want = spec("px-aws-one", serde_json::json!({}));
    want.zone = Some("eu-west-1b".into());
    let created = provider.create(want.clone()).await.unwrap();
    let id = created.provider_id.clone();
    assert!(id.starts_with("i-"), "{id}");
    let mut got = provider.get(&id).await.unwrap();
    while got.state != InstanceState::Running {
        assert_eq!(got.state, InstanceState::Provisioning);
        got = provider.get(&id).await.unwrap();
    }
    let address = got
        .address
        .clone()
        .expect("the public address once running");
    assert!(address.parse::<std::net::Ipv4Addr>().is_ok(), "{address}");
    assert_eq!(got.zone.as_deref(), Some("eu-west-1b"));
    assert_eq!(got.owner.as_ref().unwrap().uid, "uid-px-aws-one");

    // What EC2 holds: the owner tags, the user's cloud-init and the managed squid.
    let described = front
        .ec2(&[("Action", "DescribeInstances"), ("InstanceId.1", &id)])
        .await;
    let keys = texts(&described, "key");
    for tag in [
        "proxy-operator-managed",
        "proxy-operator-owner-uid",
        "proxy-operator-operator-id",
    ] {
        assert!(keys.iter().any(|k| k == tag), "{tag} in {keys:?}");
    }
    assert_eq!(texts(&described, "instanceType"), ["t3.micro"]);
    assert_eq!(texts(&described, "imageId"), [AMI]);
    let attribute = front
        .ec2(&[
            ("Action", "DescribeInstanceAttribute"),
            ("InstanceId", &id),
            ("Attribute", "userData"),
        ])
        .await;
    let encoded = texts(&attribute, "value").join("");
    let user_data = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .unwrap(),
    )
    .unwrap();
    assert!(user_data.contains("\n#cloud-config\n"), "{user_data}");
    own_network::assert_squid_parses(&own_network::conf_in_script(&user_data));

    // Created again: the same instance. Listed by the owner tag.
    assert_eq!(provider.create(want).await.unwrap().provider_id, id);
    assert_eq!(front.calls("RunInstances"), 1);
    let listed: Vec<String> = provider
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.provider_id)
        .collect();
    assert_eq!(listed, std::slice::from_ref(&id));

    provider.delete(&id).await.unwrap();
    let after = front
        .ec2(&[("Action", "DescribeInstances"), ("InstanceId.1", &id)])
        .await;
    assert!(
        texts(&after, "name")
            .iter()
            .any(|s| s == "terminated" || s == "shutting-down"),
        "{after}"
    );
    assert!(matches!(
        refused(provider.get(&id).await),
        ProviderError::NotFound(_)
    ));
    provider.delete(&id).await.expect("deleting again is fine");
    assert!(provider.list().await.unwrap().is_empty());

    // Every request was signed for the region and EC2, with the keys the host read.
    front.with(|s| {
        for (action, authorization) in &s.seen {
            assert!(
                authorization.starts_with("AWS4-HMAC-SHA256 Credential=AKIDPROXYOPERATOR/")
                    && authorization
                        .contains(&format!("/{REGION}/ec2/aws4_request, SignedHeaders=")),
                "{action}: {authorization}"
            );
        }
    });
}

/// `list` follows `NextToken`: seven instances on pages of five.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_follows_every_page() {
    let front = Front::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut entry = entry(&front, static_keys(dir.path()));
    entry["config"]["listPageSize"] = 5.into();
    let provider = aws_provider(&entry).await;
    let mut made = Vec::new();
    for n in 0..7 {
        let mut want = spec(&format!("px-page-{n}"), serde_json::json!({}));
        want.zone = None;
        let created = provider.create(want).await.unwrap();
        made.push(created.provider_id);
    }
    let mut listed: Vec<String> = provider
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.provider_id)
        .collect();
    listed.sort();
    made.sort();
    assert_eq!(listed, made);
    let pages = front.with(|s| {
        s.seen
            .iter()
            .filter(|(a, _)| a == "DescribeInstances")
            .count()
    });
    assert!(
        pages >= 7 + 2,
        "the list took two pages: {pages} DescribeInstances"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_becomes_ready_and_two_share_one_security_group_and_deletion_terminates() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-aws").await.unwrap();
    let front = Front::start().await;
    let dir = tempfile::tempdir().unwrap();
    let _operator = aws_operator(&ns, entry(&front, static_keys(dir.path()))).await;
    let proxies: kube::Api<Proxy> = ns.api();
    let mut ids = Vec::new();
    for name in ["ec2-1", "ec2-2"] {
        let yaml =
            proxy_yaml(ns.name(), name, "aws-eu", "").replace("zone: zone-a", "zone: eu-west-1a");
        cp.kubectl_run(&["apply", "-f", "-"], Some(&yaml))
            .await
            .unwrap();
        let ready = wait_for(&proxies, name, "Ready", |p| phase(p) == Some(Phase::Ready))
            .await
            .unwrap();
        let status = ready.status.unwrap();
        assert!(status.address.is_some());
        assert_eq!(status.zone.as_deref(), Some("eu-west-1a"));
        ids.push(status.provider_id.unwrap());
    }
    // One group for both, admitting allowFrom on 3128 only.
    assert_eq!(front.calls("CreateSecurityGroup"), 1);
    let groups = front
        .ec2(&[
            ("Action", "DescribeSecurityGroups"),
            ("Filter.1.Name", "tag-key"),
            ("Filter.1.Value.1", "proxy-operator-security-group"),
        ])
        .await;
    // Ingress only (the default egress rule stays).
    let document = roxmltree::Document::parse(&groups).unwrap();
    let ingress = document
        .descendants()
        .find(|n| n.has_tag_name("ipPermissions"))
        .expect("the group's ingress rules");
    let within = |name: &str| -> Vec<&str> {
        ingress
            .descendants()
            .filter(|n| n.has_tag_name(name))
            .filter_map(|n| n.text())
            .collect()
    };
    assert_eq!(within("cidrIp"), ["203.0.113.0/24"], "{groups}");
    assert_eq!(within("fromPort"), ["3128"]);
    assert_eq!(within("toPort"), ["3128"]);
    assert_eq!(within("ipProtocol"), ["tcp"]);

    for name in ["ec2-1", "ec2-2"] {
        cp.kubectl_run(
            &["delete", "proxy", name, "-n", ns.name(), "--wait=true"],
            None,
        )
        .await
        .unwrap();
    }
    for id in ids {
        let after = front
            .ec2(&[("Action", "DescribeInstances"), ("InstanceId.1", &id)])
            .await;
        assert!(
            texts(&after, "name")
                .iter()
                .any(|s| s == "terminated" || s == "shutting-down"),
            "{id} is terminated with its Proxy: {after}"
        );
    }
}

/// EC2's `InstanceLimitExceeded` reaches the Proxy as the Quota condition and event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_limit_shows_as_quota_on_the_proxy() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-aws-quota").await.unwrap();
    let front = Front::start().await;
    front.with(|s| s.run_fails_with = Some("InstanceLimitExceeded".into()));
    let dir = tempfile::tempdir().unwrap();
    let _operator = aws_operator(&ns, entry(&front, static_keys(dir.path()))).await;
    let yaml =
        proxy_yaml(ns.name(), "ec2-q", "aws-eu", "").replace("zone: zone-a", "zone: eu-west-1a");
    cp.kubectl_run(&["apply", "-f", "-"], Some(&yaml))
        .await
        .unwrap();
    let proxies: kube::Api<Proxy> = ns.api();
    let waiting = wait_for(&proxies, "ec2-q", "the Quota condition", |p| {
        p.and_then(|p| p.status.as_ref()).is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Provisioned" && c.reason == "Quota")
        })
    })
    .await
    .unwrap();
    let status = waiting.status.unwrap();
    let provisioned = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Provisioned")
        .unwrap();
    assert!(
        provisioned
            .message
            .contains("RunInstances: InstanceLimitExceeded"),
        "{}",
        provisioned.message
    );
    let events = super::events_of(cp, &ns).await;
    assert!(
        events
            .iter()
            .any(|e| e["reason"] == "Quota" && e["type"] == "Warning"),
        "{events:?}"
    );
}

/// IRSA: the operator's web-identity token is exchanged at moto's STS and the Proxy's instance
/// is made with the temporary keys (STS's `ASIA…`), never the plugin's to see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_web_identity_is_exchanged_at_sts_and_a_proxy_becomes_ready() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-aws-irsa").await.unwrap();
    let front = Front::start().await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJvcGVyYXRvciJ9.c2ln").unwrap();
    let keys = serde_json::json!({
        "region": REGION,
        "webIdentityTokenFile": token,
        "roleArn": "arn:aws:iam::123456789012:role/proxy-operator",
        "stsEndpoint": front.moto.url(),
    });
    let _operator = aws_operator(&ns, entry(&front, keys)).await;
    let yaml =
        proxy_yaml(ns.name(), "ec2-irsa", "aws-eu", "").replace("zone: zone-a", "zone: eu-west-1b");
    cp.kubectl_run(&["apply", "-f", "-"], Some(&yaml))
        .await
        .unwrap();
    let proxies: kube::Api<Proxy> = ns.api();
    wait_for(&proxies, "ec2-irsa", "Ready", |p| {
        phase(p) == Some(Phase::Ready)
    })
    .await
    .unwrap();
    front.with(|s| {
        assert!(!s.seen.is_empty());
        for (action, authorization) in &s.seen {
            assert!(
                authorization.starts_with("AWS4-HMAC-SHA256 Credential=ASIA"),
                "{action}: {authorization}"
            );
        }
    });
}

/// The conformance suite of `proxy-operator plugin test` (as a library) against moto.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aws_provider_is_conformant() {
    let front = Front::start().await;
    let dir = tempfile::tempdir().unwrap();
    let entry = entry(&front, static_keys(dir.path()));
    let (engine, _) = super::common::engine_with(test_options()).await;
    let grants = serde_json::from_value(entry["grants"].clone()).unwrap();
    super::common::assert_conformant(&engine, "aws", entry["config"].clone(), grants, None).await;
    let live = front
        .ec2(&[
            ("Action", "DescribeInstances"),
            ("Filter.1.Name", "instance-state-name"),
            ("Filter.1.Value.1", "running"),
            ("Filter.1.Value.2", "pending"),
        ])
        .await;
    assert!(
        texts(&live, "instanceId").is_empty(),
        "nothing left behind: {live}"
    );
}

/// A spot instance (`spot: true`: `InstanceMarketOptions`) that AWS terminates, as an
/// interruption does, is a lost instance: the Proxy reports `InstanceLost` with AWS's state, and
/// `recreateOnLoss` gets a new instance, although the same instance name's first client token
/// still answers with the terminated one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_spot_instance_is_lost_and_recreated() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-aws-spot").await.unwrap();
    let front = Front::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut entry = entry(&front, static_keys(dir.path()));
    entry["config"]["spot"] = true.into();
    let _operator = aws_operator(&ns, entry).await;
    let yaml = format!(
        "apiVersion: proxy-operator.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: ec2-spot\n  namespace: {}\nspec:\n  provider: aws-eu\n  placement: {{zone: eu-west-1a}}\n  recreateOnLoss: true\n",
        ns.name()
    );
    cp.kubectl_run(&["apply", "-f", "-"], Some(&yaml))
        .await
        .unwrap();
    let proxies: kube::Api<Proxy> = ns.api();
    let ready = wait_for(&proxies, "ec2-spot", "Ready", |p| {
        phase(p) == Some(Phase::Ready)
    })
    .await
    .unwrap();
    let first = ready.status.unwrap().provider_id.unwrap();
    let described = front
        .ec2(&[("Action", "DescribeInstances"), ("InstanceId.1", &first)])
        .await;
    assert_eq!(
        texts(&described, "instanceLifecycle"),
        ["spot"],
        "{described}"
    );

    // AWS takes the instance back.
    front
        .ec2(&[("Action", "TerminateInstances"), ("InstanceId.1", &first)])
        .await;
    // Any change makes the operator look again (otherwise it looks every few minutes).
    cp.kubectl_run(
        &["annotate", "px", "ec2-spot", "-n", ns.name(), "poke=1"],
        None,
    )
    .await
    .unwrap();
    let replaced = wait_for(&proxies, "ec2-spot", "a new instance, Ready", |p| {
        p.and_then(|p| p.status.as_ref()).is_some_and(|s| {
            s.phase == Some(Phase::Ready) && s.provider_id.as_deref().is_some_and(|id| id != first)
        })
    })
    .await
    .unwrap();
    // The first token answers with the terminated instance (as AWS does); the next one, derived
    // from it, makes the new one.
    assert_eq!(front.calls("RunInstances"), 3);
    let events = super::events_of(cp, &ns).await;
    let lost = events
        .iter()
        .find(|e| e["reason"] == "InstanceLost")
        .unwrap_or_else(|| panic!("an InstanceLost event in {events:?}"));
    let note = lost["note"].as_str().unwrap();
    assert!(
        note.contains(&format!("spot instance {first} was interrupted")),
        "{note}"
    );
    assert!(replaced.status.unwrap().address.is_some());
}
