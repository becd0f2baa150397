//! Runs the suite against one provider instance, through the same runtime the operator uses
//! (`ProviderInstance`: fresh store per call, sandbox limits, granted capabilities only).

use std::sync::Arc;

use serde_json::Value;

use super::checks::{self, Verdict};
use super::configs::{bad_configs, schema_errors};
use super::report::Report;
use crate::provider::capabilities::ValidGrants;
use crate::provider::plugins::types::{InstanceSpec, Owner};
use crate::provider::plugins::{
    LoadedPlugin, PluginEngine, ProviderInstance, ProviderInstanceOptions,
};

/// What the suite runs against: a loaded plugin, the author's good config and its grants.
pub struct Subject {
    pub engine: Arc<PluginEngine>,
    pub plugin: Arc<LoadedPlugin>,
    /// The provider instance name (the entry's `name`).
    pub name: String,
    pub config: Value,
    pub grants: ValidGrants,
}

impl Subject {
    fn instance(&self, config: &Value) -> Result<ProviderInstance, String> {
        ProviderInstance::new(
            self.engine.clone(),
            &self.name,
            self.plugin.clone(),
            config,
            &self.grants,
            ProviderInstanceOptions::default(),
        )
        .map_err(|e| format!("grants: {e}"))
    }
}

/// The checks that need a valid config, in order; skipped together when it is not.
const LIFECYCLE: &[&str] = &[
    "check-reasons",
    "check-healthy",
    "create",
    "create-idempotent",
    "get-after-create",
    "list-shows-owner",
    "delete",
    "delete-twice",
    "get-after-delete-is-not-found",
    "list-after-delete-omits-it",
];

/// A spec for the suite's one instance: a fresh name (so a run never meets a leftover of an
/// earlier one) and a recognisable owner. Names are lowercase DNS labels, which every provider
/// accepts as a VM, Pod or label value.
pub fn default_spec() -> InstanceSpec {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let tag = format!(
        "{:08x}",
        (nanos as u64 ^ u64::from(std::process::id())) & 0xffff_ffff
    );
    serde_json::from_value(serde_json::json!({
        "name": format!("px-conformance-{tag}"),
        "owner": {
            "namespace": "conformance",
            "name": format!("conformance-{tag}"),
            "uid": format!("00000000-0000-4000-8000-0000{tag}"),
            "operatorId": "proxy-operator-conformance",
        },
        "userData": "#cloud-config\n",
    }))
    .expect("the default spec is a valid InstanceSpec")
}

/// Runs every check against `subject`, creating (and deleting) one instance from `spec`.
pub async fn run(subject: &Subject, spec: InstanceSpec) -> Report {
    let info = &subject.plugin.info;
    let mut report = Report::new(&info.name, &info.version);
    let instance = match subject.instance(&subject.config) {
        Ok(instance) => instance,
        Err(e) => {
            report.record("grants", Err(e));
            report.skip(LIFECYCLE, "the grants are not valid");
            return report;
        }
    };
    if !config_checks(subject, &instance, &spec.name, &mut report).await {
        report.skip(LIFECYCLE, "the good config is not accepted");
        return report;
    }
    let targets = instance.check().await;
    match &targets {
        Ok(targets) => {
            report.record("check-reasons", checks::reasons(targets));
            report.record("check-healthy", checks::healthy(targets));
        }
        Err(_) => {
            report.record("check-reasons", checks::succeeded(&targets, "check"));
            report.skip(&["check-healthy"], "check failed");
        }
    }
    lifecycle(&instance, &spec, &mut report).await;
    report
}

