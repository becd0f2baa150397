//! Where a credential's secret comes from (`valueFrom`): a variable, a file, a Google
//! service-account key, or AWS keys (`awsCredentials`: the host signs each matching request with
//! AWS Signature Version 4, from static keys in a mounted Secret or variables, or from a
//! web-identity token (IRSA) exchanged at STS, or from the container credentials endpoint (EKS
//! Pod Identity)). The plugin sees none of it.

use std::path::PathBuf;

use serde::Deserialize;

/// Where a credential's secret comes from, as written: exactly one of `env`, `file`,
/// `gcpServiceAccountKey` or `awsCredentials` (checked into a [`SecretValue`]).
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
    /// AWS keys: the host signs each request with SigV4 (`grants/aws.rs`).
    #[serde(default)]
    pub aws_credentials: Option<Box<AwsCredentialsSource>>,
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
    AwsCredentials(Box<AwsSigning>),
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
            SecretValue::AwsCredentials(signing) => {
                write!(f, "awsCredentials:{}/{}", signing.region, signing.service)
            }
        }
    }
}

impl SecretValue {
    pub(crate) fn from_source(source: &SecretSource) -> Result<Self, String> {
        match (
            &source.env,
            &source.file,
            &source.gcp_service_account_key,
            &source.aws_credentials,
        ) {
            (Some(name), None, None, None) => {
                refuse_own_variable(name)?;
                Ok(SecretValue::Env(name.clone()))
            }
            (None, Some(path), None, None) => {
                refuse_own_token_file(path)?;
                Ok(SecretValue::File(path.clone()))
            }
            (None, None, Some(path), None) => Ok(SecretValue::GcpServiceAccountKey(path.clone())),
            (None, None, None, Some(aws)) => Ok(SecretValue::AwsCredentials(Box::new(
                AwsSigning::parse(aws)?,
            ))),
            _ => Err("valueFrom: set exactly one of `env` (a variable name), `file` (a path), `gcpServiceAccountKey` (a key file path) or `awsCredentials` (SigV4 signing)".into()),
        }
    }
}

/// The operator's own token variables. A credential source is sent by the host to hosts a
/// plugin chooses within its grant: naming one of these would hand the operator's identity (the
/// discovery API's or the gateway's token) to whoever runs such a host.
pub const OWN_TOKEN_VARIABLES: &[&str] = &["DISCOVERY_TOKEN", "GATEWAY_TOKEN"];

/// Where Kubernetes mounts a Pod's ServiceAccount tokens: the default token, the projected
/// tokens of the Kubernetes docs' example, IRSA's and EKS Pod Identity's. The same reason as
/// [`OWN_TOKEN_VARIABLES`]: the operator's tokens are its identity at the API server and clouds.
/// (IRSA's and Pod Identity's own fields, `webIdentityTokenFile` and `authorizationTokenFile`,
/// still read them: those go only to STS or the agent, never to a plugin's host.)
pub const OWN_TOKEN_DIRECTORIES: &[&str] = &[
    "/var/run/secrets/kubernetes.io/serviceaccount",
    "/run/secrets/kubernetes.io/serviceaccount",
    "/var/run/secrets/tokens",
    "/run/secrets/tokens",
    "/var/run/secrets/eks.amazonaws.com/serviceaccount",
    "/run/secrets/eks.amazonaws.com/serviceaccount",
    "/var/run/secrets/pods.eks.amazonaws.com/serviceaccount",
    "/run/secrets/pods.eks.amazonaws.com/serviceaccount",
];

fn refuse_own_variable(name: &str) -> Result<(), String> {
    if OWN_TOKEN_VARIABLES.contains(&name) {
        return Err(format!(
            "valueFrom.env: `{name}` is the operator's own token; a provider's credential must come from a variable or a mounted Secret of its own (e.g. `file: /etc/proxy-operator/credentials/<name>`)"
        ));
    }
    Ok(())
}

