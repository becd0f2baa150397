//! `kubectl px why PROXY`: why a Proxy is not Ready, in words. The steps a Proxy goes through
//! (the operator saw it, its provider is configured, the plugin loaded, the provider made the
//! instance, the instance got an address, the health probes passed), each judged from the
//! Proxy's conditions and last error, its provider's ProviderHealth and its events; the first
//! that fails is the cause, with what to do and the entry of docs/troubleshooting.md. Pure.

use kube::ResourceExt;
use serde::Serialize;

use super::fleet::{phase_text, qualified_name};
use super::table::{Tone, bold, paint, relative};
use crate::api::{Phase, ProviderHealth, Proxy};
use crate::support::printable::printable;

/// The troubleshooting guide, as the causes point into it.
pub const TROUBLESHOOTING: &str = "docs/troubleshooting.md";

/// An event of the Proxy, as `why` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventLine {
    #[serde(rename = "type")]
    pub type_: String,
    pub reason: String,
    pub message: String,
    pub count: u32,
    #[serde(skip)]
    pub at_ms: Option<u64>,
    pub at: Option<String>,
}

/// What the lease table says of the proxy (for a Ready one: whether it can be leased).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Leasing {
    pub draining: bool,
    pub cooling_until_ms: Option<u64>,
    pub leased_until_ms: Option<u64>,
    pub holder: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum StepState {
    Ok,
    Failed,
    /// Not the cause, but worth knowing (a provider check failing while the Proxy is fine).
    Warning,
    /// After the failing step: not reached.
    NotReached,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    pub step: &'static str,
    pub state: StepState,
    pub says: String,
}

/// The first failing step: what it means, its message, what to do, where to read more.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cause {
    pub step: &'static str,
    pub summary: String,
    pub message: String,
    pub advice: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub see: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub proxy: String,
    pub phase: Option<Phase>,
    pub ready: bool,
    pub steps: Vec<Step>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    /// For a Ready proxy: whether crawlers can lease it now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leasing: Option<String>,
    pub events: Vec<EventLine>,
}

/// A section of docs/troubleshooting.md by its heading's anchor.
fn see(anchor: &str) -> Option<String> {
    Some(format!("{TROUBLESHOOTING}#{anchor}"))
}

/// The anchors `why` points at; each is a heading of docs/troubleshooting.md (a test holds them
/// to it).
pub const ANCHORS: &[&str] = &[
    UNKNOWN_PROVIDER,
    ACCESS_DENIED,
    PLUGIN_NOT_LOADED,
    QUOTA_OR_RETRYING,
    OUTSIDE_THE_SPEC,
    INSTANCE_LOST,
    PROVISIONING,
    NEVER_READY,
    CREDENTIALS_407,
    NOT_SEARCHED,
    IMPORT_INTERRUPTED,
    GCP_INSERT,
    NOT_LEADER,
];
const UNKNOWN_PROVIDER: &str = "a-proxy-stays-pending-with-reason-unknownprovider";
const ACCESS_DENIED: &str =
    "kubectl-apply-refuses-a-proxy-or-proxypool-or-it-stays-pending-with-reason-accessdenied";
const PLUGIN_NOT_LOADED: &str = "a-proxy-stays-pending-with-reason-pluginnotloaded";
const QUOTA_OR_RETRYING: &str = "a-proxy-stays-pending-with-reason-quota-or-retrying";
const OUTSIDE_THE_SPEC: &str = "a-proxy-is-failed-with-reason-unauthorized-denied-or-invalidconfig";
const INSTANCE_LOST: &str = "a-proxy-is-failed-with-reason-instancelost";
const PROVISIONING: &str = "a-kvm-proxy-stays-provisioning";
const NEVER_READY: &str = "a-proxy-has-an-address-but-never-becomes-ready";
const CREDENTIALS_407: &str =
    "crawlers-get-407-proxy-authentication-required-or-a-proxys-probes-fail-with-http-407";
const NOT_SEARCHED: &str =
    "a-proxy-stays-pending-with-zone--could-not-be-searched-or-host--could-not-be-searched";
const IMPORT_INTERRUPTED: &str = "a-kvm-proxy-is-pending-with-image-import-of--was-interrupted";
const GCP_INSERT: &str = "a-gcp-proxy-is-failed-with-the-insert-operation--failed-code-";
const NOT_LEADER: &str = "crawlers-get-503-not-leader-or-the-discovery-service-has-no-endpoints";

