//! SigV4 for credentials with `valueFrom.awsCredentials`: the host signs a plugin's request to
//! an AWS endpoint with keys the plugin never sees. Static keys are read on every request (a
//! rotated Secret is picked up); a web identity (IRSA) is exchanged at STS with
//! `AssumeRoleWithWebIdentity`, or fetched from the container credentials endpoint (EKS Pod
//! Identity's agent, with the Pod's token as `Authorization`), and the temporary keys are cached
//! until shortly before they expire. The signing itself is the AWS SDK's own `aws-sigv4`.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;

use crate::provider::capabilities::grants::{AwsKeys, AwsSigning, read_secret};

/// Temporary keys are renewed this long before they expire.
const RENEW_BEFORE: Duration = Duration::from_secs(300);
/// Lifetime asked of STS (its default and the minimum a role allows is 1 h).
const LIFETIME_SECONDS: u64 = 3600;
/// What `Credentials` record as their provider, in the SDK's debug output only.
const PROVIDER_NAME: &str = "proxy-operator";

/// The signer of one credential grant.
pub(crate) struct AwsSigner {
    region: String,
    service: String,
    keys: Keys,
}

enum Keys {
    Static(AwsKeys),
    WebIdentity(WebIdentity),
    Container(Container),
}

/// Temporary keys and when they expire, held while new ones are fetched (so concurrent requests
/// wait for one fetch).
type Cache = tokio::sync::Mutex<Option<(Credentials, SystemTime)>>;

/// The container credentials endpoint (EKS Pod Identity).
struct Container {
    full_uri: url::Url,
    token_file: Option<PathBuf>,
    client: reqwest::Client,
    cached: Cache,
}

/// The cached keys, or `fetch`ed ones when there are none or they are about to expire.
async fn cached_or<F>(cache: &Cache, fetch: F) -> Result<Credentials, String>
where
    F: Future<Output = Result<(Credentials, SystemTime), String>>,
{
    let mut cached = cache.lock().await;
    if let Some((credentials, expires)) = cached.as_ref()
        && SystemTime::now() + RENEW_BEFORE < *expires
    {
        return Ok(credentials.clone());
    }
    let (credentials, expires) = fetch.await?;
    *cached = Some((credentials.clone(), expires));
    Ok(credentials)
}

/// An RFC 3339 expiry as STS and the credentials endpoints write it (an offset-less time is UTC).
fn expiry(text: &str) -> Option<SystemTime> {
    let t = text.trim();
    t.parse::<k8s_openapi::jiff::Timestamp>()
        .or_else(|_| format!("{}Z", t.trim_end_matches('Z')).parse())
        .ok()
        .map(SystemTime::from)
}

fn http_client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| e.to_string())
}

struct WebIdentity {
    token_file: PathBuf,
    role_arn: String,
    session_name: String,
    sts_endpoint: url::Url,
    client: reqwest::Client,
    /// Held while keys are fetched, so concurrent requests wait for one exchange.
    cached: tokio::sync::Mutex<Option<(Credentials, SystemTime)>>,
}

impl std::fmt::Debug for AwsSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Where the keys come from, never the keys.
        let source = match &self.keys {
            Keys::Static(_) => "static keys".to_string(),
            Keys::WebIdentity(w) => format!("web identity {}", w.role_arn),
            Keys::Container(c) => format!("container credentials {}", c.full_uri),
        };
        write!(f, "AwsSigner({}/{}, {source})", self.region, self.service)
    }
}

