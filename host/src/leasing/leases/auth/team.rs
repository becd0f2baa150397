//! Gateway credentials a team owns (docs/gateway.md, "Team credentials"): a Secret of type
//! [`GATEWAY_CREDENTIAL_TYPE`] labelled [`GATEWAY_CREDENTIAL_LABEL`] in the team's namespace,
//! holding a long random `credential` and the `pools` of that namespace it may use. What a
//! Secret says is parsed here ([`parse`], pure); the [`CredentialBook`] maps the digest of each
//! accepted credential to its grant, kept current by the watch in `team_watch`.
//!
//! The book keys on SHA-256 digests: no credential is kept in memory, and a lookup compares
//! digests, so its timing tells nothing of the credential.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use sha2::{Digest, Sha256};

use super::review::Scope;
use crate::api::labels::{GATEWAY_CREDENTIAL_LABEL, GATEWAY_CREDENTIAL_TYPE};
use crate::leasing::leases::store::{PoolKey, Reach};

/// The Secret's key holding the credential.
pub const CREDENTIAL_KEY: &str = "credential";
/// The Secret's key listing the pools it may use.
pub const POOLS_KEY: &str = "pools";
/// Shortest credential accepted: 32 characters (`openssl rand -hex 24` makes 48).
pub const MIN_CREDENTIAL_CHARS: usize = 32;
/// Longest credential accepted (a bound on what a Secret makes the operator hash).
pub const MAX_CREDENTIAL_CHARS: usize = 1024;
/// What a lease granted to a credential records as its holder: `credential:<ns>/<secret>`.
/// Kubernetes users with this prefix are refused, so none can act on such a lease.
pub const HOLDER_PREFIX: &str = "credential:";

/// The pools of its namespace a credential may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CredentialPools {
    /// `*`: every pool of the namespace.
    All,
    /// These pools (names in the Secret's namespace), at least one.
    Named(BTreeSet<String>),
}

/// One accepted credential: which Secret it is, and what it may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TeamCredential {
    pub namespace: Arc<str>,
    pub secret: String,
    pub pools: CredentialPools,
    /// `credential:<namespace>/<secret>`: the holder of its leases and sessions.
    pub holder: String,
}

impl TeamCredential {
    /// What a request of this credential for `scope` may reach, or why not. Only pools of its
    /// own namespace: a pool it may use is that pool's reach; without a pool named (an empty
    /// gateway username), the one pool it lists, or its namespace for `*`.
    pub fn reach(&self, scope: &Scope) -> Result<Reach, String> {
        let own = |namespace: &str| *namespace == *self.namespace;
        let reach = match (scope, &self.pools) {
            (Scope::Pool(pool), CredentialPools::All) if own(&pool.namespace) => {
                Some(Reach::Pool((*pool).clone()))
            }
            (Scope::Pool(pool), CredentialPools::Named(names))
                if own(&pool.namespace) && names.contains(&*pool.name) =>
            {
                Some(Reach::Pool((*pool).clone()))
            }
            (Scope::Namespace(ns), CredentialPools::All) if own(ns) => {
                Some(Reach::Namespace(self.namespace.clone()))
            }
            (Scope::Cluster, CredentialPools::All) => {
                Some(Reach::Namespace(self.namespace.clone()))
            }
            (Scope::Cluster, CredentialPools::Named(names)) if names.len() == 1 => {
                names.first().map(|name| {
                    Reach::Pool(PoolKey {
                        namespace: self.namespace.clone(),
                        name: name.as_str().into(),
                    })
                })
            }
            _ => None,
        };
        reach.ok_or_else(|| {
            format!(
                "the gateway credential {}/{} may use only {} (its Secret's `{POOLS_KEY}`), not {scope}; name one of them (gateway username pool-{}.<name>)",
                self.namespace,
                self.secret,
                self.pools_shown(),
                self.namespace
            )
        })
    }

