//! Every label, annotation and finalizer of `proxy-operator.dev` the operator writes or selects on,
//! in one place: the vocabulary other controllers, the kubectl plugin and users read.

/// Label marking the ProviderHealth objects of one operator installation.
pub const OPERATOR_LABEL: &str = "proxy-operator.dev/operator-id";
/// The label on every object a provider instance applies; its value is the instance's name.
pub const PROVIDER_LABEL: &str = "proxy-operator.dev/provider";
/// On every credentials Secret, the UID of its Proxy: the controller watches these only.
pub const SECRET_LABEL: &str = "proxy-operator.dev/credentials-for";
/// Which table an object belongs to (its value: the table's name, or a digest of a long one).
pub const TABLE_LABEL: &str = "proxy-operator.dev/lease-table";
/// `journal` or `checkpoint`.
pub const OBJECT_LABEL: &str = "proxy-operator.dev/lease-object";
/// The checkpoint generation an object was written under.
pub const GENERATION_LABEL: &str = "proxy-operator.dev/lease-generation";
/// The label a ProxyPool puts on the Proxies it makes; its value is the pool's name (the pool is
/// in the Proxy's namespace).
pub const POOL_LABEL: &str = "proxy-operator.dev/pool";
/// The annotation (`"true"`) the pool controller puts on a Proxy it is about to remove: no new
/// lease, session or renewal on it.
pub const DRAINING_ANNOTATION: &str = "proxy-operator.dev/draining";
/// The hash of the template a pool's Proxy was made from.
pub const TEMPLATE_LABEL: &str = "proxy-operator.dev/pool-template";
/// Why the pool drains it (`Recycled`, `Expired`, `TemplateChanged`, `ScaleDown`, …).
pub const DRAIN_REASON_ANNOTATION: &str = "proxy-operator.dev/drain-reason";
/// `"true"` on a Proxy of a pool: replace it (`kubectl px recycle`). The pool makes a new one
/// and drains this one within its budget (`maxSurge`, `maxUnavailable`), as for an expired one.
pub const RECYCLE_ANNOTATION: &str = "proxy-operator.dev/recycle";
/// Deleting a pool deletes its Proxies first (each through its own finalizer), also where no
/// garbage collector runs.
pub const POOL_FINALIZER: &str = "proxy-operator.dev/pool-cleanup";
/// `"true"` on a Proxy: delete the Proxy but leave its instance running.
pub const SKIP_CLEANUP_ANNOTATION: &str = "proxy-operator.dev/skip-cleanup";
/// The finalizer that keeps a Proxy until its instance is deleted.
pub const FINALIZER: &str = "proxy-operator.dev/cleanup";
/// On the leader's Pod only; the discovery Service selects `proxy-operator.dev/leader=true`.
pub const LEADER_LABEL: &str = "proxy-operator.dev/leader";
/// `"true"` on a team's gateway credential Secret (docs/gateway.md, "Team credentials"): the
/// operator watches only Secrets with this label, never all of them.
pub const GATEWAY_CREDENTIAL_LABEL: &str = "proxy-operator.dev/gateway-credential";
/// The `type` a gateway credential Secret must have: a labelled Secret of another type is
/// refused (an Event on it says so), so an unrelated Secret never becomes a credential by a
/// stray label.
pub const GATEWAY_CREDENTIAL_TYPE: &str = "proxy-operator.dev/gateway-credential";
