//! The single-node cluster fixture: real Pods from the local images, Services through
//! kube-proxy, rollouts, and the no-uplink guard.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use harness::Cluster;
use harness::node::{KUBERNETES_SERVICE_IP, WEB_BODY};
use harness::process::{Check, run_output, wait_for};

fn web(name: &str, image: &str, replicas: u32) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
spec:
  replicas: {replicas}
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
    spec:
      containers:
      - name: web
        image: {image}
        imagePullPolicy: Never
        ports: [{{containerPort: 8080}}]
        readinessProbe:
          httpGet: {{path: /, port: 8080}}
          periodSeconds: 1
---
apiVersion: v1
kind: Service
metadata:
  name: {name}
spec:
  selector: {{app: {name}}}
  ports: [{{port: 8080, targetPort: 8080}}]
"#
    )
}

/// A squid Pod; `run_as` sets the Pod's runAsUser (None: the image's user, root).
fn squid(name: &str, image: &str, run_as: Option<u32>) -> String {
    let security = match run_as {
        Some(uid) => {
            format!("securityContext: {{runAsNonRoot: true, runAsUser: {uid}, runAsGroup: {uid}}}")
        }
        None => "securityContext: {}".to_owned(),
    };
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  {security}
  containers:
  - name: squid
    image: {image}
    imagePullPolicy: Never
    ports: [{{containerPort: 3128}}]
    readinessProbe:
      tcpSocket: {{port: 3128}}
      periodSeconds: 1
"#
    )
}

async fn jsonpath(c: &Cluster, ns: &str, what: &[&str], path: &str) -> Result<String> {
    let mut args = vec!["-n", ns, "get"];
    args.extend_from_slice(what);
    let expr = format!("-o=jsonpath={path}");
    args.push(&expr);
    c.kubectl_run(&args, None).await
}

/// `curl ARGS` inside the cluster's network namespace until it returns `want` (kube-proxy
/// programs a new Service a moment after its endpoints exist).
async fn curl_until(c: &Cluster, args: &[String], want: &str) -> Result<()> {
    wait_for(
        &format!("curl {}", args.join(" ")),
        Duration::from_secs(30),
        || async {
            let mut cmd = c.netns_command("curl");
            cmd.args(["-sS", "--max-time", "5"]).args(args);
            match run_output(&mut cmd).await {
                Ok(body) if body == want => Check::Ready(()),
                Ok(body) => Check::NotYet(format!("body {body:?}")),
                Err(e) => Check::NotYet(e.to_string()),
            }
        },
    )
    .await
}

#[tokio::test]
async fn squid_pods_proxy_to_a_web_service() -> Result<()> {
    let c = Cluster::shared().await;
    eprintln!("cluster started in {:?}: {:?}", c.started_in(), c.phases());
    let ns = c.create_namespace("squid").await?;
    let images = c.images();
    let t0 = Instant::now();
    c.kubectl_run(
        &["-n", &ns, "apply", "-f", "-"],
        Some(&web("web", &images.web, 1)),
    )
    .await?;
    let manifests = [
        squid("squid-13", &images.squid, Some(13)),
        squid("squid-root", &images.squid, None),
    ]
    .join("---\n");
    c.kubectl_run(&["-n", &ns, "apply", "-f", "-"], Some(&manifests))
        .await?;
    c.kubectl_run(
        &[
            "-n",
            &ns,
            "wait",
            "--for=condition=Ready",
            "--timeout=90s",
            "pod",
            "--all",
        ],
        None,
    )
    .await
    .context("Pods Ready")?;
    eprintln!("3 Pods Ready {:?} after apply", t0.elapsed());

    let service_ip = jsonpath(c, &ns, &["service", "web"], "{.spec.clusterIP}").await?;
    let target = format!("http://{service_ip}:8080/");
    // From the namespace straight to the ClusterIP.
    curl_until(c, std::slice::from_ref(&target), WEB_BODY).await?;
    for pod in ["squid-13", "squid-root"] {
        let ip = jsonpath(c, &ns, &["pod", pod], "{.status.podIP}").await?;
        let proxy = format!("http://{ip}:3128");
        // A plain GET through squid, then a CONNECT tunnel (-p).
        curl_until(c, &["-x".into(), proxy.clone(), target.clone()], WEB_BODY).await?;
        curl_until(
            c,
            &["-p".into(), "-x".into(), proxy.clone(), target.clone()],
            WEB_BODY,
        )
        .await?;
        // A Pod reaches the apiserver through the `kubernetes` Service, with a certificate
        // valid for that address.
        let version = c
            .netns_command("curl")
            .args(["-sS", "--max-time", "5", "-p", "-x", &proxy, "--cacert"])
            .arg(c.dir().join("pki/ca.crt"))
            .arg(format!("https://{KUBERNETES_SERVICE_IP}/version"))
            .output()
            .await?;
        let text = String::from_utf8_lossy(&version.stdout);
        if !version.status.success() || !text.contains("gitVersion") {
            bail!(
                "{pod}: the kubernetes Service through squid: {text}{}",
                String::from_utf8_lossy(&version.stderr)
            );
        }
        // squid's own log reached the container's stderr (the entrypoint's job).
        let logs = c.kubectl_run(&["-n", &ns, "logs", pod], None).await?;
        assert!(logs.contains("Accepting HTTP"), "{pod} logs:\n{logs}");
    }
    Ok(())
}

#[tokio::test]
async fn a_deployment_rolls_out() -> Result<()> {
    let c = Cluster::shared().await;
    let ns = c.create_namespace("rollout").await?;
    let t0 = Instant::now();
    c.kubectl_run(
        &["-n", &ns, "apply", "-f", "-"],
        Some(&web("web", &c.images().web, 2)),
    )
    .await?;
    c.kubectl_run(
        &[
            "-n",
            &ns,
            "rollout",
            "status",
            "deployment/web",
            "--timeout=90s",
        ],
        None,
    )
    .await?;
    eprintln!("2 replicas rolled out in {:?}", t0.elapsed());
    let ready = jsonpath(c, &ns, &["deployment", "web"], "{.status.readyReplicas}").await?;
    assert_eq!(ready, "2");
    Ok(())
}

#[tokio::test]
async fn the_namespace_has_no_uplink() -> Result<()> {
    let c = Cluster::shared().await;
    c.check_no_uplink()?;
    let out = c
        .netns_command("ip")
        .args(["route", "get", "1.1.1.1"])
        .output()
        .await?;
    assert!(
        !out.status.success(),
        "a route off the namespace: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let routes = run_output(
        c.netns_command("ip")
            .args(["route", "show", "table", "all"]),
    )
    .await?;
    assert!(!routes.contains("default"), "a default route: {routes}");
    Ok(())
}
