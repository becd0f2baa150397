//! OAuth 2.0 access tokens for Google Cloud: minted from a service-account key (the JWT bearer
//! flow of RFC 7523, as Google documents it for server-to-server apps), for credentials with
//! `valueFrom.gcpServiceAccountKey`; or fetched from the metadata server (GKE Workload
//! Identity, a GCE VM's service account: `GET …/service-accounts/ACCOUNT/token` with
//! `Metadata-Flavor: Google`), for `valueFrom.gcpMetadataServer` — no key file at all. The key
//! and the tokens stay with the host; a plugin only ever gets requests with the token already in
//! its header, and never the token itself.
//!
//! By hand rather than a Google auth crate: those bring their own HTTP and TLS stacks (hyper
//! versions, ring), while this is one signed JWT and one POST with what the host already builds.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde::Deserialize;

/// What the tokens may do: Compute Engine and the rest of Google Cloud's APIs.
pub const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// A token is renewed this long before it expires.
const RENEW_BEFORE: Duration = Duration::from_secs(120);
/// Lifetime asked for (Google's maximum).
const LIFETIME_SECONDS: u64 = 3600;

/// Why no token could be had; the message names the key file or the token endpoint, never the
/// key material.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TokenError {
    #[error("{0}")]
    Client(#[source] reqwest::Error),
    #[error("cannot read {}: {source}", path.display())]
    ReadKey {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// serde's message names the field, never the key material.
    #[error(
        "{} is not a service-account key file (client_email, private_key, token_uri): {source}",
        path.display()
    )]
    NotAKeyFile {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{0}")]
    Clock(#[source] std::time::SystemTimeError),
    /// The key cannot sign (not PKCS#8 PEM, not RSA).
    #[error("{0}")]
    Key(String),
    #[error("token endpoint {uri}: {source}")]
    Endpoint {
        uri: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("token endpoint {uri} refused the service account {account}: {status} {body}")]
    Refused {
        uri: String,
        account: String,
        status: reqwest::StatusCode,
        /// The start of the endpoint's answer.
        body: String,
    },
    #[error("token endpoint {uri} answered no token: {source}")]
    NoToken {
        uri: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The fields of a service-account key file (`gcloud iam service-accounts keys create`).
#[derive(Deserialize)]
struct ServiceAccountKey {
    client_email: String,
    private_key: String,
    #[serde(default)]
    private_key_id: Option<String>,
    token_uri: String,
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    expires_in: u64,
}

/// Where the tokens come from.
enum TokenSource {
    KeyFile(PathBuf),
    /// The metadata server's token URL (checked by the grant: its own names or loopback).
    MetadataServer(url::Url),
}

/// The tokens of one key file or metadata server, renewed when they are about to expire.
pub(crate) struct GcpTokens {
    source: TokenSource,
    client: reqwest::Client,
    /// Held while a token is minted, so concurrent calls wait for one request.
    cached: tokio::sync::Mutex<Option<(String, Instant)>>,
}

impl std::fmt::Debug for GcpTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.source {
            TokenSource::KeyFile(path) => write!(f, "GcpTokens({})", path.display()),
            TokenSource::MetadataServer(url) => write!(f, "GcpTokens({url})"),
        }
    }
}

impl GcpTokens {
    pub(crate) fn from_key_file(key_file: &Path) -> Result<Self, TokenError> {
        Self::new(TokenSource::KeyFile(key_file.to_path_buf()))
    }

    pub(crate) fn from_metadata_server(token_url: &url::Url) -> Result<Self, TokenError> {
        Self::new(TokenSource::MetadataServer(token_url.clone()))
    }

    fn new(source: TokenSource) -> Result<Self, TokenError> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .redirect(reqwest::redirect::Policy::none())
            // The metadata server is reached directly, never through an HTTP(S)_PROXY.
            .no_proxy()
            .build()
            .map_err(TokenError::Client)?;
        Ok(GcpTokens {
            source,
            client,
            cached: tokio::sync::Mutex::new(None),
        })
    }

    /// A valid access token, minted when there is none or it is about to expire. The key file
    /// is read each time a token is minted, so a rotated key (a mounted Secret) is picked up.
    pub(crate) async fn token(&self) -> Result<String, TokenError> {
        let mut cached = self.cached.lock().await;
        if let Some((token, expires)) = cached.as_ref()
            && Instant::now() + RENEW_BEFORE < *expires
        {
            return Ok(token.clone());
        }
        let (token, lifetime) = match &self.source {
            TokenSource::KeyFile(path) => self.mint(path).await?,
            TokenSource::MetadataServer(url) => self.fetch(url).await?,
        };
        *cached = Some((token.clone(), Instant::now() + lifetime));
        Ok(token)
    }

    /// The metadata server's current token for its service account (it renews them itself;
    /// `expires_in` says for how long this one holds).
    async fn fetch(&self, url: &url::Url) -> Result<(String, Duration), TokenError> {
        let failed = |source| TokenError::Endpoint {
            uri: url.to_string(),
            source,
        };
        let response = self
            .client
            .get(url.clone())
            .header("Metadata-Flavor", "Google")
            .send()
            .await
            .map_err(failed)?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(TokenError::Refused {
                uri: url.to_string(),
                account: url
                    .path_segments()
                    .and_then(|mut s| s.nth(4))
                    .unwrap_or("default")
                    .to_string(),
                status,
                body: body.chars().take(200).collect(),
            });
        }
        let body = response.bytes().await.map_err(failed)?;
        let answer: TokenAnswer =
            serde_json::from_slice(&body).map_err(|source| TokenError::NoToken {
                uri: url.to_string(),
                source,
            })?;
        tracing::debug!(%url, expires_in = answer.expires_in, "fetched a GCP access token from the metadata server");
        Ok((answer.access_token, Duration::from_secs(answer.expires_in)))
    }

    async fn mint(&self, key_file: &Path) -> Result<(String, Duration), TokenError> {
        let text = tokio::fs::read_to_string(key_file)
            .await
            .map_err(|source| TokenError::ReadKey {
                path: key_file.to_path_buf(),
                source,
            })?;
        let key: ServiceAccountKey =
            serde_json::from_str(&text).map_err(|source| TokenError::NotAKeyFile {
                path: key_file.to_path_buf(),
                source,
            })?;
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_err(TokenError::Clock)?
            .as_secs();
        let assertion = assertion(&key, now).map_err(TokenError::Key)?;
        // Its own statement: the serializer is not Send and must be gone before the await.
        let form = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer")
            .append_pair("assertion", &assertion)
            .finish();
        let response = self
            .client
            .post(&key.token_uri)
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(form)
            .send()
            .await
            .map_err(|source| TokenError::Endpoint {
                uri: key.token_uri.clone(),
                source,
            })?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(TokenError::Refused {
                uri: key.token_uri,
                account: key.client_email,
                status,
                body: body.chars().take(200).collect(),
            });
        }
        let body = response
            .bytes()
            .await
            .map_err(|source| TokenError::Endpoint {
                uri: key.token_uri.clone(),
                source,
            })?;
        let answer: TokenAnswer =
            serde_json::from_slice(&body).map_err(|source| TokenError::NoToken {
                uri: key.token_uri.clone(),
                source,
            })?;
        tracing::debug!(account = %key.client_email, expires_in = answer.expires_in, "minted a GCP access token");
        Ok((answer.access_token, Duration::from_secs(answer.expires_in)))
    }
}

