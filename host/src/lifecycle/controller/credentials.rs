//! The controller's side of proxy credentials (see `crate::provider::credentials`): the Secret read or made
//! before a create, and a changed Secret handed to the provider of a running proxy.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};

use super::decide::{Effects, ProxyEvent};
use crate::api::conditions;
use crate::api::{CredentialsStatus, Proxy, ProxyStatus};
use crate::leasing::leases::ProxyKey;
use crate::provider::credentials::{self, InvalidCredentials, ProxyLogin};
use crate::provider::plugins::ProviderInstance;

/// The condition that says whether the proxy requires the credentials its Secret holds.
pub const CONDITION: &str = "CredentialsCurrent";

/// The Proxy's credentials from its Secret, which is made (with a random password) when it does
/// not exist or has no password. `Ok(Err(_))`: the Secret holds something unusable.
pub async fn current_login(
    client: &Client,
    cached: &Store<Secret>,
    proxy: &Proxy,
) -> Result<Result<ProxyLogin, InvalidCredentials>, kube::Error> {
    let namespace = proxy.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let name = credentials::secret_name(&proxy.name_any());
    // The watched copy first: a reconcile of a running proxy costs no request to the API server.
    // (A change reconciles the Proxy only once the store has it.) Not in the store: a new
    // Proxy's, almost always, so it is created at once rather than first asked for (a 404 per
    // new Proxy: 10 000 requests in a pool's scale-up, docs/performance.md); one that exists
    // answers 409 and is read.
    let mut cached = cached.get(&ObjectRef::new(&name).within(&namespace));
    let mut exists = cached.is_some();
    // Twice at most: a create that lost a race with another writer reads what won.
    for _ in 0..2 {
        let found = match cached.take() {
            Some(secret) => Some(Secret::clone(&secret)),
            None if exists => secrets.get_opt(&name).await?,
            None => None,
        };
        let Some(secret) = found else {
            let login = ProxyLogin::generate(&proxy.name_any());
            match secrets
                .create(
                    &PostParams::default(),
                    &credentials::secret_for(proxy, &login),
                )
                .await
            {
                Ok(_) => return Ok(Ok(login)),
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    exists = true;
                    continue;
                }
                Err(e) => return Err(e),
            }
        };
        match ProxyLogin::from_secret(&secret) {
            Ok(Some(login)) => return Ok(Ok(login)),
            Err(invalid) => return Ok(Err(invalid)),
            // No password: a new one (a rotation by deleting the key).
            Ok(None) => {
                let username = secret
                    .data
                    .as_ref()
                    .and_then(|d| d.get(credentials::USERNAME_KEY))
                    .and_then(|v| String::from_utf8(v.0.clone()).ok())
                    .filter(|u| !u.is_empty())
                    .unwrap_or_else(|| proxy.name_any());
                let login = ProxyLogin::generate(&username);
                let patch = serde_json::json!({"stringData": {
                    credentials::USERNAME_KEY: login.username(),
                    credentials::PASSWORD_KEY: login.password(),
                }});
                secrets
                    .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                    .await?;
                return Ok(Ok(login));
            }
        }
    }
    Err(kube::Error::Service(
        format!("Secret {name} was created and deleted again while being read").into(),
    ))
}

/// The login a proxy of `provider` requires: an upstream's, from its provider instance's
/// `upstream.credentials` (read now); else the Proxy's own Secret's, for a plugin that can make
/// its squid require one. `Ok(Ok(None))`: none. `Ok(Err(_))`: the source holds something unusable.
pub async fn login_for(
    client: &Client,
    cached: &Store<Secret>,
    provider: &ProviderInstance,
    proxy: &Proxy,
) -> Result<Result<Option<ProxyLogin>, InvalidCredentials>, kube::Error> {
    if let Some(upstream) = provider.upstream() {
        return Ok(upstream.login(provider.name()));
    }
    if !provider.plugin().supports_credentials() {
        return Ok(Ok(None));
    }
    Ok(current_login(client, cached, proxy).await?.map(Some))
}

