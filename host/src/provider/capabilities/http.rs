//! The `http` capability: a record request/response over reqwest, only to the hosts the provider
//! instance's grant allows, with size limits, a timeout, and credentials added by the host so the
//! plugin never sees them.

mod allow;
mod aws_sign;
mod gcp_token;
mod resolver;

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;

pub(crate) use allow::in_network;
pub use allow::{AllowPattern, is_public};

use super::GrantError;

pub use super::grants::{CredentialGrant, HttpGrant, SecretSource};
use super::grants::{SecretValue, ValidCredential, ValidHttpGrant};

/// A checked secret source: exactly one of `env`, `file`, `gcpServiceAccountKey` or
/// `awsCredentials`.
pub(crate) fn secret_value(source: &SecretSource) -> Result<SecretValue, String> {
    SecretValue::from_source(source)
}

pub(crate) use super::grants::read_secret;

/// A request from a plugin.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub timeout: Option<Duration>,
}

/// The answer handed back to the plugin.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// Why a request was not answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    #[error("denied: {0}")]
    Denied(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("timeout: {0}")]
    Timeout(String),
    #[error("transport: {0}")]
    Transport(String),
    #[error("too large: {0}")]
    TooLarge(String),
}

#[derive(Debug)]
struct Credential {
    grant: ValidCredential,
    /// Set for `gcpServiceAccountKey` and `gcpMetadataServer`: the tokens minted or fetched.
    tokens: Option<gcp_token::GcpTokens>,
    /// Set for `awsCredentials`: the request is signed rather than given a header.
    signer: Option<aws_sign::AwsSigner>,
}

/// The parsed grant of one provider instance, with its own client.
#[derive(Debug)]
pub struct HttpCapability {
    allow: Vec<AllowPattern>,
    credentials: Vec<Credential>,
    max_request_bytes: usize,
    max_response_bytes: usize,
    timeout: Duration,
    client: Option<reqwest::Client>,
    /// Whether the plugin declared `http`; if not, its requests are refused.
    declared: bool,
}

