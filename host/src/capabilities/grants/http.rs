//! `grants.http`: the hosts a provider instance may call, and the credentials the host adds.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::GrantError;
use crate::capabilities::http::AllowPattern;

const DEFAULT_MAX_REQUEST_BYTES: usize = 1 << 20;
const DEFAULT_MAX_RESPONSE_BYTES: usize = 8 << 20;
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The `grants.http` section of a provider instance.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpGrant {
    /// `scheme://host[:port]` patterns; host may be `*` or `*.example.com`, port `*`.
    /// Private and loopback addresses are reachable only when a pattern names the IP itself.
    pub allow: Vec<String>,
    #[serde(default)]
    pub credentials: Vec<CredentialGrant>,
    #[serde(default)]
    pub max_request_bytes: Option<usize>,
    #[serde(default)]
    pub max_response_bytes: Option<usize>,
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

/// A header the host adds to requests to matching URLs.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CredentialGrant {
    /// A pattern like those in `allow`: requests matching it get the header.
    pub url: String,
    /// The header name, e.g. `Authorization`.
    pub header: String,
    /// Text put before the secret, e.g. `Bearer `.
    #[serde(default)]
    pub prefix: String,
    pub value_from: SecretSource,
}

/// Where a credential's secret comes from, as written: exactly one of `env`, `file` or
/// `gcpServiceAccountKey` (checked into a [`SecretValue`]).
#[derive(Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SecretSource {
    /// An environment variable of the operator.
    #[serde(default)]
    pub env: Option<String>,
    /// A file, e.g. a mounted Secret key.
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// A Google service-account key file (JSON): the value is an OAuth access token the host
    /// mints from it (scope cloud-platform) and renews before it expires.
    #[serde(default)]
    pub gcp_service_account_key: Option<PathBuf>,
}

impl std::fmt::Debug for SecretSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match SecretValue::from_source(self) {
            Ok(value) => value.fmt(f),
            Err(_) => write!(f, "unset"),
        }
    }
}

/// Where a credential's secret is read from. Read on every request, so a rotated file (a
/// mounted Secret) is picked up; service-account tokens are minted and renewed by the host.
#[derive(Clone, PartialEq)]
pub enum SecretValue {
    Env(String),
    File(PathBuf),
    GcpServiceAccountKey(PathBuf),
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Where it comes from, never the value.
        match self {
            SecretValue::Env(name) => write!(f, "env:{name}"),
            SecretValue::File(path) => write!(f, "file:{}", path.display()),
            SecretValue::GcpServiceAccountKey(path) => {
                write!(f, "gcpServiceAccountKey:{}", path.display())
            }
        }
    }
}

impl SecretValue {
    pub(crate) fn from_source(source: &SecretSource) -> Result<Self, String> {
        match (&source.env, &source.file, &source.gcp_service_account_key) {
            (Some(name), None, None) => Ok(SecretValue::Env(name.clone())),
            (None, Some(path), None) => Ok(SecretValue::File(path.clone())),
            (None, None, Some(path)) => Ok(SecretValue::GcpServiceAccountKey(path.clone())),
            _ => Err("valueFrom: set exactly one of `env` (a variable name), `file` (a path) or `gcpServiceAccountKey` (a key file path)".into()),
        }
    }
}

/// A checked `grants.http`.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidHttpGrant {
    pub allow: Vec<AllowPattern>,
    pub credentials: Vec<ValidCredential>,
    pub max_request_bytes: usize,
    pub max_response_bytes: usize,
    /// The longest a request may take; a plugin's own timeout is clamped to it.
    pub timeout: Duration,
}

/// A checked credential: a header for the URLs its pattern matches.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidCredential {
    pub pattern: AllowPattern,
    pub header: reqwest::header::HeaderName,
    pub prefix: String,
    pub value: SecretValue,
}

impl ValidHttpGrant {
    /// Checks the patterns and credentials; the error names the entry.
    pub fn parse(grant: &HttpGrant) -> Result<Self, GrantError> {
        let allow = grant
            .allow
            .iter()
            .enumerate()
            .map(|(index, p)| {
                AllowPattern::parse(p).map_err(|message| GrantError::HttpAllow { index, message })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let credentials = grant
            .credentials
            .iter()
            .enumerate()
            .map(|(index, c)| {
                ValidCredential::parse(c, &allow)
                    .map_err(|message| GrantError::HttpCredential { index, message })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ValidHttpGrant {
            allow,
            credentials,
            max_request_bytes: grant.max_request_bytes.unwrap_or(DEFAULT_MAX_REQUEST_BYTES),
            max_response_bytes: grant
                .max_response_bytes
                .unwrap_or(DEFAULT_MAX_RESPONSE_BYTES),
            timeout: grant
                .timeout_seconds
                .map(Duration::from_secs)
                .unwrap_or(DEFAULT_TIMEOUT),
        })
    }
}

impl ValidCredential {
    fn parse(c: &CredentialGrant, allow: &[AllowPattern]) -> Result<Self, String> {
        let pattern = AllowPattern::parse(&c.url).map_err(|m| format!("url: {m}"))?;
        let value = SecretValue::from_source(&c.value_from)?;
        if !allow.iter().any(|a| a.covers(&pattern)) {
            return Err(format!(
                "url `{}` is not covered by grants.http.allow, so the credential could never be used",
                c.url
            ));
        }
        let header = reqwest::header::HeaderName::from_bytes(c.header.as_bytes())
            .map_err(|_| format!("header `{}` is not a valid header name", c.header))?;
        Ok(ValidCredential {
            pattern,
            header,
            prefix: c.prefix.clone(),
            value,
        })
    }
}