fn condition<'a>(
    proxy: &'a Proxy,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    proxy
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

fn cause(
    step: &'static str,
    summary: &str,
    message: &str,
    advice: &str,
    anchor: Option<&str>,
) -> Cause {
    Cause {
        step,
        summary: summary.to_string(),
        message: message.to_string(),
        advice: advice.to_string(),
        see: anchor.and_then(see),
    }
}

/// Why the provider's answer to a create stops the Proxy, by the condition's reason.
fn create_refused(reason: &str, message: &str, provider: &str) -> Option<Cause> {
    let c = |summary: &str, advice: &str, anchor: Option<&str>| {
        Some(cause("instance", summary, message, advice, anchor))
    };
    match reason {
        "Quota" => c(
            "the provider is out of capacity (a quota)",
            "Raise the quota or free capacity at the provider (delete Proxies it no longer needs); the operator tries again every minute, and the Proxy goes on without a change to it.",
            Some(QUOTA_OR_RETRYING),
        ),
        "Retrying" if message.contains("could not be searched") => c(
            "the provider cannot search a zone or host for an instance an earlier try may have made",
            "Fix what the message in brackets says about that zone or host, or remove it from the providers config if it is gone for good; the Proxy goes on by itself.",
            Some(NOT_SEARCHED),
        ),
        "Retrying" if message.contains("image import of") => c(
            "the base image's upload to the hypervisor was interrupted",
            "The operator retries by itself; if it fails at every try, check the network between the operator and the hypervisor and the hypervisor's sshd log.",
            Some(IMPORT_INTERRUPTED),
        ),
        "Retrying" => c(
            "the provider's last create failed and is being retried",
            "The message is the provider's answer; an outage passes by itself (retried with backoff). If it lasts, fix what the message names.",
            Some(QUOTA_OR_RETRYING),
        ),
        "Unauthorized" | "Denied" | "InvalidConfig" => c(
            "the provider refused it for a reason outside the Proxy (credentials, grants or config)",
            &format!(
                "Fix provider instance `{provider}`'s credentials Secret, `grants` or `config` in the providers config; the operator tries again at once when the providers config or a plugin changes, otherwise every 5 minutes."
            ),
            Some(OUTSIDE_THE_SPEC),
        ),
        "ProviderError" | "NotFound" => c(
            "the provider refused to make it (a permanent error)",
            "Fix what the message names in the Proxy's spec: it is not tried again until the spec changes (for an immutable field, delete the Proxy and apply it again).",
            message.contains("insert operation").then_some(GCP_INSERT),
        ),
        "InstanceLost" => c(
            "its instance no longer exists at the provider (deleted behind the operator's back)",
            "Delete the Proxy (a pool replaces its own), or set `spec.recreateOnLoss: true` to have a new instance made.",
            Some(INSTANCE_LOST),
        ),
        _ => None,
    }
}

/// Why the health probes fail, from the `Healthy` condition's message (the prober's words).
fn probe_failed(message: &str) -> Cause {
    let c = |summary: &str, advice: &str, anchor: &str| {
        cause("probes", summary, message, advice, Some(anchor))
    };
    if message.contains("HTTP 407") {
        c(
            "the proxy did not accept the health probe's credentials (HTTP 407)",
            "The credentials Secret changed without reaching the proxy: look at the Proxy's `CredentialsCurrent` condition and events; a VM provider cannot change them in place, so delete the Proxy (a pool replaces it).",
            CREDENTIALS_407,
        )
    } else if message.contains("HTTP 403") {
        c(
            "squid refused the health probe (HTTP 403)",
            "Add the operator's address range to the provider's `allowFrom`, the port of `--health-target` to its `connectPorts`, or the target's address to `allowDestinations`; better, use a public `--health-target`.",
            NEVER_READY,
        )
    } else if message.contains("HTTP 50") {
        c(
            "squid could not reach the health target",
            "Check the proxy's route to `--health-target` and its DNS (`dnsNameservers`).",
            NEVER_READY,
        )
    } else if message.contains("cannot connect") || message.contains("no answer within") {
        c(
            "nothing answers CONNECT at the proxy's address",
            "squid is not listening (yet): wait a minute for a booting VM; otherwise read squid's `cache.log` (and `journalctl -u squid`) in the instance, and check the proxy's address and port are reachable from the operator.",
            NEVER_READY,
        )
    } else {
        c(
            "the health probes through the proxy fail",
            "Read the message: it is the proxy's answer to the operator's CONNECT.",
            NEVER_READY,
        )
    }
}

