//! `grants.http`: the hosts a provider instance may call, and the credentials the host adds.

use std::time::Duration;

use serde::Deserialize;

use super::GrantError;
use super::secret::{SecretSource, SecretValue};
use crate::provider::capabilities::http::AllowPattern;

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
    /// The header name, e.g. `Authorization`; none with `valueFrom.awsCredentials` (SigV4
    /// sets its own headers).
    #[serde(default)]
    pub header: String,
    /// Text put before the secret, e.g. `Bearer `.
    #[serde(default)]
    pub prefix: String,
    pub value_from: SecretSource,
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
        let header = match (&value, c.header.as_str()) {
            // SigV4 sets Authorization (and X-Amz-Date, X-Amz-Security-Token) itself.
            (SecretValue::AwsCredentials(_), "") if c.prefix.is_empty() => {
                reqwest::header::AUTHORIZATION
            }
            (SecretValue::AwsCredentials(_), _) => {
                return Err("header, prefix: SigV4 signing (valueFrom.awsCredentials) sets Authorization and the X-Amz-* headers itself; leave header and prefix out".into());
            }
            (_, "") => {
                return Err(
                    "header: required (the header the secret goes into, e.g. Authorization)".into(),
                );
            }
            (_, name) => reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("header `{name}` is not a valid header name"))?,
        };
        Ok(ValidCredential {
            pattern,
            header,
            prefix: c.prefix.clone(),
            value,
        })
    }
}