impl HttpCapability {
    /// Binds a valid grant: its own client, and a token source per service-account key.
    /// `None` grants nothing (every request is denied).
    pub fn bind(grant: Option<&ValidHttpGrant>, declared: bool) -> Result<Self, GrantError> {
        let Some(grant) = grant else {
            return Ok(HttpCapability {
                allow: Vec::new(),
                credentials: Vec::new(),
                max_request_bytes: 0,
                max_response_bytes: 0,
                timeout: Duration::from_secs(30),
                client: None,
                declared,
            });
        };
        let credentials = grant
            .credentials
            .iter()
            .enumerate()
            .map(|(index, c)| {
                let failed = |kind: &str, e: String| GrantError::HttpCredential {
                    index,
                    message: format!("valueFrom.{kind}: {e}"),
                };
                let (mut tokens, mut signer) = (None, None);
                match &c.value {
                    SecretValue::GcpServiceAccountKey(path) => {
                        tokens = Some(
                            gcp_token::GcpTokens::from_key_file(path)
                                .map_err(|e| failed("gcpServiceAccountKey", e.to_string()))?,
                        );
                    }
                    SecretValue::GcpMetadataServer(url) => {
                        tokens = Some(
                            gcp_token::GcpTokens::from_metadata_server(url)
                                .map_err(|e| failed("gcpMetadataServer", e.to_string()))?,
                        );
                    }
                    SecretValue::AwsCredentials(signing) => {
                        signer = Some(
                            aws_sign::AwsSigner::new(signing)
                                .map_err(|e| failed("awsCredentials", e))?,
                        );
                    }
                    _ => {}
                }
                Ok(Credential {
                    grant: c.clone(),
                    tokens,
                    signer,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let client = reqwest::Client::builder()
            // A redirect could lead outside the grant: the plugin sees the 3xx and asks again.
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(Arc::new(resolver::PublicOnlyResolver))
            .no_proxy()
            .build()
            .map_err(|e| GrantError::HttpClient(e.to_string()))?;
        Ok(HttpCapability {
            allow: grant.allow.clone(),
            credentials,
            max_request_bytes: grant.max_request_bytes,
            max_response_bytes: grant.max_response_bytes,
            timeout: grant.timeout,
            client: Some(client),
            declared,
        })
    }

    /// Checks a URL against the grant. `Ok` names the pattern that allowed it.
    pub fn check(&self, url: &url::Url) -> Result<&AllowPattern, HttpError> {
        let target = allow::Target::from_url(url).map_err(HttpError::InvalidRequest)?;
        let granted = self
            .allow
            .iter()
            .find(|p| p.matches(&target))
            .ok_or_else(|| {
                HttpError::Denied(format!(
                    "{} is not in this provider instance's grants.http.allow ({})",
                    target,
                    if self.allow.is_empty() {
                        "nothing is granted".to_string()
                    } else {
                        self.allow
                            .iter()
                            .map(|p| p.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                ))
            })?;
        Ok(granted)
    }

    /// The credentials the grant adds to requests for `target`.
    fn credentials_for(&self, target: &allow::Target) -> Vec<&Credential> {
        self.credentials
            .iter()
            .filter(|c| c.grant.pattern.matches(target))
            .collect()
    }

    /// Starts a GET whose body the host streams itself (a base image the `libvirt` capability
    /// imports): the same grant and credentials as `send`, but no response size limit, since the
    /// bytes never reach the plugin. The timeout covers the response headers only.
    pub async fn open_download(
        &self,
        provider: &str,
        url: &str,
    ) -> Result<reqwest::Response, HttpError> {
        let parsed = url::Url::parse(url)
            .map_err(|e| HttpError::InvalidRequest(format!("url `{url}`: {e}")))?;
        self.check(&parsed)?;
        let client = self.granted_client()?;
        let target = allow::Target::from_url(&parsed).map_err(HttpError::InvalidRequest)?;
        let injected = self.credentials_for(&target);
        let mut headers = reqwest::header::HeaderMap::new();
        insert_credentials(&mut headers, &injected, provider).await?;
        sign_request(&mut headers, &injected, provider, "GET", &parsed, b"").await?;
        let response =
            tokio::time::timeout(self.timeout, client.get(parsed).headers(headers).send())
                .await
                .map_err(|_| {
                    HttpError::Timeout(format!("no response from {url} within {:?}", self.timeout))
                })?
                .map_err(|e| classify(&e))?;
        Ok(response)
    }

    /// Sends a plugin's request if the grant allows it.
    pub async fn send(
        &self,
        provider: &str,
        request: HttpRequest,
    ) -> Result<HttpResponse, HttpError> {
        if !self.declared {
            return Err(HttpError::Denied(super::declared::undeclared("http")));
        }
        let url = url::Url::parse(&request.url)
            .map_err(|e| HttpError::InvalidRequest(format!("url `{}`: {e}", request.url)))?;
        self.check(&url)?;
        let client = self.granted_client()?;
        if request.body.len() > self.max_request_bytes {
            return Err(HttpError::TooLarge(format!(
                "request body of {} bytes exceeds the limit of {} bytes",
                request.body.len(),
                self.max_request_bytes
            )));
        }
        let method = parse_method(&request.method)?;
        let target = allow::Target::from_url(&url).map_err(HttpError::InvalidRequest)?;
        let injected = self.credentials_for(&target);
        let mut headers = plugin_headers(&request.headers, &injected)?;
        if injected.iter().any(|c| c.signer.is_some()) {
            refuse_presigned_query(&url)?;
        }
        insert_credentials(&mut headers, &injected, provider).await?;
        // Last: the signature covers every header the request carries.
        sign_request(
            &mut headers,
            &injected,
            provider,
            method.as_str(),
            &url,
            &request.body,
        )
        .await?;

        let timeout = request
            .timeout
            .map(|t| t.min(self.timeout))
            .unwrap_or(self.timeout);
        let started = std::time::Instant::now();
        let outgoing = client
            .request(method.clone(), url)
            .headers(headers)
            .body(request.body);
        let result = tokio::time::timeout(timeout, self.exchange(outgoing))
            .await
            .unwrap_or_else(|_| {
                Err(HttpError::Timeout(format!(
                    "no complete answer from {} within {timeout:?}",
                    target
                )))
            });
        tracing::debug!(
            %provider,
            method = %method,
            target = %target,
            status = result.as_ref().map(|r| r.status).ok(),
            error = result.as_ref().err().map(|e| e.to_string()),
            duration_ms = started.elapsed().as_millis() as u64,
            "plugin http request"
        );
        result
    }

    /// The grant's client; none when the provider instance has no `grants.http`.
    fn granted_client(&self) -> Result<&reqwest::Client, HttpError> {
        self.client.as_ref().ok_or_else(|| {
            HttpError::Denied("this provider instance has no grants.http".to_string())
        })
    }

    /// Sends `outgoing` and reads the whole answer, within the response size limit.
    async fn exchange(&self, outgoing: reqwest::RequestBuilder) -> Result<HttpResponse, HttpError> {
        let response = outgoing.send().await.map_err(|e| classify(&e))?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        if let Some(length) = response.content_length()
            && length as usize > self.max_response_bytes
        {
            return Err(self.response_too_large());
        }
        let body = self.read_body(response).await?;
        Ok(HttpResponse {
            status,
            headers,
            body,
        })
    }

    /// The response body, refused as soon as it grows past the limit.
    async fn read_body(&self, response: reqwest::Response) -> Result<Vec<u8>, HttpError> {
        let mut body = Vec::new();
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| classify(&e))?;
            if body.len() + chunk.len() > self.max_response_bytes {
                return Err(self.response_too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    fn response_too_large(&self) -> HttpError {
        HttpError::TooLarge(format!(
            "response body exceeds the limit of {} bytes",
            self.max_response_bytes
        ))
    }
}

/// A plugin's method name as an HTTP method (any case).
/// The methods the WIT's `request.method` lists; any other (TRACE, CONNECT, …) is refused.
const METHODS: [&str; 6] = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"];

fn parse_method(method: &str) -> Result<reqwest::Method, HttpError> {
    let upper = method.to_ascii_uppercase();
    if !METHODS.contains(&upper.as_str()) {
        return Err(HttpError::Denied(format!(
            "method `{method}` is not allowed; use one of {}",
            METHODS.join(", ")
        )));
    }
    reqwest::Method::from_bytes(upper.as_bytes())
        .map_err(|_| HttpError::InvalidRequest(format!("method `{method}` is not valid")))
}

/// Whether the host alone sets `name`: `Host` (a plugin could send a granted host's injected
/// credential to another virtual host on the same address), the hop-by-hop headers and
/// `Proxy-*` (they act on connections and proxies, not on the request), and `Content-Length`
/// (the host computes it from the body).
fn host_only(name: &reqwest::header::HeaderName) -> bool {
    const HOP_BY_HOP: [&str; 7] = [
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
    ];
    let name = name.as_str();
    name == "host" || name.starts_with("proxy-") || HOP_BY_HOP.contains(&name)
}

/// The plugin's headers, without those the host injects for this request.
fn plugin_headers(
    requested: &[(String, String)],
    injected: &[&Credential],
) -> Result<reqwest::header::HeaderMap, HttpError> {
    let mut headers = reqwest::header::HeaderMap::new();
    for (name, value) in requested {
        let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| HttpError::InvalidRequest(format!("header name `{name}` is not valid")))?;
        if host_only(&name) {
            return Err(HttpError::Denied(format!(
                "header `{name}` is set by the host only; a plugin cannot send it"
            )));
        }
        // What SigV4 sets, or would be signed as if the host had set it (a session token, a
        // date to replay): refused, so a plugin cannot shape the signature.
        if injected.iter().any(|c| c.signer.is_some()) && aws_signed(&name) {
            return Err(HttpError::Denied(format!(
                "header `{name}` is set by the host's SigV4 signing for this URL; a plugin cannot send it"
            )));
        }
        // A plugin cannot set what the host injects (nor learn it by echo tricks).
        if injected.iter().any(|c| c.grant.header == name) {
            continue;
        }
        let value = reqwest::header::HeaderValue::from_str(value).map_err(|_| {
            HttpError::InvalidRequest(format!("header `{name}` has an invalid value"))
        })?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// Headers SigV4 writes or that shape what a signature means: `Authorization` and every
/// `X-Amz-*` but `X-Amz-Target` (the operation name of AWS's JSON APIs, signed like any header).
fn aws_signed(name: &reqwest::header::HeaderName) -> bool {
    let name = name.as_str();
    name == "authorization" || (name.starts_with("x-amz-") && name != "x-amz-target")
}

/// A signed request carries its signature in headers: query parameters of a presigned URL
/// (`X-Amz-Signature`, `X-Amz-Credential`, …) would make a second, plugin-made signature.
fn refuse_presigned_query(url: &url::Url) -> Result<(), HttpError> {
    match url
        .query_pairs()
        .find(|(k, _)| k.to_ascii_lowercase().starts_with("x-amz-"))
    {
        Some((key, _)) => Err(HttpError::Denied(format!(
            "query parameter `{key}` is set by SigV4 signing only; the host signs this URL's requests"
        ))),
        None => Ok(()),
    }
}

fn classify(err: &reqwest::Error) -> HttpError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(denied) = e.downcast_ref::<resolver::PrivateAddressDenied>() {
            return HttpError::Denied(denied.to_string());
        }
        source = e.source();
    }
    if err.is_timeout() {
        return HttpError::Timeout(error_chain(err));
    }
    HttpError::Transport(error_chain(err))
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// Adds the grant's credentials for a request (read now, so a rotated Secret file is picked up).
async fn insert_credentials(
    headers: &mut reqwest::header::HeaderMap,
    injected: &[&Credential],
    provider: &str,
) -> Result<(), HttpError> {
    for credential in injected.iter().filter(|c| c.signer.is_none()) {
        let secret = match &credential.tokens {
            Some(tokens) => tokens.token().await.map_err(|e| e.to_string()),
            None => read_secret(&credential.grant.value),
        };
        let secret = secret.map_err(|e| {
            tracing::warn!(
                %provider,
                header = %credential.grant.header,
                error = %e,
                "credential for an HTTP grant is unavailable"
            );
            HttpError::Transport(format!(
                "the host could not read the credential for header {}: {e}",
                credential.grant.header
            ))
        })?;
        let mut value = reqwest::header::HeaderValue::from_str(&format!(
            "{}{}",
            credential.grant.prefix, secret
        ))
        .map_err(|_| {
            HttpError::Transport(format!(
                "the credential for header {} is not a valid header value",
                credential.grant.header
            ))
        })?;
        value.set_sensitive(true);
        headers.insert(credential.grant.header.clone(), value);
    }
    Ok(())
}

/// Signs the request for each `awsCredentials` grant matching it (normally one).
async fn sign_request(
    headers: &mut reqwest::header::HeaderMap,
    injected: &[&Credential],
    provider: &str,
    method: &str,
    url: &url::Url,
    body: &[u8],
) -> Result<(), HttpError> {
    for signer in injected.iter().filter_map(|c| c.signer.as_ref()) {
        signer.sign(method, url, headers, body).await.map_err(|e| {
            tracing::warn!(%provider, ?signer, error = %e, "AWS credentials for an HTTP grant are unavailable");
            HttpError::Transport(format!(
                "the host could not sign the request with its AWS credentials: {e}"
            ))
        })?;
    }
    Ok(())
}