fn refuse_own_token_file(path: &std::path::Path) -> Result<(), String> {
    match token_directory_of(path, OWN_TOKEN_DIRECTORIES) {
        Some((p, dir)) => Err(format!(
            "valueFrom.file: `{}` is the operator's own ServiceAccount token (`{}` is under {dir}); a provider's credential must come from a mounted Secret of its own (e.g. `/etc/proxy-operator/credentials/<name>`)",
            path.display(),
            p.display()
        )),
        None => Ok(()),
    }
}

/// The token directory `path` is in, judged both on the path as written (`..` and `.` folded)
/// and on where its links lead (a kubelet mount is `token -> ..data/token`), with that path.
fn token_directory_of<'d>(
    path: &std::path::Path,
    directories: &[&'d str],
) -> Option<(PathBuf, &'d str)> {
    let written = lexically_normal(path);
    let resolved = std::fs::canonicalize(path).ok();
    [Some(written), resolved]
        .into_iter()
        .flatten()
        .find_map(|p| {
            directories
                .iter()
                .find(|dir| p.starts_with(dir))
                .map(|dir| (p.clone(), *dir))
        })
}

/// `path` with `.` dropped and `..` folded into its parent, without touching the disk.
fn lexically_normal(path: &std::path::Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The secret of an `env` or `file` source, read now so a rotated Secret file is picked up;
/// tokens and AWS keys come from their own sources.
pub(crate) fn read_secret(value: &SecretValue) -> Result<String, String> {
    match value {
        SecretValue::Env(name) => {
            std::env::var(name).map_err(|_| format!("environment variable {name} is not set"))
        }
        SecretValue::File(path) => std::fs::read_to_string(path)
            .map(|s| s.trim_end_matches(['\n', '\r']).to_string())
            .map_err(|e| format!("cannot read {}: {e}", path.display())),
        SecretValue::GcpServiceAccountKey(_) | SecretValue::AwsCredentials(_) => {
            Err("no source configured".into())
        }
    }
}

/// `valueFrom.awsCredentials` as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AwsCredentialsSource {
    /// The region the requests are signed for, e.g. `eu-west-1`.
    pub region: String,
    /// The service signing name; `ec2` when absent.
    #[serde(default)]
    pub service: Option<String>,
    /// Static keys: `{file: PATH}` or `{env: NAME}` each, read on every request.
    #[serde(default)]
    pub access_key_id_from: Option<SecretSource>,
    #[serde(default)]
    pub secret_access_key_from: Option<SecretSource>,
    /// With temporary static keys: their session token.
    #[serde(default)]
    pub session_token_from: Option<SecretSource>,
    /// A web-identity token file (IRSA's projected ServiceAccount token), exchanged for
    /// temporary keys with `AssumeRoleWithWebIdentity`.
    #[serde(default)]
    pub web_identity_token_file: Option<PathBuf>,
    /// The role those keys are for.
    #[serde(default)]
    pub role_arn: Option<String>,
    #[serde(default)]
    pub role_session_name: Option<String>,
    /// STS; `https://sts.REGION.amazonaws.com` when absent.
    #[serde(default)]
    pub sts_endpoint: Option<String>,
    /// The container credentials endpoint (EKS Pod Identity's agent): `{}` takes both from the
    /// environment EKS gives the Pod.
    #[serde(default)]
    pub container_credentials: Option<ContainerCredentialsSource>,
}

/// `awsCredentials.containerCredentials` as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ContainerCredentialsSource {
    /// Where to GET the keys; `$AWS_CONTAINER_CREDENTIALS_FULL_URI` when absent.
    #[serde(default)]
    pub full_uri: Option<String>,
    /// A file whose text is sent as `Authorization`;
    /// `$AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE` when absent (none when neither is set).
    #[serde(default)]
    pub authorization_token_file: Option<PathBuf>,
}