    fn pools_shown(&self) -> String {
        match &self.pools {
            CredentialPools::All => format!("the pools of namespace {}", self.namespace),
            CredentialPools::Named(names) => format!(
                "the pools {} of namespace {}",
                names.iter().cloned().collect::<Vec<_>>().join(","),
                self.namespace
            ),
        }
    }
}

/// Why a labelled Secret is not a credential: names the Secret's field and the fix. Never
/// holds the credential.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refusal(pub String);

/// The digest and grant a gateway credential Secret makes, or why it makes none.
pub fn parse(secret: &Secret) -> Result<(TokenDigest, TeamCredential), Refusal> {
    let namespace = secret.namespace().unwrap_or_default();
    let name = secret.name_any();
    let type_ = secret.type_.as_deref().unwrap_or("Opaque");
    if type_ != GATEWAY_CREDENTIAL_TYPE {
        return Err(Refusal(format!(
            "type: `{type_}`; a Secret labelled {GATEWAY_CREDENTIAL_LABEL} must be of type {GATEWAY_CREDENTIAL_TYPE} (kubectl create secret generic … --type={GATEWAY_CREDENTIAL_TYPE})"
        )));
    }
    let field = |key: &str| -> Result<String, Refusal> {
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|b| b.0.clone())
            .or_else(|| {
                secret
                    .string_data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .map(|s| s.clone().into_bytes())
            })
            .ok_or_else(|| Refusal(format!("data.{key}: missing; {}", hint(key))))?;
        String::from_utf8(bytes)
            .map(|s| s.trim().to_string())
            .map_err(|_| Refusal(format!("data.{key}: not UTF-8 text; {}", hint(key))))
    };
    let credential = field(CREDENTIAL_KEY)?;
    check_credential(&credential)?;
    let pools = parse_pools(&field(POOLS_KEY)?, &namespace)?;
    let digest: TokenDigest = Sha256::digest(credential.as_bytes()).into();
    Ok((
        digest,
        TeamCredential {
            holder: format!("{HOLDER_PREFIX}{namespace}/{name}"),
            namespace: namespace.into(),
            secret: name,
            pools,
        },
    ))
}

fn hint(key: &str) -> &'static str {
    match key {
        CREDENTIAL_KEY => {
            "set it to a long random value, e.g. --from-literal=credential=\"$(openssl rand -hex 24)\""
        }
        _ => {
            "set it to the pools of this namespace the credential may use, comma-separated, or `*` for all, e.g. --from-literal=pools=pool-a"
        }
    }
}

/// Long enough, and only visible ASCII (what a proxy URL's password and a bearer token carry).
/// The refusal never shows the value, nor its length.
fn check_credential(credential: &str) -> Result<(), Refusal> {
    let chars = credential.chars().count();
    if chars < MIN_CREDENTIAL_CHARS {
        return Err(Refusal(format!(
            "data.{CREDENTIAL_KEY}: shorter than {MIN_CREDENTIAL_CHARS} characters; {}",
            hint(CREDENTIAL_KEY)
        )));
    }
    if chars > MAX_CREDENTIAL_CHARS {
        return Err(Refusal(format!(
            "data.{CREDENTIAL_KEY}: longer than {MAX_CREDENTIAL_CHARS} characters; {}",
            hint(CREDENTIAL_KEY)
        )));
    }
    if !credential.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Refusal(format!(
            "data.{CREDENTIAL_KEY}: only visible ASCII characters (no spaces); {}",
            hint(CREDENTIAL_KEY)
        )));
    }
    Ok(())
}