/// The plugin step: the Proxy waits for a plugin that is missing or refused its config.
fn plugin_missing(message: &str, provider: &str) -> Cause {
    if message.contains("rejected its config") || message.contains("rejected the config") {
        cause(
            "plugin",
            "the provider's plugin refused the provider instance's config",
            message,
            &format!(
                "Fix `config` of provider instance `{provider}` in the providers config (`proxy-operator plugin validate --providers-config FILE` checks it as the operator does); the Proxy is made once the plugin accepts it."
            ),
            Some(PLUGIN_NOT_LOADED),
        )
    } else {
        cause(
            "plugin",
            "the provider's plugin is not loaded",
            message,
            &format!(
                "Make the plugin available where the operator loads it from (`--plugins-dir`, the plugins ConfigMap, or the entry's `plugin.url`); ProviderHealth `{provider}` says why it is not loaded. The Proxy is made once it loads."
            ),
            Some(PLUGIN_NOT_LOADED),
        )
    }
}

/// The steps judged so far; after the first failure the rest are not reached.
#[derive(Default)]
struct Steps {
    steps: Vec<Step>,
    cause: Option<Cause>,
}

impl Steps {
    fn judge(&mut self, step: &'static str, outcome: Result<String, Cause>) {
        if self.cause.is_some() {
            self.steps.push(Step {
                step,
                state: StepState::NotReached,
                says: String::new(),
            });
            return;
        }
        match outcome {
            Ok(says) => self.steps.push(Step {
                step,
                state: StepState::Ok,
                says,
            }),
            Err(cause) => {
                self.steps.push(Step {
                    step,
                    state: StepState::Failed,
                    says: cause.message.clone(),
                });
                self.cause = Some(cause);
            }
        }
    }
}

/// What a Proxy's status says, read once.
struct Facts<'a> {
    proxy: &'a Proxy,
    provider: &'a str,
    phase: Option<Phase>,
    deleting: bool,
    /// The `Provisioned` condition's reason (else `Ready`'s) and message.
    reason: String,
    message: String,
    provisioned: bool,
    last_error: String,
}

impl<'a> Facts<'a> {
    fn of(proxy: &'a Proxy) -> Self {
        let deleting = proxy.metadata.deletion_timestamp.is_some();
        let provisioned = condition(proxy, "Provisioned");
        Facts {
            proxy,
            provider: &proxy.spec.provider,
            phase: if deleting {
                Some(Phase::Deleting)
            } else {
                proxy.status.as_ref().and_then(|s| s.phase)
            },
            deleting,
            reason: provisioned
                .or_else(|| condition(proxy, "Ready"))
                .map(|c| c.reason.clone())
                .unwrap_or_default(),
            message: provisioned.map(|c| c.message.clone()).unwrap_or_default(),
            provisioned: provisioned.is_some_and(|c| c.status == "True"),
            last_error: proxy
                .status
                .as_ref()
                .and_then(|s| s.last_error.clone())
                .unwrap_or_default(),
        }
    }

    fn operator(&self) -> Result<String, Cause> {
        match self.phase {
            _ if self.deleting => Err(cause(
                "operator",
                "the Proxy is being deleted",
                "deletionTimestamp is set: the operator deletes its instance at the provider, then removes its finalizer",
                "Wait. If it stays, read its events: while the provider's plugin is not loaded the operator cannot delete the instance and waits for it.",
                None,
            )),
            None => Err(cause(
                "operator",
                "the operator has not written a status for it yet",
                "no status",
                "Check that the operator runs and leads (`kubectl -n proxy-operator get pods -L proxy-operator.dev/leader`) and watches this namespace (its `--proxy-namespace`).",
                Some(NOT_LEADER),
            )),
            Some(phase) => Ok(format!("seen by the operator: phase {phase:?}")),
        }
    }