/// Checked `awsCredentials`.
#[derive(Debug, Clone, PartialEq)]
pub struct AwsSigning {
    pub region: String,
    pub service: String,
    pub keys: AwsKeys,
}

/// Where the keys come from.
#[derive(Debug, Clone, PartialEq)]
pub enum AwsKeys {
    Static {
        access_key_id: SecretValue,
        secret_access_key: SecretValue,
        session_token: Option<SecretValue>,
    },
    WebIdentity {
        token_file: PathBuf,
        role_arn: String,
        session_name: String,
        sts_endpoint: url::Url,
    },
    /// The container credentials endpoint (EKS Pod Identity).
    Container {
        full_uri: url::Url,
        token_file: Option<PathBuf>,
    },
}

const SESSION_NAME: &str = "proxy-operator";

/// An AWS region or signing name: lowercase letters, digits and `-`.
fn is_aws_name(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 64
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// An `env` or `file` source (a key is text, not a token the host mints).
fn plain_source(source: &SecretSource, field: &str) -> Result<SecretValue, String> {
    match SecretValue::from_source(source).map_err(|e| format!("{field}.{e}"))? {
        value @ (SecretValue::Env(_) | SecretValue::File(_)) => Ok(value),
        _ => Err(format!(
            "{field}: set `file` (a mounted Secret key) or `env` (a variable name)"
        )),
    }
}

impl AwsSigning {
    /// Checks the section; the message names the field (under `awsCredentials.`) and the fix.
    pub fn parse(source: &AwsCredentialsSource) -> Result<Self, String> {
        let at = |m: String| format!("valueFrom.awsCredentials.{m}");
        if !is_aws_name(&source.region) {
            return Err(at(format!(
                "region: `{}` is not an AWS region, e.g. eu-west-1",
                source.region
            )));
        }
        let service = source.service.clone().unwrap_or_else(|| "ec2".into());
        if !is_aws_name(&service) {
            return Err(at(format!(
                "service: `{service}` is not a signing name, e.g. ec2"
            )));
        }
        let fixed = source.access_key_id_from.is_some()
            || source.secret_access_key_from.is_some()
            || source.session_token_from.is_some();
        let web = source.web_identity_token_file.is_some()
            || source.role_arn.is_some()
            || source.role_session_name.is_some()
            || source.sts_endpoint.is_some();
        let container = source.container_credentials.as_ref();
        let keys = match (fixed, web, container) {
            (true, false, None) => static_keys(source).map_err(at)?,
            (false, true, None) => web_identity(source).map_err(at)?,
            (false, false, Some(container)) => container_keys(container, |name| {
                std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
            })
            .map_err(at)?,
            _ => {
                return Err(at(
                    "set one of accessKeyIdFrom + secretAccessKeyFrom (static keys), webIdentityTokenFile + roleArn (IRSA) or containerCredentials (EKS Pod Identity), not two".into(),
                ));
            }
        };
        Ok(AwsSigning {
            region: source.region.clone(),
            service,
            keys,
        })
    }
}

fn static_keys(source: &AwsCredentialsSource) -> Result<AwsKeys, String> {
    let (Some(id), Some(secret)) = (&source.access_key_id_from, &source.secret_access_key_from)
    else {
        return Err(
            "accessKeyIdFrom and secretAccessKeyFrom: both are required for static keys".into(),
        );
    };
    Ok(AwsKeys::Static {
        access_key_id: plain_source(id, "accessKeyIdFrom")?,
        secret_access_key: plain_source(secret, "secretAccessKeyFrom")?,
        session_token: source
            .session_token_from
            .as_ref()
            .map(|s| plain_source(s, "sessionTokenFrom"))
            .transpose()?,
    })
}

fn web_identity(source: &AwsCredentialsSource) -> Result<AwsKeys, String> {
    let (Some(token_file), Some(role_arn)) = (&source.web_identity_token_file, &source.role_arn)
    else {
        return Err(
            "webIdentityTokenFile and roleArn: both are required for a web identity".into(),
        );
    };
    if !role_arn.starts_with("arn:") || !role_arn.contains(":role/") {
        return Err(format!(
            "roleArn: `{role_arn}` is not a role ARN, e.g. arn:aws:iam::123456789012:role/proxy-operator"
        ));
    }
    let session_name = source
        .role_session_name
        .clone()
        .unwrap_or_else(|| SESSION_NAME.into());
    // STS: 2-64 of letters, digits and =,.@-
    let session_ok = (2..=64).contains(&session_name.len())
        && session_name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "=,.@-_".contains(c));
    if !session_ok {
        return Err(format!(
            "roleSessionName: `{session_name}` must be 2-64 letters, digits or =,.@-_"
        ));
    }
    let endpoint = source
        .sts_endpoint
        .clone()
        .unwrap_or_else(|| format!("https://sts.{}.amazonaws.com", source.region));
    let sts_endpoint = url::Url::parse(&endpoint)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
        .ok_or_else(|| {
            format!("stsEndpoint: `{endpoint}` is not an http(s) URL, e.g. https://sts.eu-west-1.amazonaws.com")
        })?;
    Ok(AwsKeys::WebIdentity {
        token_file: token_file.clone(),
        role_arn: role_arn.clone(),
        session_name,
        sts_endpoint,
    })
}

