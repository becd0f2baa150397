//! The upstream provider's config and the one thing it parses: an upstream's URL. Pure, tested
//! natively.

use proxy_operator_sdk::ProviderError;
use serde::Deserialize;

/// The JSON Schema `describe` reports (the operator checks every provider instance's config
/// against it at start).
pub const SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "upstreams": {
      "type": "array",
      "maxItems": 10000,
      "description": "Proxies that exist already; a Proxy without providerOptions.url gets one no other Proxy holds",
      "items": {
        "type": "object",
        "additionalProperties": false,
        "required": ["url"],
        "properties": {
          "url": {"type": "string", "maxLength": 512, "description": "http://HOST:PORT or socks5://HOST:PORT, without credentials (the host adds them)"},
          "zone": {"type": "string", "maxLength": 63, "description": "What a Proxy's placement.zone or a lease's zone matches"}
        }
      }
    }
  }
}"#;

/// The provider instance's config.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// The upstreams handed to Proxies that do not name their own.
    #[serde(default)]
    pub upstreams: Vec<UpstreamEntry>,
}

/// One upstream of `config.upstreams`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UpstreamEntry {
    pub url: String,
    #[serde(default)]
    pub zone: Option<String>,
}

/// A Proxy's `spec.providerOptions`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProxyOptions {
    /// This Proxy's own upstream, instead of one from `config.upstreams`.
    #[serde(default)]
    pub url: Option<String>,
}

impl ProxyOptions {
    /// `spec.providerOptions` as the host passes it (JSON); errors name the field.
    pub fn parse(options: &str) -> Result<Self, ProviderError> {
        let options: ProxyOptions = serde_json::from_str(options).map_err(|e| {
            ProviderError::Permanent(format!(
                "spec.providerOptions: {e}; the upstream provider takes {{url: http://HOST:PORT}} or {{url: socks5://HOST:PORT}}"
            ))
        })?;
        if let Some(url) = &options.url {
            Upstream::parse(url).map_err(|problem| {
                ProviderError::Permanent(format!("spec.providerOptions.url: {problem}"))
            })?;
        }
        Ok(options)
    }
}

/// How the operator speaks to an upstream: HTTP (`CONNECT`, and plain requests in absolute
/// form) or SOCKS5 (RFC 1928, with RFC 1929's login when the operator holds one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Socks5,
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Socks5 => "socks5",
        }
    }
}

/// An upstream proxy, checked: where it answers, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub scheme: Scheme,
    /// A host name or an IP address (an IPv6 one without brackets).
    pub host: String,
    pub port: u16,
}

impl Upstream {
    /// Parses `http://HOST:PORT` or `socks5://HOST:PORT` (`socks5h://` is the same: the
    /// operator always lets the upstream resolve names; a trailing `/` allowed). The problem
    /// says what is wrong and never repeats a URL that carries a password.
    pub fn parse(url: &str) -> Result<Self, String> {
        const FORM: &str = "write it as http://HOST:PORT or socks5://HOST:PORT, e.g. http://proxy.vendor.example:8000";
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(format!("`{}` is not a URL; {FORM}", shown(url)));
        };
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => Scheme::Http,
            "socks5" | "socks5h" => Scheme::Socks5,
            "socks4" | "socks4a" | "socks" => {
                return Err(format!(
                    "SOCKS4 is not supported (no login, no IPv6): ask the vendor for the SOCKS5 port; {FORM}"
                ));
            }
            "https" => {
                return Err(format!(
                    "a TLS connection to the proxy (https://) is not supported; {FORM}"
                ));
            }
            other => {
                return Err(format!(
                    "the scheme `{}` is not supported; {FORM}",
                    shown(other)
                ));
            }
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains('@') {
            return Err(
                "must not carry a user name or password: put them in the providers config's `upstream.credentials` (read by the operator from a mounted Secret, never given to the plugin)"
                    .into(),
            );
        }
        if authority.contains(['/', '?', '#']) {
            return Err(format!("`{url}` has a path, query or fragment; {FORM}"));
        }
        let (host, port) = match authority.strip_prefix('[') {
            Some(v6) => {
                let (host, port) = v6
                    .split_once("]:")
                    .ok_or_else(|| format!("`{url}` has no port; {FORM}"))?;
                if host.parse::<std::net::Ipv6Addr>().is_err() {
                    return Err(format!("`{host}` is not an IPv6 address; {FORM}"));
                }
                (host, port)
            }
            None => authority
                .rsplit_once(':')
                .ok_or_else(|| format!("`{url}` has no port; {FORM}"))?,
        };
        let port = match port.parse::<u16>() {
            Ok(port) if port > 0 => port,
            _ => return Err(format!("`{url}` has no valid port (1-65535); {FORM}")),
        };
        let valid_name = !host.is_empty()
            && host.len() <= 253
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
        if !valid_name && host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("`{url}` has no valid host name or address; {FORM}"));
        }
        Ok(Upstream {
            scheme,
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    /// `host:port`, an IPv6 address in brackets: where the upstream answers, whatever its
    /// scheme.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The URL as recorded and compared: `http://host:port` or `socks5://host:port`.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme.as_str(), self.authority())
    }
}

/// A value put in a message: cut short and printable, so a hostile config cannot flood a status.
fn shown(text: &str) -> String {
    text.chars().take(80).filter(|c| !c.is_control()).collect()
}