    fn provider(&self) -> Result<String, Cause> {
        if self.reason == "AccessDenied" {
            return Err(cause(
                "provider",
                "its provider instance's access (providers config) refuses it",
                &self.message,
                "Remove the field the message names, or use a provider instance your namespace may use, or ask the platform team to widen the instance's `access`.",
                Some(ACCESS_DENIED),
            ));
        }
        if self.reason != "UnknownProvider" {
            return Ok(format!(
                "provider instance `{}` is configured",
                self.provider
            ));
        }
        let said = if self.last_error.is_empty() {
            &self.message
        } else {
            &self.last_error
        };
        Err(cause(
            "provider",
            "its provider is not in the operator's providers config",
            said,
            &format!(
                "Add a provider instance named `{}` to the providers config, or delete the Proxy and apply it with a configured `spec.provider` (it is immutable).",
                self.provider
            ),
            Some(UNKNOWN_PROVIDER),
        ))
    }

    /// The reconciler writes a missing plugin into `lastError` at every look, and into the
    /// conditions only for a Proxy it never got further with: the newer word wins.
    fn plugin(&self, health: Option<&ProviderHealth>) -> Result<String, Cause> {
        let said_in_error = self.last_error.contains(" is not loaded");
        if self.reason == "PluginNotLoaded" || (!self.provisioned && said_in_error) {
            let said = if said_in_error {
                &self.last_error
            } else {
                &self.message
            };
            return Err(plugin_missing(said, self.provider));
        }
        Ok(health
            .and_then(plugin_message)
            .map_or("its plugin is loaded".to_string(), |m| {
                format!("plugin {m}")
            }))
    }

    fn instance(&self) -> Result<String, Cause> {
        match create_refused(&self.reason, &self.message, self.provider) {
            Some(refused) if !self.provisioned => Err(refused),
            _ => Ok(
                match self
                    .proxy
                    .status
                    .as_ref()
                    .and_then(|s| s.provider_id.as_deref())
                {
                    Some(id) => format!("instance {id} made by provider `{}`", self.provider),
                    None => "the provider is making the instance".to_string(),
                },
            ),
        }
    }

    fn address(&self) -> Result<String, Cause> {
        if self.reason == "Provisioning" && !self.provisioned {
            return Err(cause(
                "address",
                "the instance exists but has no address yet",
                &self.message,
                "A VM is still booting (under TCG about a minute): wait. If the provider's words say the guest agent has reported no address for minutes, check that the image runs qemu-guest-agent and gets an address on its network (DHCP).",
                Some(PROVISIONING),
            ));
        }
        let status = self.proxy.status.clone().unwrap_or_default();
        Ok(status
            .address
            .as_ref()
            .map_or("no address yet".into(), |a| {
                format!(
                    "running at {a}:{}",
                    status.port.unwrap_or(self.proxy.spec.port)
                )
            }))
    }

    fn probes(&self) -> Result<String, Cause> {
        match condition(self.proxy, "Healthy") {
            Some(c) if c.status == "False" => Err(probe_failed(&c.message)),
            Some(c) => Ok(c.message.clone()),
            None => Ok(condition(self.proxy, "Ready")
                .map(|c| c.message.clone())
                .filter(|m| !m.is_empty())
                .unwrap_or_else(|| "not probed yet".into())),
        }
    }
}

/// Everything `why` knows, judged.
pub fn explain(
    proxy: &Proxy,
    health: Option<&ProviderHealth>,
    events: Vec<EventLine>,
    leasing: &Leasing,
    now_ms: u64,
) -> Explanation {
    let facts = Facts::of(proxy);
    let mut steps = Steps::default();
    steps.judge("operator", facts.operator());
    steps.judge("provider", facts.provider());
    steps.judge("plugin", facts.plugin(health));
    let check = provider_check(health, facts.provisioned);
    steps.judge("provider check", Ok(String::new()));
    if let Some(last) = steps.steps.last_mut()
        && last.state == StepState::Ok
    {
        (last.state, last.says) = check;
    }
    steps.judge("instance", facts.instance());
    steps.judge("address", facts.address());
    steps.judge("probes", facts.probes());
    let ready = facts.phase == Some(Phase::Ready);
    if ready || steps.cause.is_some() {
        steps.judge("ready", Ok("Ready: leasable when free".into()));
    } else {
        // Every step passed, yet the phase is not Ready (a state these steps do not know).
        steps.judge(
            "ready",
            Err(cause(
                "ready",
                &format!("the Proxy is {}", phase_text(facts.phase)),
                &facts.last_error,
                "Read its conditions and events (`kubectl describe px`).",
                None,
            )),
        );
    }
    Explanation {
        proxy: qualified_name(&proxy.namespace().unwrap_or_default(), &proxy.name_any()),
        phase: facts.phase,
        ready,
        steps: steps.steps,
        leasing: ready.then(|| leasing_note(leasing, now_ms)),
        cause: steps.cause,
        events,
    }
}

