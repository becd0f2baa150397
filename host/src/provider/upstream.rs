//! Provider instances that front proxies which exist already (the `upstream` provider): their
//! `upstream` section of the providers config. The upstreams' login comes from a mounted Secret
//! (or an environment variable) the operator reads; the plugin never gets it, not even hashed.
//! The operator probes with it, the gateway logs in with it, and a lease's `proxyUrl` carries it
//! only when `handOutCredentials` is true.
//!
//! An upstream speaks HTTP or SOCKS5, as the scheme of its URL says (`socks5://`). The plugin's
//! instance carries an address and a port only (the WIT has no field for a protocol), so the
//! operator reads the scheme from the same URLs the plugin was given: the Proxy's
//! `providerOptions.url`, else the entry of `config.upstreams` at the instance's address (the
//! plugin refuses one address listed twice).

use std::collections::BTreeSet;

use serde::Deserialize;

use crate::provider::capabilities::http::{SecretSource, read_secret, secret_value};
use crate::provider::credentials::{InvalidCredentials, ProxyLogin};
use crate::support::socks::ProxyProtocol;

/// The plugin type whose instances are upstream ones even without an `upstream` section.
pub const UPSTREAM_TYPE: &str = "upstream";

/// A provider instance's `upstream` section.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UpstreamSettings {
    /// The login every upstream of this provider instance requires; absent: none.
    #[serde(default)]
    pub credentials: Option<UpstreamCredentials>,
    /// Whether a lease's `proxyUrl` carries the login (`http://user:password@host:port`). Default
    /// false: the `proxyUrl` is the bare address, and only the gateway (which logs in itself)
    /// can use a proxy that requires the login.
    #[serde(default)]
    pub hand_out_credentials: bool,
    /// The addresses (host in lower case, port) of `config.upstreams` whose URL is `socks5://`:
    /// taken from the provider config, not from this section.
    #[serde(skip)]
    pub listed_socks5: BTreeSet<(String, u16)>,
}

/// The upstreams' login.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UpstreamCredentials {
    /// The user name (printable ASCII, no colon).
    pub username: String,
    /// Where the password is: `{file: PATH}` (a mounted Secret key) or `{env: NAME}`.
    pub password_from: SecretSource,
}

/// The scheme, host (lower case, without brackets) and port of `scheme://host:port[/]`; `None`
/// for anything else (the plugin refuses those with the reason).
fn parts(url: &str) -> Option<(ProxyProtocol, String, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let protocol = ProxyProtocol::of_scheme(scheme)?;
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => v6.split_once("]:")?,
        None => authority.rsplit_once(':')?,
    };
    Some((protocol, host.to_ascii_lowercase(), port.parse().ok()?))
}

impl UpstreamSettings {
    /// With the SOCKS5 upstreams listed in the entry's `config` (`upstreams[].url`).
    pub fn with_listed(mut self, config: &serde_json::Value) -> Self {
        self.listed_socks5 = config["upstreams"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|entry| parts(entry["url"].as_str()?))
            .filter(|(protocol, _, _)| *protocol == ProxyProtocol::Socks5)
            .map(|(_, host, port)| (host, port))
            .collect();
        self
    }

    /// How the operator speaks to an upstream at `address:port`, given to a Proxy whose
    /// `spec.providerOptions` is `options`: the scheme of its `url`, else of the listed upstream
    /// at that address; HTTP otherwise.
    pub fn protocol_for(
        &self,
        options: Option<&serde_json::Value>,
        address: &str,
        port: u16,
    ) -> ProxyProtocol {
        if let Some(url) = options.and_then(|o| o["url"].as_str()) {
            return parts(url).map_or(ProxyProtocol::Http, |(protocol, _, _)| protocol);
        }
        let listed = (address.to_ascii_lowercase(), port);
        if self.listed_socks5.contains(&listed) {
            ProxyProtocol::Socks5
        } else {
            ProxyProtocol::Http
        }
    }

