//! The EC2 Query API: an action and its parameters as a form-encoded POST, the XML answer, and
//! AWS's error codes mapped to provider errors. The host signs each request (SigV4): this
//! plugin sends no credential and never sees one.

use proxy_operator_sdk::capabilities::{self, Request};
use proxy_operator_sdk::{ProviderError, transient};

/// The EC2 API version every action is asked in.
pub const API_VERSION: &str = "2016-11-15";

/// Parameters of one action, in order.
#[derive(Debug, Default, Clone)]
pub struct Params(pub Vec<(String, String)>);

impl Params {
    pub fn action(action: &str) -> Self {
        Params(vec![
            ("Action".into(), action.into()),
            ("Version".into(), API_VERSION.into()),
        ])
    }

    pub fn set(&mut self, key: impl Into<String>, value: impl Into<String>) -> &mut Self {
        self.0.push((key.into(), value.into()));
        self
    }

    /// `Filter.N.Name` with its values.
    pub fn filter(&mut self, name: &str, values: &[&str]) -> &mut Self {
        let n = 1 + self
            .0
            .iter()
            .filter(|(k, _)| k.starts_with("Filter.") && k.ends_with(".Name"))
            .count();
        self.set(format!("Filter.{n}.Name"), name);
        for (i, value) in values.iter().enumerate() {
            self.set(format!("Filter.{n}.Value.{}", i + 1), *value);
        }
        self
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The form body: RFC 3986 percent-encoding (what SigV4 and AWS expect).
    pub fn encode(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{}={}", percent(k), percent(v)))
            .collect::<Vec<_>>()
            .join("&")
    }
}

/// Percent-encodes all but the RFC 3986 unreserved characters.
pub fn percent(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

/// Sends `params` to the endpoint; the XML of a success, or the error mapped.
pub fn call(endpoint: &str, params: &Params) -> Result<String, ProviderError> {
    let action = params.get("Action").unwrap_or("?").to_string();
    let request = Request {
        method: "POST".into(),
        url: endpoint.to_string(),
        headers: vec![(
            "content-type".into(),
            "application/x-www-form-urlencoded; charset=utf-8".into(),
        )],
        body: params.encode().into_bytes(),
        timeout_ms: None,
    };
    let response = capabilities::http_send(&request)?;
    let body = String::from_utf8_lossy(&response.body).into_owned();
    if (200..300).contains(&response.status) {
        return Ok(body);
    }
    Err(api_error(&action, response.status, &body))
}

/// An AWS error: its code and message, from `<Response><Errors><Error>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsError {
    pub code: String,
    pub message: String,
}

pub fn parse_error(body: &str) -> Option<AwsError> {
    let document = roxmltree::Document::parse(body).ok()?;
    let find = |name: &str| {
        document
            .descendants()
            .find(|n| n.has_tag_name(name))
            .and_then(|n| n.text())
            .map(|t| t.trim().to_string())
    };
    Some(AwsError {
        code: find("Code")?,
        message: find("Message").unwrap_or_default(),
    })
}

/// How long a throttled or short-of-capacity call waits before it is tried again.
pub const THROTTLED_RETRY_MS: u64 = 5_000;
pub const NO_CAPACITY_RETRY_MS: u64 = 60_000;

/// AWS's answer to `action` as the provider error the operator acts on.
pub fn api_error(action: &str, status: u16, body: &str) -> ProviderError {
    let Some(error) = parse_error(body) else {
        let text: String = body.chars().take(300).collect();
        let message = format!("{action}: HTTP {status}: {text}");
        return match status {
            401 | 403 => ProviderError::Unauthorized(message),
            500..=599 => transient(message, None),
            _ => ProviderError::Permanent(message),
        };
    };
    let message = format!("{action}: {}: {}", error.code, error.message);
    let code = error.code.as_str();
    match code {
        // Account limits: retried slowly until the limit is raised or instances go.
        "InstanceLimitExceeded"
        | "VcpuLimitExceeded"
        | "MaxSpotInstanceCountExceeded"
        | "SecurityGroupLimitExceeded"
        | "ResourceLimitExceeded" => ProviderError::Quota(message),
        // Throttling: back off and try again.
        "RequestLimitExceeded" | "Throttling" | "ThrottlingException" => {
            transient(message, Some(THROTTLED_RETRY_MS))
        }
        // The zone has no capacity for the type right now; it often has later.
        "InsufficientInstanceCapacity" | "InsufficientCapacity" | "InsufficientHostCapacity" => {
            transient(message, Some(NO_CAPACITY_RETRY_MS))
        }
        "AuthFailure"
        | "UnauthorizedOperation"
        | "InvalidClientTokenId"
        | "SignatureDoesNotMatch"
        | "MissingAuthenticationToken"
        | "ExpiredToken"
        | "OptInRequired" => ProviderError::Unauthorized(format!(
            "{message}; the credentials the host signs with need the ec2 actions of docs/providers/aws.md"
        )),
        c if c.ends_with(".NotFound") => ProviderError::NotFound(message),
        "InternalError" | "Unavailable" | "ServiceUnavailable" => transient(message, None),
        _ if status >= 500 => transient(message, None),
        _ => ProviderError::Permanent(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_body(code: &str) -> String {
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code><Message>it says why</Message></Error></Errors><RequestID>r-1</RequestID></Response>"
        )
    }

    #[test]
    fn aws_error_codes_map_to_the_wit_errors_with_retry_hints() {
        match api_error("RunInstances", 400, &error_body("InstanceLimitExceeded")) {
            ProviderError::Quota(m) => {
                assert_eq!(m, "RunInstances: InstanceLimitExceeded: it says why")
            }
            other => panic!("{other:?}"),
        }
        for (code, wait) in [
            ("RequestLimitExceeded", THROTTLED_RETRY_MS),
            ("InsufficientInstanceCapacity", NO_CAPACITY_RETRY_MS),
        ] {
            match api_error("RunInstances", 503, &error_body(code)) {
                ProviderError::Transient(t) => {
                    assert_eq!(t.retry_after_ms, Some(wait));
                    assert!(t.message.contains(code));
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(
            api_error(
                "DescribeInstances",
                400,
                &error_body("InvalidInstanceID.NotFound")
            ),
            ProviderError::NotFound(_)
        ));
        assert!(matches!(
            api_error("DescribeInstances", 401, &error_body("AuthFailure")),
            ProviderError::Unauthorized(_)
        ));
        assert!(matches!(
            api_error("RunInstances", 400, &error_body("InvalidAMIID.Malformed")),
            ProviderError::Permanent(_)
        ));
        assert!(matches!(
            api_error("RunInstances", 502, "<html>bad gateway</html"),
            ProviderError::Transient(_)
        ));
    }

    #[test]
    fn params_encode_as_aws_expects() {
        let mut params = Params::action("DescribeInstances");
        params
            .filter("tag:proxy-operator-managed", &["true"])
            .filter("instance-state-name", &["pending", "running"])
            .set("UserData", "a+b/c=");
        assert_eq!(
            params.encode(),
            "Action=DescribeInstances&Version=2016-11-15&Filter.1.Name=tag%3Aproxy-operator-managed&Filter.1.Value.1=true&Filter.2.Name=instance-state-name&Filter.2.Value.1=pending&Filter.2.Value.2=running&UserData=a%2Bb%2Fc%3D"
        );
    }
}