impl AwsSigner {
    pub(crate) fn new(signing: &AwsSigning) -> Result<Self, String> {
        let keys = match &signing.keys {
            keys @ AwsKeys::Static { .. } => Keys::Static(keys.clone()),
            AwsKeys::WebIdentity {
                token_file,
                role_arn,
                session_name,
                sts_endpoint,
            } => Keys::WebIdentity(WebIdentity {
                token_file: token_file.clone(),
                role_arn: role_arn.clone(),
                session_name: session_name.clone(),
                sts_endpoint: sts_endpoint.clone(),
                client: http_client()?,
                cached: tokio::sync::Mutex::new(None),
            }),
            AwsKeys::Container {
                full_uri,
                token_file,
            } => Keys::Container(Container {
                full_uri: full_uri.clone(),
                token_file: token_file.clone(),
                client: http_client()?,
                cached: tokio::sync::Mutex::new(None),
            }),
        };
        Ok(AwsSigner {
            region: signing.region.clone(),
            service: signing.service.clone(),
            keys,
        })
    }

    /// The keys to sign with now.
    async fn credentials(&self) -> Result<Credentials, String> {
        match &self.keys {
            Keys::Static(AwsKeys::Static {
                access_key_id,
                secret_access_key,
                session_token,
            }) => Ok(Credentials::new(
                read_secret(access_key_id).map_err(|e| format!("accessKeyIdFrom: {e}"))?,
                read_secret(secret_access_key).map_err(|e| format!("secretAccessKeyFrom: {e}"))?,
                session_token
                    .as_ref()
                    .map(|t| read_secret(t).map_err(|e| format!("sessionTokenFrom: {e}")))
                    .transpose()?,
                None,
                PROVIDER_NAME,
            )),
            Keys::Static(_) => Err("no static keys configured".into()),
            Keys::WebIdentity(web) => cached_or(&web.cached, web.assume_role()).await,
            Keys::Container(container) => cached_or(&container.cached, container.fetch()).await,
        }
    }

    /// Signs a request: adds `Authorization`, `X-Amz-Date` and (with temporary keys)
    /// `X-Amz-Security-Token` to `headers`, over the method, URL, `headers` and `body`.
    pub(crate) async fn sign(
        &self,
        method: &str,
        url: &url::Url,
        headers: &mut reqwest::header::HeaderMap,
        body: &[u8],
    ) -> Result<(), String> {
        let credentials = self.credentials().await?;
        let identity = credentials.into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name(&self.service)
            .time(SystemTime::now())
            .settings(SigningSettings::default())
            .build()
            .map_err(|e| format!("signing: {e}"))?
            .into();
        let mut signed: Vec<(&str, &str)> = Vec::new();
        for (name, value) in headers.iter() {
            let value = value
                .to_str()
                .map_err(|_| format!("header {name} is not text, so it cannot be signed"))?;
            signed.push((name.as_str(), value));
        }
        let request = SignableRequest::new(
            method,
            url.as_str(),
            signed.into_iter(),
            SignableBody::Bytes(body),
        )
        .map_err(|e| format!("signing: {e}"))?;
        let (instructions, _signature) = sign(request, &params)
            .map_err(|e| format!("signing: {e}"))?
            .into_parts();
        let (added, _params) = instructions.into_parts();
        let mut values = Vec::with_capacity(added.len());
        for header in &added {
            let mut value = reqwest::header::HeaderValue::from_str(header.value())
                .map_err(|_| format!("signing made an invalid {} header", header.name()))?;
            value.set_sensitive(header.sensitive() || header.name() == "authorization");
            values.push((
                reqwest::header::HeaderName::from_static(header.name()),
                value,
            ));
        }
        for (name, value) in values {
            headers.insert(name, value);
        }
        Ok(())
    }
}

/// The keys in a container credentials endpoint's JSON answer (AWS's documented shape:
/// `AccessKeyId`, `SecretAccessKey`, `Token`, `Expiration`).
#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ContainerAnswer {
    access_key_id: String,
    secret_access_key: String,
    token: String,
    expiration: String,
}