/// The signed JWT (RS256) that asks the token endpoint for an access token.
fn assertion(key: &ServiceAccountKey, now: u64) -> Result<String, String> {
    let mut header = serde_json::json!({"alg": "RS256", "typ": "JWT"});
    if let Some(id) = &key.private_key_id {
        header["kid"] = id.clone().into();
    }
    let claims = serde_json::json!({
        "iss": key.client_email,
        "scope": SCOPE,
        "aud": key.token_uri,
        "iat": now,
        "exp": now + LIFETIME_SECONDS,
    });
    let signing_input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let der = pkcs8_der(&key.private_key)?;
    let pair = aws_lc_rs::signature::RsaKeyPair::from_pkcs8(&der)
        .map_err(|e| format!("private_key is not an RSA key in PKCS#8: {e}"))?;
    let mut signature = vec![0; pair.public_modulus_len()];
    pair.sign(
        &aws_lc_rs::signature::RSA_PKCS1_SHA256,
        &aws_lc_rs::rand::SystemRandom::new(),
        signing_input.as_bytes(),
        &mut signature,
    )
    .map_err(|e| format!("signing the token request: {e}"))?;
    Ok(format!(
        "{signing_input}.{}",
        URL_SAFE_NO_PAD.encode(signature)
    ))
}