    /// Checks the section without reading the password; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        let Some(credentials) = &self.credentials else {
            return Ok(());
        };
        let username = &credentials.username;
        if username.is_empty() || !username.chars().all(|c| c.is_ascii_graphic() && c != ':') {
            return Err(
                "upstream.credentials.username: must be printable ASCII without spaces or colons, as the vendor gave it"
                    .into(),
            );
        }
        let source = &credentials.password_from;
        if source.gcp_service_account_key.is_some()
            || source.aws_credentials.is_some()
            || source.gcp_metadata_server.is_some()
        {
            return Err(
                "upstream.credentials.passwordFrom: set `file` (a mounted Secret key) or `env`; a service-account key, a metadata-server token or AWS keys are not a password"
                    .into(),
            );
        }
        secret_value(&credentials.password_from)
            .map(|_| ())
            .map_err(|e| format!("upstream.credentials.passwordFrom: {e}"))
    }

    /// Where the password comes from, for the status: never the password.
    pub fn source(&self) -> String {
        self.credentials
            .as_ref()
            .and_then(|c| secret_value(&c.password_from).ok())
            .map(|v| format!("{v:?}"))
            .unwrap_or_default()
    }

    /// The login the upstreams require now (the file is read on every call, so a rotated Secret
    /// is picked up); `None` when they require none.
    pub fn login(&self, provider: &str) -> Result<Option<ProxyLogin>, InvalidCredentials> {
        let Some(credentials) = &self.credentials else {
            return Ok(None);
        };
        let invalid = |problem: String| InvalidCredentials {
            secret: format!(
                "{} (upstream.credentials of provider {provider})",
                self.source()
            ),
            problem,
        };
        let password = secret_value(&credentials.password_from)
            .and_then(|value| read_secret(&value))
            .map_err(invalid)?;
        ProxyLogin::of_upstream(&credentials.username, &password, self.hand_out_credentials)
            .map_err(invalid)
            .map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(yaml: &str) -> UpstreamSettings {
        crate::support::yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn the_section_is_checked_naming_the_field() {
        let cases = [
            ("{}", None),
            (
                "{credentials: {username: c-1, passwordFrom: {file: /x}}, handOutCredentials: true}",
                None,
            ),
            (
                "{credentials: {username: 'a:b', passwordFrom: {file: /x}}}",
                Some("upstream.credentials.username:"),
            ),
            (
                "{credentials: {username: a, passwordFrom: {}}}",
                Some("upstream.credentials.passwordFrom: valueFrom: set exactly one"),
            ),
            (
                "{credentials: {username: a, passwordFrom: {gcpServiceAccountKey: /k}}}",
                Some("upstream.credentials.passwordFrom: set `file`"),
            ),
            (
                "{credentials: {username: a, passwordFrom: {awsCredentials: {region: eu-west-1, accessKeyIdFrom: {file: /a}, secretAccessKeyFrom: {file: /b}}}}}",
                Some("upstream.credentials.passwordFrom: set `file`"),
            ),
        ];
        for (yaml, expected) in cases {
            match (settings(yaml).validate(), expected) {
                (Ok(()), None) => {}
                (Err(e), Some(expected)) => assert!(e.starts_with(expected), "{yaml}: {e}"),
                (result, _) => panic!("{yaml}: {result:?}"),
            }
        }
    }

    #[test]
    fn the_protocol_is_the_scheme_of_the_url_the_plugin_was_given() {
        let config = serde_json::json!({"upstreams": [
            {"url": "http://10.0.0.1:3128"},
            {"url": "socks5://Socks.Vendor.example:1080/", "zone": "eu"},
            {"url": "SOCKS5H://[fd00::7]:1080"},
            {"url": "nonsense"},
        ]});
        let listed = settings("{}").with_listed(&config);
        let http = ProxyProtocol::Http;
        let socks5 = ProxyProtocol::Socks5;
        assert_eq!(listed.protocol_for(None, "10.0.0.1", 3128), http);
        assert_eq!(
            listed.protocol_for(None, "socks.vendor.example", 1080),
            socks5
        );
        assert_eq!(listed.protocol_for(None, "fd00::7", 1080), socks5);
        assert_eq!(listed.protocol_for(None, "fd00::7", 1081), http);
        // A Proxy's own URL decides for it.
        let own = serde_json::json!({"url": "socks5://10.0.0.1:3128"});
        assert_eq!(listed.protocol_for(Some(&own), "10.0.0.1", 3128), socks5);
        let own = serde_json::json!({"url": "http://fd00::7:1080"});
        assert_eq!(listed.protocol_for(Some(&own), "fd00::7", 1080), http);
        assert_eq!(
            settings("{}").protocol_for(None, "socks.vendor.example", 1080),
            http
        );
    }

    #[test]
    fn the_login_is_read_from_the_file_and_handed_out_only_when_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("password");
        std::fs::write(&file, "s3cret\n").unwrap();
        let yaml = format!(
            "{{credentials: {{username: customer-1, passwordFrom: {{file: {}}}}}}}",
            file.display()
        );
        let login = settings(&yaml).login("vendor").unwrap().unwrap();
        assert_eq!(
            (login.username(), login.password()),
            ("customer-1", "s3cret")
        );
        assert!(!login.handed_out());
        assert!(!format!("{login:?}").contains("s3cret"));
        let shared = settings(&format!("{{handOutCredentials: true, {}", &yaml[1..]));
        assert!(shared.login("vendor").unwrap().unwrap().handed_out());
        assert!(settings("{}").login("vendor").unwrap().is_none());

        std::fs::remove_file(&file).unwrap();
        let missing = settings(&yaml).login("vendor").unwrap_err().to_string();
        assert!(
            missing.contains("upstream.credentials of provider vendor"),
            "{missing}"
        );
        assert!(missing.contains("cannot read"), "{missing}");
    }
}
