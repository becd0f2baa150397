//! Thin, typed helpers over the host capabilities.

pub use crate::bindings::proxy_operator::provider::http::{HttpError, Request, Response};
pub use crate::bindings::proxy_operator::provider::kube;
pub use crate::bindings::proxy_operator::provider::libvirt;
pub use crate::bindings::proxy_operator::provider::log::Level;

use crate::{ProviderError, transient};

/// Writes a log line through the host (it adds the plugin and provider instance names).
pub fn log(level: Level, message: &str, fields: &[(&str, &str)]) {
    let fields: Vec<(String, String)> = fields
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    crate::bindings::proxy_operator::provider::log::log(level, message, &fields);
}

/// Sends an HTTP request through the host.
pub fn http_send(request: &Request) -> Result<Response, HttpError> {
    crate::bindings::proxy_operator::provider::http::send(request)
}

/// A JSON request with `content-type: application/json`.
pub fn json_request(method: &str, url: &str, body: Option<&serde_json::Value>) -> Request {
    let mut headers = vec![("accept".to_string(), "application/json".to_string())];
    let body = match body {
        Some(value) => {
            headers.push(("content-type".to_string(), "application/json".to_string()));
            serde_json::to_vec(value).unwrap_or_default()
        }
        None => Vec::new(),
    };
    Request {
        method: method.to_string(),
        url: url.to_string(),
        headers,
        body,
        timeout_ms: None,
    }
}

impl From<HttpError> for ProviderError {
    /// The usual classification: a refused grant stays `denied`; network trouble is transient.
    fn from(err: HttpError) -> Self {
        match err {
            HttpError::Denied(m) => ProviderError::Denied(m),
            HttpError::InvalidRequest(m) => {
                ProviderError::Permanent(format!("invalid request: {m}"))
            }
            HttpError::Timeout(m) => transient(format!("timeout: {m}"), None),
            HttpError::Transport(m) => transient(format!("transport: {m}"), None),
            HttpError::TooLarge(m) => ProviderError::Permanent(format!("too large: {m}")),
        }
    }
}

impl From<kube::KubeError> for ProviderError {
    /// The usual classification: the grant's refusals stay `denied`; a conflict or a network
    /// problem is worth retrying; what the API server rejects needs a changed object.
    fn from(err: kube::KubeError) -> Self {
        use kube::KubeError as E;
        match err {
            E::Denied(m) => ProviderError::Denied(m),
            E::NotFound(m) => ProviderError::NotFound(m),
            E::Unauthorized(m) => ProviderError::Unauthorized(m),
            E::Invalid(m) => ProviderError::Permanent(m),
            E::Conflict(m) | E::Transport(m) => transient(m, None),
        }
    }
}

/// The object `kind` named `name` of the granted namespace, `None` when there is none.
pub fn kube_get_if_present(
    api_version: &str,
    kind: &str,
    name: &str,
) -> Result<Option<String>, ProviderError> {
    match kube::get(api_version, kind, name) {
        Ok(object) => Ok(Some(object)),
        Err(kube::KubeError::NotFound(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Deletes the object `kind` named `name`; one already gone is fine (a provider's `delete` is
/// called again after a retry or a restart).
pub fn kube_delete_if_present(
    api_version: &str,
    kind: &str,
    name: &str,
) -> Result<(), ProviderError> {
    match kube::delete(api_version, kind, name) {
        Ok(()) | Err(kube::KubeError::NotFound(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Maps an HTTP status that is not a success to a provider error, the way most cloud APIs mean it.
pub fn status_error(status: u16, body: &[u8]) -> ProviderError {
    let text = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
    let message = format!("HTTP {status}: {text}");
    match status {
        404 => ProviderError::NotFound(message),
        401 | 403 => ProviderError::Unauthorized(message),
        429 => ProviderError::Quota(message),
        408 | 500..=599 => transient(message, None),
        _ => ProviderError::Permanent(message),
    }
}