/// Checks `config.upstreams`: every URL parses and none is listed twice.
pub fn validate(config: &Config) -> Result<(), ProviderError> {
    let mut seen = std::collections::HashMap::new();
    for (index, entry) in config.upstreams.iter().enumerate() {
        let at = format!("config.upstreams[{index}]");
        let upstream = Upstream::parse(&entry.url)
            .map_err(|problem| ProviderError::InvalidConfig(format!("{at}.url: {problem}")))?;
        // By address, not URL: the operator tells an upstream's scheme by its address, so one
        // address cannot be listed as HTTP and as SOCKS5.
        if let Some(first) = seen.insert(upstream.authority(), index) {
            return Err(ProviderError::InvalidConfig(format!(
                "{at}.url: {} is listed already as config.upstreams[{first}]; list each upstream (address and port) once",
                upstream.authority()
            )));
        }
        if let Some(zone) = &entry.zone
            && (zone.is_empty() || zone.chars().any(|c| c.is_control() || c == ' '))
        {
            return Err(ProviderError::InvalidConfig(format!(
                "{at}.zone: must be a non-empty name without spaces, e.g. eu-west"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls_are_parsed_or_refused_with_the_fix() {
        let ok = [
            ("http://10.0.0.7:3128", "10.0.0.7", 3128),
            (
                "http://Proxy.Vendor.example:8000/",
                "proxy.vendor.example",
                8000,
            ),
            ("HTTP://[fd00::7]:3128", "fd00::7", 3128),
            ("socks5://10.0.0.8:1080", "10.0.0.8", 1080),
            (
                "SOCKS5H://Proxy.Vendor.example:1080",
                "proxy.vendor.example",
                1080,
            ),
        ];
        for (url, host, port) in ok {
            let parsed = Upstream::parse(url).unwrap();
            assert_eq!((parsed.host.as_str(), parsed.port), (host, port), "{url}");
        }
        assert_eq!(
            Upstream::parse("http://[fd00::7]:3128").unwrap().url(),
            "http://[fd00::7]:3128"
        );
        let socks = Upstream::parse("socks5h://Proxy.example:1080/").unwrap();
        assert_eq!(socks.scheme, Scheme::Socks5);
        assert_eq!(socks.url(), "socks5://proxy.example:1080");
        assert_eq!(
            Upstream::parse("socks5://[fd00::7]:1080").unwrap().url(),
            "socks5://[fd00::7]:1080"
        );
        let refused = [
            ("10.0.0.7:3128", "is not a URL"),
            ("socks4://10.0.0.7:1080", "SOCKS4 is not supported"),
            ("socks5://10.0.0.7", "no port"),
            ("socks5://user:pw@10.0.0.7:1080", "upstream.credentials"),
            ("https://10.0.0.7:3128", "TLS"),
            ("ftp://10.0.0.7:21", "scheme `ftp`"),
            ("http://10.0.0.7", "no port"),
            ("http://10.0.0.7:0", "no valid port"),
            ("http://10.0.0.7:99999", "no valid port"),
            ("http://10.0.0.7:3128/path", "path"),
            ("http://bad_host:3128", "no valid host"),
            ("http://:3128", "no valid host"),
            ("http://[zz::1]:3128", "not an IPv6"),
        ];
        for (url, expected) in refused {
            let problem = Upstream::parse(url).unwrap_err();
            assert!(problem.contains(expected), "{url}: {problem}");
            assert!(
                problem.contains("http://HOST:PORT") || problem.contains("upstream.credentials"),
                "{url}: the fix: {problem}"
            );
        }
    }

    #[test]
    fn a_url_with_credentials_is_refused_without_repeating_them() {
        for url in [
            "http://customer:s3cret@10.0.0.7:3128",
            "socks5://customer:s3cret@10.0.0.7:1080",
        ] {
            let problem = Upstream::parse(url).unwrap_err();
            assert!(problem.contains("upstream.credentials"), "{problem}");
            assert!(!problem.contains("s3cret"), "{problem}");
        }
    }

    #[test]
    fn a_bad_provider_options_url_is_refused_naming_the_field() {
        let ProviderError::Permanent(message) =
            ProxyOptions::parse(r#"{"url": "socks4://x:1"}"#).unwrap_err()
        else {
            panic!("permanent")
        };
        assert!(
            message.starts_with("spec.providerOptions.url: "),
            "{message}"
        );
        let ProviderError::Permanent(message) =
            ProxyOptions::parse(r#"{"uri": "http://x:1"}"#).unwrap_err()
        else {
            panic!("permanent")
        };
        assert!(message.contains("spec.providerOptions"), "{message}");
        assert_eq!(ProxyOptions::parse("{}").unwrap(), ProxyOptions::default());
    }

    #[test]
    fn the_config_is_checked_entry_by_entry() {
        let config = |urls: &[&str]| Config {
            upstreams: urls
                .iter()
                .map(|u| UpstreamEntry {
                    url: u.to_string(),
                    zone: None,
                })
                .collect(),
        };
        assert!(validate(&config(&["http://a:1", "http://b:1"])).is_ok());
        let ProviderError::InvalidConfig(message) =
            validate(&config(&["http://a:1", "http://A:1/"])).unwrap_err()
        else {
            panic!("invalid-config")
        };
        assert!(message.starts_with("config.upstreams[1].url:"), "{message}");
        // One address is HTTP or SOCKS5, not both.
        let ProviderError::InvalidConfig(message) =
            validate(&config(&["http://a:1", "socks5://a:1"])).unwrap_err()
        else {
            panic!("invalid-config")
        };
        assert!(
            message.starts_with("config.upstreams[1].url: a:1 is listed already"),
            "{message}"
        );
        assert!(validate(&config(&["http://a:1", "socks5://a:2"])).is_ok());
        let ProviderError::InvalidConfig(message) =
            validate(&config(&["http://a:1", "nope"])).unwrap_err()
        else {
            panic!("invalid-config")
        };
        assert!(message.starts_with("config.upstreams[1].url:"), "{message}");
    }
}
