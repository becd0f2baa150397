//! Keeps a [`CredentialBook`] current: a watch on the Secrets labelled
//! [`GATEWAY_CREDENTIAL_LABEL`]`=true` (never all Secrets), each parsed as it comes, so a
//! changed or deleted Secret changes what its credential may do within the watch event's
//! delay. A Secret refused gets a Warning Event naming the field and the fix (on the replica
//! serving the discovery API only, so a standby does not repeat it); no log or Event ever
//! holds a credential.

use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};

use super::team::{CredentialBook, Found, SecretKey, TeamCredential, TokenDigest, parse};
use crate::api::labels::GATEWAY_CREDENTIAL_LABEL;
use crate::support::events::{self, EventType, Recorder};

/// Who is told about a refused Secret.
pub struct Refusals {
    pub recorder: Recorder,
    /// Whether this replica publishes (the one serving the discovery API).
    pub publish: Arc<dyn Fn() -> bool + Send + Sync>,
}

/// Watches the credential Secrets of `namespace` (or every namespace) into `book`, until
/// dropped.
pub async fn watch(
    client: kube::Client,
    namespace: Option<String>,
    book: Arc<CredentialBook>,
    refusals: Option<Refusals>,
) {
    let api: Api<Secret> = match &namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let selector = format!("{GATEWAY_CREDENTIAL_LABEL}=true");
    let config = watcher::Config::default().labels(&selector);
    let mut listing: Vec<(SecretKey, Secret)> = Vec::new();
    let mut events = watcher(api, config).default_backoff().boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listing.clear(),
            Ok(watcher::Event::InitApply(secret)) => listing.push((key(&secret), secret)),
            Ok(watcher::Event::InitDone) => {
                let mut accepted = Vec::new();
                for (key, secret) in listing.drain(..) {
                    if let Some(credential) = accepted_or_told(&secret, refusals.as_ref()).await {
                        accepted.push((key, credential));
                    }
                }
                book.replace_all(accepted);
                tracing::info!(credentials = book.len(), "gateway team credentials listed");
            }
            Ok(watcher::Event::Apply(secret)) => {
                let credential = accepted_or_told(&secret, refusals.as_ref()).await;
                let digest = credential.as_ref().map(|(digest, _)| *digest);
                book.set(key(&secret), credential);
                if let Some(Found::Ambiguous(secrets)) = digest.map(|d| book.find(&d)) {
                    tracing::warn!(secrets = ?secrets, "one gateway credential is in several Secrets: it logs in nowhere until only one holds it");
                }
            }
            Ok(watcher::Event::Delete(secret)) => {
                let key = key(&secret);
                tracing::info!(namespace = %key.0, secret = %key.1, "gateway team credential deleted: it no longer logs in");
                book.set(key, None);
            }
            Err(e) => {
                tracing::warn!(error = %e, selector = %selector, "watching gateway credential Secrets (is list/watch on secrets granted?)");
            }
        }
    }
}

fn key(secret: &Secret) -> SecretKey {
    (secret.namespace().unwrap_or_default(), secret.name_any())
}

/// The Secret's credential, logged (by name, never by value); or its refusal logged and told
/// on the Secret.
async fn accepted_or_told(
    secret: &Secret,
    refusals: Option<&Refusals>,
) -> Option<(TokenDigest, TeamCredential)> {
    let (namespace, name) = key(secret);
    match parse(secret) {
        Ok((digest, credential)) => {
            tracing::info!(namespace = %namespace, secret = %name, pools = ?credential.pools, "gateway team credential accepted");
            Some((digest, credential))
        }
        Err(refusal) => {
            tracing::warn!(namespace = %namespace, secret = %name, reason = %refusal, "gateway team credential refused");
            if let Some(refusals) = refusals.filter(|r| (r.publish)()) {
                events::publish(
                    &refusals.recorder,
                    &secret.object_ref(&()),
                    EventType::Warning,
                    "CredentialRefused",
                    "AcceptCredential",
                    format!("not a gateway credential: {refusal}"),
                )
                .await;
            }
            None
        }
    }
}