impl Container {
    /// GETs the keys, with the token file's text (read each time: the kubelet rotates the
    /// projected token) as `Authorization`.
    async fn fetch(&self) -> Result<(Credentials, SystemTime), String> {
        let uri = &self.full_uri;
        let mut request = self.client.get(uri.clone());
        if let Some(file) = &self.token_file {
            let token = tokio::fs::read_to_string(file).await.map_err(|e| {
                format!(
                    "containerCredentials.authorizationTokenFile {}: {e}",
                    file.display()
                )
            })?;
            let mut value = reqwest::header::HeaderValue::from_str(token.trim())
                .map_err(|_| format!("{}: the token is not a header value", file.display()))?;
            value.set_sensitive(true);
            request = request.header(reqwest::header::AUTHORIZATION, value);
        }
        let response = request
            .send()
            .await
            .map_err(|e| format!("container credentials {uri}: {e}"))?;
        let status = response.status();
        let body = response
            .text()
            .await
            .map_err(|e| format!("container credentials {uri}: {e}"))?;
        if !status.is_success() {
            // An error answer carries no keys: its text says why (cut short).
            let said: String = body.chars().take(200).collect();
            return Err(format!(
                "container credentials {uri} answered {status}: {said}"
            ));
        }
        let answer: ContainerAnswer = serde_json::from_str(&body).map_err(|e| {
            format!("container credentials {uri}: not the documented answer (AccessKeyId, SecretAccessKey, Token, Expiration): {e}")
        })?;
        let expires = expiry(&answer.expiration).ok_or_else(|| {
            format!("container credentials {uri}: Expiration is not an RFC 3339 time")
        })?;
        tracing::debug!(endpoint = %uri, access_key_id = %answer.access_key_id, "fetched temporary AWS keys from the container credentials endpoint");
        Ok((
            Credentials::new(
                answer.access_key_id,
                answer.secret_access_key,
                Some(answer.token),
                Some(expires),
                PROVIDER_NAME,
            ),
            expires,
        ))
    }
}

impl WebIdentity {
    /// Exchanges the token for temporary keys. The token file is read at each exchange: the
    /// kubelet rotates the projected token.
    async fn assume_role(&self) -> Result<(Credentials, SystemTime), String> {
        let token = tokio::fs::read_to_string(&self.token_file)
            .await
            .map_err(|e| format!("webIdentityTokenFile {}: {e}", self.token_file.display()))?;
        // Its own statement: the serializer is not Send and must be gone before the await.
        let form = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("Action", "AssumeRoleWithWebIdentity")
            .append_pair("Version", "2011-06-15")
            .append_pair("RoleArn", &self.role_arn)
            .append_pair("RoleSessionName", &self.session_name)
            .append_pair("DurationSeconds", &LIFETIME_SECONDS.to_string())
            .append_pair("WebIdentityToken", token.trim())
            .finish();
        let sts = &self.sts_endpoint;
        let asked_at = SystemTime::now();
        let response = self
            .client
            .post(sts.clone())
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(form)
            .send()
            .await
            .map_err(|e| format!("STS {sts}: {e}"))?;
        let status = response.status();
        let body = response
            .text()
            .await
            .map_err(|e| format!("STS {sts}: {e}"))?;
        let answer = sts_answer(&body, status.is_success())
            .map_err(|e| format!("STS {sts} AssumeRoleWithWebIdentity {}: {e}", self.role_arn))?;
        let expires = answer
            .expiration
            .as_deref()
            .and_then(expiry)
            .unwrap_or(asked_at + Duration::from_secs(LIFETIME_SECONDS));
        tracing::debug!(role = %self.role_arn, access_key_id = %answer.access_key_id, "exchanged a web identity for temporary AWS keys");
        Ok((
            Credentials::new(
                answer.access_key_id,
                answer.secret_access_key,
                Some(answer.session_token),
                Some(expires),
                PROVIDER_NAME,
            ),
            expires,
        ))
    }
}

/// The temporary keys in STS's answer.
struct StsAnswer {
    access_key_id: String,
    secret_access_key: String,
    session_token: String,
    expiration: Option<String>,
}