/// `*`, or pool names of `namespace` (a name may be written `namespace/name` for its own
/// namespace only).
fn parse_pools(value: &str, namespace: &str) -> Result<CredentialPools, Refusal> {
    let items: Vec<&str> = value
        .split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .collect();
    if items == ["*"] {
        return Ok(CredentialPools::All);
    }
    if items.is_empty() {
        return Err(Refusal(format!(
            "data.{POOLS_KEY}: empty; {}",
            hint(POOLS_KEY)
        )));
    }
    let mut names = BTreeSet::new();
    for item in items {
        let name = match item.split_once('/') {
            Some((ns, name)) if ns == namespace => name,
            Some((ns, _)) => {
                return Err(Refusal(format!(
                    "data.{POOLS_KEY}: `{item}` is a pool of namespace {ns}; a credential in {namespace} may use only pools of {namespace}"
                )));
            }
            None => item,
        };
        if name == "*" {
            return Err(Refusal(format!(
                "data.{POOLS_KEY}: `*` stands alone (every pool of {namespace}), not in a list"
            )));
        }
        if !is_object_name(name) {
            return Err(Refusal(format!(
                "data.{POOLS_KEY}: `{item}` is not a ProxyPool name (lowercase letters, digits, `-` and `.`); {}",
                hint(POOLS_KEY)
            )));
        }
        names.insert(name.to_string());
    }
    Ok(CredentialPools::Named(names))
}

/// A DNS-1123 subdomain, as Kubernetes object names are.
fn is_object_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// SHA-256 of a credential (the same as the auth's `TokenDigest`, a request's password's).
pub type TokenDigest = [u8; 32];

/// A Secret, by namespace and name.
pub type SecretKey = (String, String);

/// What a credential's digest finds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    None,
    One(Arc<TeamCredential>),
    /// The same credential in several Secrets: it works for none of them (which team's
    /// pools it meant cannot be told), until all but one are gone.
    Ambiguous(Vec<SecretKey>),
}

#[derive(Default)]
struct Inner {
    by_secret: HashMap<SecretKey, (TokenDigest, Arc<TeamCredential>)>,
    by_digest: HashMap<TokenDigest, Vec<Arc<TeamCredential>>>,
}

impl Inner {
    fn remove(&mut self, key: &SecretKey) {
        if let Some((digest, _)) = self.by_secret.remove(key)
            && let Some(list) = self.by_digest.get_mut(&digest)
        {
            list.retain(|c| (&*c.namespace, c.secret.as_str()) != (key.0.as_str(), &*key.1));
            if list.is_empty() {
                self.by_digest.remove(&digest);
            }
        }
    }

    fn insert(&mut self, key: SecretKey, digest: TokenDigest, credential: TeamCredential) {
        self.remove(&key);
        let credential = Arc::new(credential);
        self.by_digest
            .entry(digest)
            .or_default()
            .push(credential.clone());
        self.by_secret.insert(key, (digest, credential));
    }
}

/// The accepted credentials, by digest; shared by the watch that fills it and the
/// discovery API's [`Auth`](super::Auth).
#[derive(Default)]
pub struct CredentialBook {
    inner: RwLock<Inner>,
}

impl CredentialBook {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        // Every step leaves the maps consistent: a poisoned lock is safe to keep using.
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The Secret `key` now makes `credential` (`None`: none, it was deleted or refused).
    pub fn set(&self, key: SecretKey, credential: Option<(TokenDigest, TeamCredential)>) {
        let mut inner = self.write();
        match credential {
            Some((digest, credential)) => inner.insert(key, digest, credential),
            None => inner.remove(&key),
        }
    }

    /// Every credential at once (after the watch listed them all): Secrets not among them are
    /// forgotten.
    pub fn replace_all(
        &self,
        credentials: impl IntoIterator<Item = (SecretKey, (TokenDigest, TeamCredential))>,
    ) {
        let mut fresh = Inner::default();
        for (key, (digest, credential)) in credentials {
            fresh.insert(key, digest, credential);
        }
        *self.write() = fresh;
    }

    /// The credential whose digest is `digest`.
    pub fn find(&self, digest: &TokenDigest) -> Found {
        match self.read().by_digest.get(digest).map(Vec::as_slice) {
            None | Some([]) => Found::None,
            Some([one]) => Found::One(one.clone()),
            Some(many) => Found::Ambiguous(
                many.iter()
                    .map(|c| (c.namespace.to_string(), c.secret.clone()))
                    .collect(),
            ),
        }
    }

    /// Secrets whose credential is accepted.
    pub fn len(&self) -> usize {
        self.read().by_secret.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
#[path = "team_tests.rs"]
mod tests;