fn plugin_message(health: &ProviderHealth) -> Option<String> {
    health
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "PluginLoaded" && c.status == "True")
        .map(|c| c.message.clone())
}

/// The provider's own check: never the cause (a create can fail or pass whatever it says), a
/// warning when it fails for a Proxy that is not made.
fn provider_check(health: Option<&ProviderHealth>, provisioned: bool) -> (StepState, String) {
    let ready = health
        .and_then(|h| h.status.as_ref())
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    match ready {
        None => (
            StepState::Ok,
            "no ProviderHealth yet (checked every --provider-check-interval)".to_string(),
        ),
        Some(c) if c.status == "True" => (StepState::Ok, format!("ProviderHealth: {}", c.message)),
        Some(c) => (
            if provisioned {
                StepState::Ok
            } else {
                StepState::Warning
            },
            format!("ProviderHealth {}: {}", c.reason, c.message),
        ),
    }
}

fn leasing_note(leasing: &Leasing, now_ms: u64) -> String {
    if leasing.draining {
        return "it is draining: it takes no new lease, and its pool replaces it".into();
    }
    if let Some(until) = leasing.cooling_until_ms {
        return format!(
            "it cools down for every target after a `blocked` report: leasable again {}",
            relative(until, now_ms)
        );
    }
    match (&leasing.holder, leasing.leased_until_ms) {
        (Some(holder), Some(until)) => {
            format!("it is leased by {holder} until {}", relative(until, now_ms))
        }
        _ => "it is free: crawlers can lease it".into(),
    }
}

fn mark(state: StepState, colour: bool) -> String {
    match state {
        StepState::Ok => paint("✓", Tone::Good, colour),
        StepState::Failed => paint("✗", Tone::Bad, colour),
        StepState::Warning => paint("!", Tone::Warn, colour),
        StepState::NotReached => paint("·", Tone::Dim, colour),
    }
}

pub fn render(explanation: &Explanation, now_ms: u64, colour: bool) -> String {
    let mut out = String::new();
    let phase = phase_text(explanation.phase);
    if explanation.ready {
        out.push_str(&format!(
            "{} is {}",
            explanation.proxy,
            paint("Ready", Tone::Good, colour)
        ));
        if let Some(leasing) = &explanation.leasing {
            out.push_str(&format!("; {}", printable(leasing)));
        }
        out.push_str(".\n\n");
    } else {
        out.push_str(&format!(
            "{} is not Ready (phase {}).\n\n",
            explanation.proxy,
            paint(&phase, Tone::Bad, colour)
        ));
    }
    let width = explanation
        .steps
        .iter()
        .map(|s| s.step.len())
        .max()
        .unwrap_or(0);
    for step in &explanation.steps {
        let says = match step.state {
            StepState::NotReached => paint("not reached", Tone::Dim, colour),
            // The step's words carry a plugin's message or a condition's.
            _ => printable(&step.says),
        };
        out.push_str(&format!(
            "  {} {:width$}  {says}\n",
            mark(step.state, colour),
            step.step,
        ));
    }
    if let Some(cause) = &explanation.cause {
        out.push('\n');
        out.push_str(&format!("{}  {}\n", bold("Why:", colour), cause.summary));
        out.push_str(&format!("{}   {}\n", bold("Do:", colour), cause.advice));
        if let Some(see) = &cause.see {
            out.push_str(&format!("{}  {see}\n", bold("See:", colour)));
        }
    }
    if !explanation.events.is_empty() {
        out.push_str(&format!("\n{}\n", bold("Recent events:", colour)));
        for e in &explanation.events {
            let tone = if e.type_ == "Warning" {
                Tone::Warn
            } else {
                Tone::Plain
            };
            let times = if e.count > 1 {
                format!(" (x{})", e.count)
            } else {
                String::new()
            };
            out.push_str(&format!(
                "  {} {} {}{times}: {}\n",
                e.at_ms.map_or("-".into(), |t| relative(t, now_ms)),
                paint(&printable(&e.type_), tone, colour),
                printable(&e.reason),
                printable(&e.message)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests;