/// The DER bytes of a `-----BEGIN PRIVATE KEY-----` PEM block.
fn pkcs8_der(pem: &str) -> Result<Vec<u8>, String> {
    let body = pem
        .trim()
        .strip_prefix("-----BEGIN PRIVATE KEY-----")
        .and_then(|rest| rest.trim_end().strip_suffix("-----END PRIVATE KEY-----"))
        .ok_or("private_key is not a PEM `BEGIN PRIVATE KEY` block")?;
    let base64: String = body.chars().filter(|c| !c.is_whitespace()).collect();
    STANDARD
        .decode(base64)
        .map_err(|_| "private_key is not valid base64 PEM".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 2048-bit test key, made for this test only.
    fn test_key() -> (String, aws_lc_rs::signature::UnparsedPublicKey<Vec<u8>>) {
        let pair = aws_lc_rs::rsa::KeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048).unwrap();
        use aws_lc_rs::encoding::AsDer;
        let der: aws_lc_rs::encoding::Pkcs8V1Der = pair.as_der().unwrap();
        let pem = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            STANDARD.encode(der.as_ref())
        );
        use aws_lc_rs::signature::KeyPair;
        let public = aws_lc_rs::signature::UnparsedPublicKey::new(
            &aws_lc_rs::signature::RSA_PKCS1_2048_8192_SHA256,
            pair.public_key().as_ref().to_vec(),
        );
        (pem, public)
    }

    #[test]
    fn the_assertion_is_a_jwt_signed_with_the_key() {
        let (pem, public) = test_key();
        let key = ServiceAccountKey {
            client_email: "proxies@project.iam.gserviceaccount.com".into(),
            private_key: pem,
            private_key_id: Some("k1".into()),
            token_uri: "https://oauth2.googleapis.com/token".into(),
        };
        let jwt = assertion(&key, 1_800_000_000).unwrap();
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let header: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[0]).unwrap()).unwrap();
        assert_eq!(
            header,
            serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": "k1"})
        );
        let claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(claims["iss"], "proxies@project.iam.gserviceaccount.com");
        assert_eq!(claims["aud"], "https://oauth2.googleapis.com/token");
        assert_eq!(claims["scope"], SCOPE);
        assert_eq!(claims["exp"], 1_800_003_600u64);
        let signature = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        public
            .verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &signature)
            .expect("signed by the service account's key");
    }

    #[test]
    fn a_broken_key_says_what_is_wrong_without_echoing_it() {
        let key = ServiceAccountKey {
            client_email: "a@b".into(),
            private_key:
                "-----BEGIN PRIVATE KEY-----\nc2VjcmV0IG1hdGVyaWFs\n-----END PRIVATE KEY-----"
                    .into(),
            private_key_id: None,
            token_uri: "https://oauth2.googleapis.com/token".into(),
        };
        let error = assertion(&key, 0).unwrap_err();
        assert!(error.contains("not an RSA key"), "{error}");
        assert!(!error.contains("c2VjcmV0"), "{error}");
        assert!(pkcs8_der("ssh-rsa AAAA").unwrap_err().contains("PEM"));
    }
}