/// Reads STS's XML answer: the keys of a success, the code and message of an error (never the
/// keys, which a failed answer does not carry).
fn sts_answer(body: &str, success: bool) -> Result<StsAnswer, String> {
    let document =
        roxmltree::Document::parse(body).map_err(|e| format!("the answer is not XML: {e}"))?;
    let text = |name: &str| {
        document
            .descendants()
            .find(|n| n.has_tag_name(name))
            .and_then(|n| n.text())
            .map(|t| t.trim().to_string())
    };
    if !success || text("AccessKeyId").is_none() {
        return Err(format!(
            "{}: {}",
            text("Code").unwrap_or_else(|| "no keys in the answer".into()),
            text("Message").unwrap_or_default()
        ));
    }
    let field = |name: &str| text(name).ok_or_else(|| format!("the answer has no {name}"));
    Ok(StsAnswer {
        access_key_id: field("AccessKeyId")?,
        secret_access_key: field("SecretAccessKey")?,
        session_token: field("SessionToken")?,
        expiration: text("Expiration"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::capabilities::grants::SecretValue;

    #[test]
    fn sts_answers_give_keys_or_the_error_code() {
        let ok = r#"<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult><Credentials>
    <AccessKeyId>ASIAEXAMPLE</AccessKeyId><SecretAccessKey>wJalr</SecretAccessKey>
    <SessionToken>FwoG</SessionToken><Expiration>2026-12-04T22:00:00Z</Expiration>
  </Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>"#;
        let answer = sts_answer(ok, true).unwrap();
        assert_eq!(answer.access_key_id, "ASIAEXAMPLE");
        assert_eq!(answer.session_token, "FwoG");
        assert_eq!(answer.expiration.as_deref(), Some("2026-12-04T22:00:00Z"));
        let refused = r#"<ErrorResponse><Error><Type>Sender</Type><Code>InvalidIdentityToken</Code><Message>No OpenIDConnect provider found</Message></Error></ErrorResponse>"#;
        let error = sts_answer(refused, false).err().unwrap();
        assert_eq!(
            error,
            "InvalidIdentityToken: No OpenIDConnect provider found"
        );
    }

    /// The signature is AWS's documented SigV4 over what is sent: recomputed here by the SDK's
    /// signer from the same parts, it matches, and a changed body would not.
    #[tokio::test]
    async fn a_request_gets_a_sigv4_authorization_for_its_region_and_service() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("id"), "AKIDEXAMPLE\n").unwrap();
        std::fs::write(dir.path().join("secret"), "wJalrXUtnFEMI/K7MDENG").unwrap();
        let signer = AwsSigner::new(&AwsSigning {
            region: "eu-west-1".into(),
            service: "ec2".into(),
            keys: AwsKeys::Static {
                access_key_id: SecretValue::File(dir.path().join("id")),
                secret_access_key: SecretValue::File(dir.path().join("secret")),
                session_token: None,
            },
        })
        .unwrap();
        let url = url::Url::parse("https://ec2.eu-west-1.amazonaws.com/").unwrap();
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            "content-type",
            "application/x-www-form-urlencoded".parse().unwrap(),
        );
        signer
            .sign("POST", &url, &mut headers, b"Action=DescribeInstances")
            .await
            .unwrap();
        let authorization = headers["authorization"].to_str().unwrap();
        assert!(headers["authorization"].is_sensitive());
        let date = headers["x-amz-date"].to_str().unwrap();
        assert!(
            authorization.starts_with(&format!(
                "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/{}/eu-west-1/ec2/aws4_request, SignedHeaders=content-type;host;x-amz-date, Signature="
            , &date[..8])),
            "{authorization}"
        );
        assert!(!authorization.contains("wJalr"));
        assert!(!headers.contains_key("x-amz-security-token"));
        // A rotated key file is read at the next request.
        std::fs::write(dir.path().join("id"), "AKIDROTATED").unwrap();
        let mut again = reqwest::header::HeaderMap::new();
        signer.sign("GET", &url, &mut again, b"").await.unwrap();
        assert!(
            again["authorization"]
                .to_str()
                .unwrap()
                .contains("Credential=AKIDROTATED/")
        );
    }
}