/// Fills `book` from every credentials Secret the operator made (by their label), keyed by the
/// Proxy that owns each. The health engine uses a login only when it matches the fingerprint in
/// the Proxy's status, so a Secret changed but not yet applied is never taken for the proxy's.
/// A failure is logged: the controller fills the book as it reconciles.
pub async fn prefill(
    client: &Client,
    namespace: Option<&str>,
    book: &credentials::CredentialsBook,
) {
    let secrets: Api<Secret> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let params = kube::api::ListParams::default().labels(crate::api::labels::SECRET_LABEL);
    let list = match crate::support::kubeclient::list_all(&secrets, &params).await {
        Ok(list) => list,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the proxies' credentials Secrets; the controller reads them one by one");
            return;
        }
    };
    for secret in list {
        let proxy = secret
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.kind == "Proxy")
            .map(|o| (o.name.clone(), o.uid.clone()));
        if let (Some((name, uid)), Ok(Some(login))) = (proxy, ProxyLogin::from_secret(&secret)) {
            let namespace = secret.namespace().unwrap_or_default();
            book.set(
                ProxyKey {
                    namespace: namespace.into(),
                    name: name.into(),
                },
                &uid,
                login,
            );
        }
    }
}

/// `CredentialsCurrent`: the proxy requires the credentials in its Secret.
fn set_current(status: &mut ProxyStatus, generation: Option<i64>) {
    conditions::set_named(
        &mut status.conditions,
        CONDITION,
        true,
        "Applied",
        "the proxy requires the credentials in its Secret",
        generation,
    );
}

/// After a create that was given the login the status records: the proxy requires it, said in
/// the same status write as the create's outcome (the next reconcile's [`keep_current`] finds
/// the same; said only there, every new Proxy cost one more status write).
pub fn created_with_login(status: &mut ProxyStatus, generation: Option<i64>) {
    if status.credentials.is_some() && status.provider_id.is_some() {
        set_current(status, generation);
    }
}

/// What the status records for credentials about to be given to the provider.
pub fn applied(proxy: &Proxy, login: &ProxyLogin) -> CredentialsStatus {
    CredentialsStatus {
        secret_name: credentials::secret_name(&proxy.name_any()),
        fingerprint: login.fingerprint(&proxy.uid().unwrap_or_default()),
    }
}

/// [`applied`], naming where an upstream's login comes from instead of the Proxy's own Secret.
pub fn applied_for(
    provider: &ProviderInstance,
    proxy: &Proxy,
    login: &ProxyLogin,
) -> CredentialsStatus {
    match provider.upstream() {
        Some(upstream) => CredentialsStatus {
            secret_name: upstream.source(),
            ..applied(proxy, login)
        },
        None => applied(proxy, login),
    }
}

/// What to do about the credentials of a running proxy whose status says `recorded` were applied
/// and whose Secret now holds `current`.
#[derive(Debug, PartialEq)]
pub enum Rotation {
    /// The same: nothing to do.
    Current,
    /// The Secret changed: give the provider the new ones.
    Rotate,
}

pub fn rotation(proxy: &Proxy, recorded: &CredentialsStatus, current: &ProxyLogin) -> Rotation {
    if applied(proxy, current).fingerprint == recorded.fingerprint {
        Rotation::Current
    } else {
        Rotation::Rotate
    }
}

/// After a `get` of a running proxy: keeps the credentials book current, and rotates the
/// proxy's credentials when its Secret changed. Changes `effects` (status, events) to say what
/// happened; a Kubernetes error is the reconcile's.
pub async fn keep_current(
    client: &Client,
    cached: &Store<Secret>,
    book: &credentials::CredentialsBook,
    provider: &ProviderInstance,
    proxy: &Proxy,
    effects: &mut Effects,
) -> Result<(), kube::Error> {
    let key = ProxyKey::of(proxy);
    let Some(recorded) = effects.status.credentials.clone() else {
        book.remove(&key);
        return Ok(());
    };
    let Some(provider_id) = effects.status.provider_id.clone() else {
        return Ok(());
    };
    let generation = proxy.metadata.generation;
    let current = match login_for(client, cached, provider, proxy).await? {
        Ok(Some(login)) => login,
        // An upstream that needs a login no more.
        Ok(None) => {
            effects.status.credentials = None;
            book.remove(&key);
            return Ok(());
        }
        Err(invalid) => {
            not_current(
                &mut effects.status,
                "InvalidSecret",
                &invalid.to_string(),
                generation,
            );
            effects
                .events
                .push(warning("InvalidCredentials", invalid.to_string()));
            return Ok(());
        }
    };
    if rotation(proxy, &recorded, &current) == Rotation::Current {
        book.set(key, &proxy.uid().unwrap_or_default(), current);
        set_current(&mut effects.status, generation);
        return Ok(());
    }
    let handed = match provider.upstream() {
        // The upstream requires what its source says now: nothing to give the plugin.
        Some(_) => Ok(()),
        None => {
            provider
                .set_credentials(&provider_id, current.hashed())
                .await
        }
    };
    match handed {
        Ok(()) => {
            effects.status.credentials = Some(applied_for(provider, proxy, &current));
            book.set(key, &proxy.uid().unwrap_or_default(), current);
            conditions::set_named(
                &mut effects.status.conditions,
                CONDITION,
                true,
                "Rotated",
                "the proxy now requires the credentials in its Secret",
                generation,
            );
            effects.events.push(ProxyEvent {
                type_: EventType::Normal,
                reason: "CredentialsRotated",
                message: format!(
                    "the proxy requires the new credentials of Secret {}",
                    recorded.secret_name
                ),
            });
        }
        // The old credentials stay in force (and in the book, while this process has them).
        Err(e) => {
            let message = format!(
                "the Secret {} changed, but provider {} could not give the proxy the new credentials: {e}",
                recorded.secret_name,
                provider.name()
            );
            not_current(&mut effects.status, "RotationFailed", &message, generation);
            effects
                .events
                .push(warning("CredentialsNotRotated", message));
        }
    }
    Ok(())
}