/// Hosts an `http://` credentials endpoint may be on: loopback, and the addresses of the ECS and
/// EKS Pod Identity agents (as the AWS SDKs allow); anything else must be `https://`.
fn is_credentials_agent(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => {
            ip.is_loopback()
                || ip == std::net::Ipv4Addr::new(169, 254, 170, 2)
                || ip == std::net::Ipv4Addr::new(169, 254, 170, 23)
        }
        Some(url::Host::Ipv6(ip)) => {
            ip.is_loopback() || ip == std::net::Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23)
        }
        Some(url::Host::Domain(name)) => name == "localhost",
        None => false,
    }
}

/// `containerCredentials`, with what is not written taken from the environment (`env`).
fn container_keys(
    source: &ContainerCredentialsSource,
    env: impl Fn(&str) -> Option<String>,
) -> Result<AwsKeys, String> {
    const URI: &str = "AWS_CONTAINER_CREDENTIALS_FULL_URI";
    const TOKEN_FILE: &str = "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE";
    let uri = source.full_uri.clone().or_else(|| env(URI)).ok_or_else(|| {
        format!("containerCredentials.fullUri: not set, and {URI} is not in the operator's environment (EKS Pod Identity sets it when the operator's ServiceAccount has a pod identity association)")
    })?;
    let full_uri = url::Url::parse(&uri)
        .ok()
        .filter(|u| u.scheme() == "https" || (u.scheme() == "http" && is_credentials_agent(u)))
        .ok_or_else(|| {
            format!("containerCredentials.fullUri: `{uri}` must be https://, or http:// to loopback or the Pod Identity agent (169.254.170.23, [fd00:ec2::23])")
        })?;
    let token_file = source
        .authorization_token_file
        .clone()
        .or_else(|| env(TOKEN_FILE).map(PathBuf::from));
    Ok(AwsKeys::Container {
        full_uri,
        token_file,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> SecretSource {
        SecretSource {
            file: Some(path.into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_credential_source_may_not_name_the_operators_own_tokens() {
        for (source, says) in [
            (
                file("/var/run/secrets/kubernetes.io/serviceaccount/token"),
                "the operator's own ServiceAccount token",
            ),
            (
                file("/run/secrets/kubernetes.io/serviceaccount/../serviceaccount/./token"),
                "under /run/secrets/kubernetes.io/serviceaccount",
            ),
            (
                file("/var/run/secrets/tokens/vault-token"),
                "under /var/run/secrets/tokens",
            ),
            (
                file("/var/run/secrets/eks.amazonaws.com/serviceaccount/token"),
                "own ServiceAccount token",
            ),
            (
                file(
                    "/etc/creds/../../var/run/secrets/pods.eks.amazonaws.com/serviceaccount/eks-pod-identity-token",
                ),
                "own ServiceAccount token",
            ),
            (
                SecretSource {
                    env: Some("DISCOVERY_TOKEN".into()),
                    ..Default::default()
                },
                "`DISCOVERY_TOKEN` is the operator's own token",
            ),
            (
                SecretSource {
                    env: Some("GATEWAY_TOKEN".into()),
                    ..Default::default()
                },
                "`GATEWAY_TOKEN` is the operator's own token",
            ),
        ] {
            let refused = SecretValue::from_source(&source).unwrap_err();
            assert!(refused.contains(says), "{refused}");
            assert!(
                refused.contains("mounted Secret"),
                "names the fix: {refused}"
            );
        }
        // Static AWS keys are read through the same check.
        let aws = AwsCredentialsSource {
            region: "eu-west-1".into(),
            access_key_id_from: Some(file("/etc/aws/id")),
            secret_access_key_from: Some(SecretSource {
                env: Some("GATEWAY_TOKEN".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(
            AwsSigning::parse(&aws)
                .unwrap_err()
                .contains("GATEWAY_TOKEN")
        );
        // Near misses stay allowed; IRSA's own field still reads its projected token.
        for allowed in [
            file("/etc/proxy-operator/credentials/token"),
            file("/var/run/secrets/kubernetes.io/other"),
            file("/var/run/secrets/tokens-of-mine/key"),
            SecretSource {
                env: Some("GCP_TOKEN".into()),
                ..Default::default()
            },
        ] {
            SecretValue::from_source(&allowed).unwrap();
        }
        let irsa = AwsCredentialsSource {
            region: "eu-west-1".into(),
            web_identity_token_file: Some(
                "/var/run/secrets/eks.amazonaws.com/serviceaccount/token".into(),
            ),
            role_arn: Some("arn:aws:iam::123456789012:role/proxy-operator".into()),
            ..Default::default()
        };
        AwsSigning::parse(&irsa).unwrap();
    }

    #[test]
    fn a_link_into_a_token_directory_is_judged_by_where_it_leads() {
        let root = std::env::temp_dir().join(format!("own-token-{}", std::process::id()));
        let tokens = root.join("tokens");
        std::fs::create_dir_all(&tokens).unwrap();
        std::fs::write(tokens.join("token"), "a-jwt").unwrap();
        let link = root.join("innocent");
        std::os::unix::fs::symlink(tokens.join("token"), &link).unwrap();
        let tokens = std::fs::canonicalize(&tokens).unwrap();
        let directories = [tokens.to_str().unwrap()];
        let (resolved, dir) = token_directory_of(&link, &directories).expect("the link is refused");
        assert_eq!((resolved, dir), (tokens.join("token"), directories[0]));
        assert!(token_directory_of(&root.join("elsewhere"), &directories).is_none());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn container_credentials_come_from_the_section_or_the_environment() {
        let eks = |name: &str| match name {
            "AWS_CONTAINER_CREDENTIALS_FULL_URI" => {
                Some("http://169.254.170.23/v1/credentials".into())
            }
            "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE" => Some(
                "/var/run/secrets/pods.eks.amazonaws.com/serviceaccount/eks-pod-identity-token"
                    .into(),
            ),
            _ => None,
        };
        let AwsKeys::Container {
            full_uri,
            token_file,
        } = container_keys(&ContainerCredentialsSource::default(), eks).unwrap()
        else {
            panic!()
        };
        assert_eq!(full_uri.as_str(), "http://169.254.170.23/v1/credentials");
        assert!(token_file.unwrap().ends_with("eks-pod-identity-token"));
        let written = ContainerCredentialsSource {
            full_uri: Some("http://127.0.0.1:9911/creds".into()),
            authorization_token_file: Some("/t".into()),
        };
        let AwsKeys::Container {
            full_uri,
            token_file,
        } = container_keys(&written, eks).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            (full_uri.as_str(), token_file.unwrap()),
            ("http://127.0.0.1:9911/creds", PathBuf::from("/t"))
        );
        for (uri, says) in [
            (None, "is not in the operator's environment"),
            (Some("http://10.0.0.5/creds"), "must be https://"),
            (Some("ftp://127.0.0.1/creds"), "must be https://"),
        ] {
            let source = ContainerCredentialsSource {
                full_uri: uri.map(str::to_string),
                authorization_token_file: None,
            };
            let error = container_keys(&source, |_| None).unwrap_err();
            assert!(error.contains(says), "{uri:?}: {error}");
        }
        assert!(
            container_keys(
                &ContainerCredentialsSource {
                    full_uri: Some("https://creds.example/v1".into()),
                    authorization_token_file: None,
                },
                |_| None
            )
            .is_ok()
        );
        let mixed = parse(
            "{region: eu-west-1, roleArn: 'arn:aws:iam::1:role/p', containerCredentials: {fullUri: 'http://127.0.0.1:1/'}}",
        )
        .unwrap_err();
        assert!(mixed.contains("not two"), "{mixed}");
    }

    fn parse(yaml: &str) -> Result<AwsSigning, String> {
        AwsSigning::parse(&crate::support::yaml::from_str(yaml).unwrap())
    }

    #[test]
    fn static_keys_and_a_web_identity_parse_with_their_defaults() {
        let signing = parse(
            "{region: eu-west-1, accessKeyIdFrom: {file: /k/id}, secretAccessKeyFrom: {env: SECRET}}",
        )
        .unwrap();
        assert_eq!(signing.service, "ec2");
        assert!(matches!(
            signing.keys,
            AwsKeys::Static {
                session_token: None,
                ..
            }
        ));
        let signing = parse(
            "{region: us-east-1, service: ec2, webIdentityTokenFile: /t, roleArn: 'arn:aws:iam::1:role/p'}",
        )
        .unwrap();
        let AwsKeys::WebIdentity {
            sts_endpoint,
            session_name,
            ..
        } = signing.keys
        else {
            panic!()
        };
        assert_eq!(
            sts_endpoint.as_str(),
            "https://sts.us-east-1.amazonaws.com/"
        );
        assert_eq!(session_name, "proxy-operator");
    }

    #[test]
    fn a_bad_section_names_the_field_and_the_fix() {
        for (yaml, says) in [
            (
                "{region: EU, accessKeyIdFrom: {file: /a}, secretAccessKeyFrom: {file: /b}}",
                "region: `EU`",
            ),
            ("{region: eu-west-1}", "set one of accessKeyIdFrom"),
            (
                "{region: eu-west-1, accessKeyIdFrom: {file: /a}}",
                "both are required for static keys",
            ),
            (
                "{region: eu-west-1, accessKeyIdFrom: {file: /a}, secretAccessKeyFrom: {file: /b}, roleArn: x}",
                "not two",
            ),
            (
                "{region: eu-west-1, webIdentityTokenFile: /t, roleArn: admin}",
                "roleArn: `admin`",
            ),
            (
                "{region: eu-west-1, accessKeyIdFrom: {gcpServiceAccountKey: /a}, secretAccessKeyFrom: {file: /b}}",
                "accessKeyIdFrom: set `file`",
            ),
            (
                "{region: eu-west-1, webIdentityTokenFile: /t, roleArn: 'arn:aws:iam::1:role/p', stsEndpoint: 'ftp://x'}",
                "stsEndpoint: `ftp://x`",
            ),
        ] {
            let error = parse(yaml).unwrap_err();
            assert!(error.starts_with("valueFrom.awsCredentials."), "{error}");
            assert!(error.contains(says), "{yaml}: {error}");
        }
    }
}