/// Schema and `validate-config` agree: the good config passes both, each bad one neither (and
/// the plugin answers `invalid-config`). Returns whether the good config is accepted.
async fn config_checks(
    subject: &Subject,
    instance: &ProviderInstance,
    probe_id: &str,
    report: &mut Report,
) -> bool {
    let schema = match parse_schema(&subject.plugin.info.config_schema) {
        Ok(schema) => schema,
        Err(e) => {
            report.record("describe-schema", Err(e));
            return false;
        }
    };
    report.record("describe-schema", Ok("a valid JSON Schema".into()));
    let schema_ok = report.record(
        "schema-accepts-config",
        schema_errors(&schema, &subject.config).map(|()| "the schema accepts the config".into()),
    );
    let validated = instance.validate_config().await;
    let valid = report.record(
        "validate-config-accepts-config",
        checks::succeeded(&validated, "validate-config"),
    );
    let bad = bad_configs(&schema, &subject.config);
    if bad.is_empty() {
        report.record(
            "bad-configs",
            Err("the schema refuses no variant of the config: give it `type`, `required` and `additionalProperties: false`".into()),
        );
    }
    for (index, (case, config)) in bad.iter().enumerate() {
        let bad_instance = match subject.instance(config) {
            Ok(bad_instance) => bad_instance,
            Err(e) => {
                report.record(format!("bad-config/{case}"), Err(e));
                continue;
            }
        };
        let verdict = checks::bad_config_refused(case, &bad_instance.validate_config().await);
        let refused = report.record(format!("bad-config/{case}"), verdict);
        // Once: the other functions refuse a bad config with the same variant (the operator
        // never calls them with one, but `plugin run` with a hand-edited entry does).
        if index == 0 && refused {
            let got = bad_instance.get(probe_id).await.map(|_| ());
            report.record(
                format!("bad-config-get/{case}"),
                checks::bad_config_refused(case, &got),
            );
        }
    }
    schema_ok && valid
}

fn parse_schema(text: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        return Err(
            "describe() returns no config schema; describe the config as a JSON Schema".into(),
        );
    }
    let schema: Value = serde_json::from_str(text)
        .map_err(|e| format!("describe().config-schema is not JSON: {e}"))?;
    jsonschema::validator_for(&schema)
        .map_err(|e| format!("describe().config-schema is not a valid JSON Schema: {e}"))?;
    Ok(schema)
}

/// create twice, get, list, delete twice, get and list again; the instance is deleted at the
/// end whatever failed on the way.
async fn lifecycle(instance: &ProviderInstance, spec: &InstanceSpec, report: &mut Report) {
    let first = instance.create(spec.clone()).await;
    let first = match first {
        Ok(first) => {
            report.record("create", checks::created(&first));
            first
        }
        Err(_) => {
            report.record("create", checks::succeeded(&first, "create"));
            report.skip(&LIFECYCLE[3..], "create failed");
            return;
        }
    };
    let id = first.provider_id.clone();
    let again = instance.create(spec.clone()).await;
    report.record(
        "create-idempotent",
        and_then(&again, "create", |a| checks::idempotent(&first, a)),
    );
    if let Ok(again) = &again
        && again.provider_id != id
    {
        // A second instance is a leak on a real cloud: remove it whatever the verdict.
        let _ = instance.delete(&again.provider_id).await;
    }
    let owner: &Owner = &spec.owner;
    let got = instance.get(&id).await;
    report.record(
        "get-after-create",
        and_then(&got, "get", |g| checks::got_same(&id, owner, g)),
    );
    let list = instance.list().await;
    report.record(
        "list-shows-owner",
        and_then(&list, "list", |l| checks::listed(&id, owner, l)),
    );
    let deleted = report.record(
        "delete",
        checks::succeeded(&instance.delete(&id).await, "delete"),
    );
    report.record(
        "delete-twice",
        checks::succeeded(&instance.delete(&id).await, "a second delete"),
    );
    if !deleted {
        report.skip(&LIFECYCLE[8..], "delete failed");
        return;
    }
    report.record(
        "get-after-delete-is-not-found",
        checks::not_found(&id, &instance.get(&id).await),
    );
    let list = instance.list().await;
    report.record(
        "list-after-delete-omits-it",
        and_then(&list, "list", |l| checks::not_listed(&id, l)),
    );
}

fn and_then<T>(
    result: &Result<T, crate::provider::plugins::CallError>,
    what: &str,
    judge: impl FnOnce(&T) -> Verdict,
) -> Verdict {
    match result {
        Ok(value) => judge(value),
        Err(_) => checks::succeeded(result, what),
    }
}