/// A Proxy whose credentials Secret is unusable is not created: the condition says which key to
/// fix. Looked at again soon (a Secret the operator did not make is not watched).
pub fn invalid_secret(
    proxy: &Proxy,
    mut status: ProxyStatus,
    invalid: &InvalidCredentials,
) -> Effects {
    let message = invalid.to_string();
    not_current(
        &mut status,
        "InvalidSecret",
        &message,
        proxy.metadata.generation,
    );
    status.last_error = Some(message.clone());
    Effects {
        status,
        events: vec![warning("InvalidCredentials", message)],
        next: super::decide::NextReconcile::Requeue(std::time::Duration::from_secs(30)),
    }
}

fn not_current(status: &mut ProxyStatus, reason: &str, message: &str, generation: Option<i64>) {
    conditions::set_named(
        &mut status.conditions,
        CONDITION,
        false,
        reason,
        message,
        generation,
    );
}

fn warning(reason: &'static str, message: String) -> ProxyEvent {
    ProxyEvent {
        type_: EventType::Warning,
        reason,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy(uid: &str) -> Proxy {
        let mut proxy = Proxy::new(
            "egress-1",
            serde_json::from_value(serde_json::json!({"provider": "p"})).unwrap(),
        );
        proxy.metadata.namespace = Some("crawlers".into());
        proxy.metadata.uid = Some(uid.into());
        proxy
    }

    #[test]
    fn a_changed_secret_is_rotated_an_unchanged_one_is_not() {
        let login = ProxyLogin::generate("egress-1");
        let recorded = applied(&proxy("u-1"), &login);
        assert_eq!(recorded.secret_name, "egress-1-proxy-credentials");
        assert_eq!(
            rotation(&proxy("u-1"), &recorded, &login),
            Rotation::Current
        );
        let new = ProxyLogin::generate("egress-1");
        assert_eq!(rotation(&proxy("u-1"), &recorded, &new), Rotation::Rotate);
        // A Proxy recreated under the same name is another proxy.
        assert_eq!(rotation(&proxy("u-2"), &recorded, &login), Rotation::Rotate);
    }

    /// A create given the login says `CredentialsCurrent` in its own status write; a Proxy
    /// without credentials (or not created) says nothing of them.
    #[test]
    fn a_create_given_the_login_says_the_credentials_are_current() {
        let login = ProxyLogin::generate("egress-1");
        let mut status = ProxyStatus {
            credentials: Some(applied(&proxy("u-1"), &login)),
            provider_id: Some("i-1".into()),
            ..Default::default()
        };
        created_with_login(&mut status, Some(1));
        let condition = status
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION)
            .expect("set");
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("True", "Applied")
        );
        for mut status in [
            ProxyStatus {
                provider_id: Some("i-1".into()),
                ..Default::default()
            },
            ProxyStatus {
                credentials: Some(applied(&proxy("u-1"), &login)),
                ..Default::default()
            },
        ] {
            created_with_login(&mut status, Some(1));
            assert!(status.conditions.is_empty());
        }
    }
}
