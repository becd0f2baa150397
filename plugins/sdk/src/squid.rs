//! The squid every provider ships, configured the same way whatever runs it (a Pod, a VM): who
//! may use it (`allowFrom`), where CONNECT may go (`connectPorts`), no cache, no headers that
//! tell a site about the crawler behind it.
//!
//! Providers keep the fields `allowFrom`, `connectPorts` and `accessLog` in their config (with
//! [`default_allow_from`] and [`default_connect_ports`]; `serde(flatten)` cannot be combined with
//! `deny_unknown_fields`), turn them into [`SquidOptions`], check them with
//! [`SquidOptions::validate`] and render them with [`squid_conf`]; VM providers ship the result
//! through cloud-init with [`vm_setup_script`].

use serde::Deserialize;

use crate::{Owner, ProviderError, ProxyCredentials};

/// Who may use a proxy when the config says nothing: the private ranges pods, nodes and LANs
/// usually have. squid refuses everyone else, so a proxy is never open to the internet.
pub const DEFAULT_ALLOW_FROM: [&str; 3] = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"];

/// Where CONNECT may go when the config says nothing: HTTPS only (squid's own safe default).
pub const DEFAULT_CONNECT_PORTS: [u16; 1] = [443];

/// The squid settings of a provider config (the same field names in every provider).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SquidOptions {
    /// Client address ranges (CIDR) squid accepts.
    #[serde(default = "default_allow_from")]
    pub allow_from: Vec<String>,
    /// Ports crawlers may `CONNECT` to.
    #[serde(default = "default_connect_ports")]
    pub connect_ports: Vec<u16>,
    /// Keep squid's access log (off by default: a crawler's proxy logs every request).
    #[serde(default)]
    pub access_log: bool,
}

impl Default for SquidOptions {
    fn default() -> Self {
        SquidOptions {
            allow_from: default_allow_from(),
            connect_ports: default_connect_ports(),
            access_log: false,
        }
    }
}

/// `allowFrom` when the config gives none: [`DEFAULT_ALLOW_FROM`].
pub fn default_allow_from() -> Vec<String> {
    DEFAULT_ALLOW_FROM.iter().map(|s| s.to_string()).collect()
}

/// `connectPorts` when the config gives none: [`DEFAULT_CONNECT_PORTS`].
pub fn default_connect_ports() -> Vec<u16> {
    DEFAULT_CONNECT_PORTS.to_vec()
}

impl SquidOptions {
    /// Checks what the types cannot; messages name `config.allowFrom` / `config.connectPorts`.
    pub fn validate(&self) -> Result<(), ProviderError> {
        let invalid = |m: String| Err(ProviderError::InvalidConfig(m));
        if self.allow_from.is_empty() {
            return invalid(
                "config.allowFrom: empty, so squid would refuse every client; list the CIDRs of your crawlers and of the operator, e.g. [10.0.0.0/8]".into(),
            );
        }
        for (index, cidr) in self.allow_from.iter().enumerate() {
            if !is_cidr(cidr) {
                return invalid(format!(
                    "config.allowFrom[{index}]: `{cidr}` is not an address range like 10.0.0.0/8 or fd00::/8"
                ));
            }
            if cidr.ends_with("/0") {
                return invalid(format!(
                    "config.allowFrom[{index}]: `{cidr}` lets anyone use the proxy; list your crawlers' ranges"
                ));
            }
        }
        if self.connect_ports.is_empty() {
            return invalid(
                "config.connectPorts: empty, so no HTTPS site could be reached; e.g. [443]".into(),
            );
        }
        if let Some(index) = self.connect_ports.iter().position(|p| *p == 0) {
            return invalid(format!(
                "config.connectPorts[{index}]: 0 is not a port; use 1-65535"
            ));
        }
        Ok(())
    }
}

/// Whether a VM provider configures squid for a Proxy: `config_default` (the provider config's
/// `managedSquid`), unless `spec.providerOptions.managedSquid` says otherwise (a Proxy whose own
/// cloud-init manages squid).
pub fn managed(config_default: bool, provider_options: &str) -> Result<bool, ProviderError> {
    if provider_options.trim().is_empty() {
        return Ok(config_default);
    }
    let options: serde_json::Value = serde_json::from_str(provider_options).map_err(|e| {
        ProviderError::Permanent(format!("spec.providerOptions must be a JSON object ({e})"))
    })?;
    match options.get("managedSquid") {
        None => Ok(config_default),
        Some(serde_json::Value::Bool(on)) => Ok(*on),
        Some(other) => Err(ProviderError::Permanent(format!(
            "spec.providerOptions.managedSquid: {other} is not true or false; set false when the Proxy's own cloud-init configures squid"
        ))),
    }
}

/// `a.b.c.d/n` or an IPv6 prefix.
pub fn is_cidr(value: &str) -> bool {
    let Some((address, bits)) = value.split_once('/') else {
        return false;
    };
    let Ok(bits) = bits.parse::<u8>() else {
        return false;
    };
    match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => bits <= 32,
        Ok(std::net::IpAddr::V6(_)) => bits <= 128,
        Err(_) => false,
    }
}

/// What squid runs on, which decides where its files go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SquidHost<'a> {
    /// A container: squid's own log to stderr (opened before it drops root, so `kubectl logs`
    /// shows it), no pid file, the access log (when on) under `log_dir`, an emptyDir.
    Container { log_dir: &'a str },
    /// A VM with the distribution's squid package and its service unit.
    Vm {
        /// `visible_hostname`: without it squid looks its own name up at every start.
        hostname: &'a str,
        /// `dns_nameservers`; empty: the VM's resolv.conf.
        dns_nameservers: &'a [String],
    },
}

/// squid's basic-auth helper where Debian and Ubuntu (and their squid images) install it. The VM
/// setup script finds the distribution's own path itself.
pub const DEBIAN_BASIC_AUTH_HELPER: &str = "/usr/lib/squid/basic_ncsa_auth";

/// Where a VM's squid reads its password file.
pub const VM_PASSWORD_FILE: &str = "/etc/squid/proxy-operator.passwd";

/// How squid checks crawlers' credentials: the helper and the password file it reads (one line,
/// [`password_file`]). The helper re-reads the file when it changes, so a rotation needs no
/// restart; squid keeps a checked password for `credentialsttl`, so a rotated-out password
/// stops working within that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BasicAuth<'a> {
    pub helper: &'a str,
    pub password_file: &'a str,
}

/// The password file squid's `basic_ncsa_auth` reads: `username:hash`.
pub fn password_file(credentials: &ProxyCredentials) -> String {
    format!("{}:{}\n", credentials.username, credentials.password_hash)
}

/// Checks what the host sends, so a bad value cannot break squid.conf or the password file.
pub fn validate_credentials(credentials: &ProxyCredentials) -> Result<(), ProviderError> {
    let printable_without = |value: &str, forbidden: char| {
        !value.is_empty()
            && value
                .chars()
                .all(|c| c.is_ascii_graphic() && c != forbidden)
    };
    if !printable_without(&credentials.username, ':') {
        return Err(ProviderError::Permanent(
            "credentials.username: empty, or holds a colon, space or non-ASCII character".into(),
        ));
    }
    if !printable_without(&credentials.password_hash, ':')
        || !credentials.password_hash.starts_with('$')
    {
        return Err(ProviderError::Permanent(
            "credentials.password-hash: not a crypt(3) hash like `$6$salt$hash`".into(),
        ));
    }
    Ok(())
}

/// squid.conf for one proxy: only `allow_from` may use it, CONNECT only to `connect_ports`, and
/// with `auth`, only crawlers with the proxy's credentials (HTTP basic auth).
pub fn squid_conf(
    options: &SquidOptions,
    owner: &Owner,
    port: u16,
    host: SquidHost<'_>,
    auth: Option<BasicAuth<'_>>,
) -> String {
    let connect_ports = options
        .connect_ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(" ");
    let mut conf = format!(
        "# proxy-operator: squid for Proxy {}/{} (uid {})\n\
         http_port {port}\n\
         acl crawlers src {allow}\n\
         acl SSL_ports port {connect_ports}\n\
         acl Safe_ports port 80 443 1025-65535 {connect_ports}\n\
         acl CONNECT method CONNECT\n\
         http_access deny !Safe_ports\n\
         http_access deny CONNECT !SSL_ports\n",
        owner.namespace,
        owner.name,
        owner.uid,
        allow = options.allow_from.join(" "),
    );
    match auth {
        // Outside allowFrom: refused without a challenge. Inside: a 407 asks for credentials.
        Some(BasicAuth {
            helper,
            password_file,
        }) => conf.push_str(&format!(
            "auth_param basic program {helper} {password_file}\n\
             auth_param basic children 4 startup=1 idle=1\n\
             auth_param basic realm proxy-operator\n\
             auth_param basic credentialsttl 5 seconds\n\
             acl proxy_users proxy_auth REQUIRED\n\
             http_access deny !crawlers\n\
             http_access allow proxy_users\n"
        )),
        None => conf.push_str("http_access allow crawlers\n"),
    }
    conf.push_str(
        "http_access deny all\n\
         cache deny all\n\
         cache_mem 8 MB\n\
         max_filedescriptors 1024\n\
         logfile_rotate 0\n\
         shutdown_lifetime 1 seconds\n\
         via off\n\
         forwarded_for delete\n",
    );
    let log_dir = match host {
        SquidHost::Container { log_dir } => {
            conf.push_str("cache_log /dev/stderr\npid_filename none\ncoredump_dir /tmp\n");
            log_dir
        }
        SquidHost::Vm {
            hostname,
            dns_nameservers,
        } => {
            conf.push_str(&format!(
                "cache_log /var/log/squid/cache.log\ncoredump_dir /var/spool/squid\nvisible_hostname {hostname}\n"
            ));
            if !dns_nameservers.is_empty() {
                conf.push_str(&format!("dns_nameservers {}\n", dns_nameservers.join(" ")));
            }
            "/var/log/squid"
        }
    };
    if options.access_log {
        conf.push_str(&format!("access_log daemon:{log_dir}/access.log squid\n"));
    } else {
        conf.push_str("access_log none\n");
    }
    conf
}

/// A cloud-init script part (`#!/bin/sh`) that installs squid when the image lacks it, writes
/// `squid_conf` as `/etc/squid/squid.conf`, makes the VM's own name resolve locally (squid
/// stalls at start otherwise), and (re)starts squid. Shipped as vendor-data, because cloud-init's
/// merge drops vendor-data keys that user-data defines, while a script part always runs.
/// The restart does not wait (`--no-block`): an image may order squid after cloud-init, which
/// is still running this script. With `credentials`, it writes the password file
/// ([`VM_PASSWORD_FILE`], readable by squid's group only) and points squid.conf at the
/// distribution's own `basic_ncsa_auth` when it is not Debian's.
pub fn vm_setup_script(
    squid_conf: &str,
    hostname: &str,
    credentials: Option<&ProxyCredentials>,
) -> String {
    // The name goes into the script unquoted by the shell: keep only what a host name may hold.
    let hostname: String = hostname
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
        .collect();
    // The heredoc delimiter is quoted: nothing in the config is expanded by the shell.
    let mut delimiter = "PROXY_OPERATOR_SQUID_CONF".to_string();
    while squid_conf.lines().any(|l| l == delimiter) {
        delimiter.push('_');
    }
    let password_setup = credentials
        .map(|c| vm_password_setup(&password_file(c)))
        .unwrap_or_default();
    format!(
        r#"#!/bin/sh
# proxy-operator: the managed squid of this proxy (turn off with managedSquid: false).
set -u
if ! command -v squid >/dev/null 2>&1 && [ ! -x /usr/sbin/squid ]; then
  if command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=300 update -q || true
    apt-get -o DPkg::Lock::Timeout=300 install -y -q squid
  elif command -v dnf >/dev/null 2>&1; then
    dnf install -y squid
  elif command -v yum >/dev/null 2>&1; then
    yum install -y squid
  elif command -v apk >/dev/null 2>&1; then
    apk add --no-cache squid
  elif command -v zypper >/dev/null 2>&1; then
    zypper --non-interactive install squid
  else
    echo "proxy-operator: no known package manager; cannot install squid" >&2
    exit 1
  fi
fi
mkdir -p /etc/squid
cat > /etc/squid/squid.conf <<'{delimiter}'
{squid_conf}{delimiter}
{password_setup}grep -qs '[[:space:]]{hostname}$' /etc/hosts || echo '127.0.1.1 {hostname}' >> /etc/hosts
if command -v systemctl >/dev/null 2>&1; then
  # enable reloads systemd, which takes seconds on a slow VM: only when needed.
  systemctl is-enabled --quiet squid 2>/dev/null || systemctl enable squid >/dev/null 2>&1 || true
  systemctl restart --no-block squid
elif command -v rc-service >/dev/null 2>&1; then
  rc-update add squid default >/dev/null 2>&1 || true
  rc-service squid restart
else
  squid -k reconfigure 2>/dev/null || squid
fi
"#
    )
}

/// The cloud-init script that sets up a VM's managed squid for `spec` (squid listening on
/// `port`): [`squid_conf`] for a VM named `spec.name`, with basic auth when the spec carries
/// credentials, shipped by [`vm_setup_script`].
pub fn vm_setup(
    options: &SquidOptions,
    spec: &crate::InstanceSpec,
    port: u16,
    dns_nameservers: &[String],
) -> Result<String, ProviderError> {
    if let Some(credentials) = &spec.credentials {
        validate_credentials(credentials)?;
    }
    let auth = spec.credentials.as_ref().map(|_| BasicAuth {
        helper: DEBIAN_BASIC_AUTH_HELPER,
        password_file: VM_PASSWORD_FILE,
    });
    let host = SquidHost::Vm {
        hostname: &spec.name,
        dns_nameservers,
    };
    let conf = squid_conf(options, &spec.owner, port, host, auth);
    Ok(vm_setup_script(
        &conf,
        &spec.name,
        spec.credentials.as_ref(),
    ))
}

/// The script lines that write the password file and find the auth helper.
fn vm_password_setup(password_file: &str) -> String {
    let mut delimiter = "PROXY_OPERATOR_PASSWORDS".to_string();
    while password_file.lines().any(|l| l == delimiter) {
        delimiter.push('_');
    }
    format!(
        r#"(umask 077; cat > {VM_PASSWORD_FILE} <<'{delimiter}'
{password_file}{delimiter}
)
chgrp proxy {VM_PASSWORD_FILE} 2>/dev/null || chgrp squid {VM_PASSWORD_FILE} 2>/dev/null || true
chmod 0640 {VM_PASSWORD_FILE}
for helper in {DEBIAN_BASIC_AUTH_HELPER} /usr/lib64/squid/basic_ncsa_auth /usr/libexec/squid/basic_ncsa_auth; do
  if [ -x "$helper" ]; then
    sed -i "s#{DEBIAN_BASIC_AUTH_HELPER} #$helper #" /etc/squid/squid.conf
    break
  fi
done
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> Owner {
        Owner {
            namespace: "crawlers".into(),
            name: "egress-1".into(),
            uid: "5f0c6e1a".into(),
            operator_id: "op".into(),
        }
    }

    #[test]
    fn defaults_are_private_ranges_and_https() {
        let options: SquidOptions = serde_json::from_str("{}").unwrap();
        assert_eq!(options, SquidOptions::default());
        assert_eq!(options.allow_from, DEFAULT_ALLOW_FROM);
        assert_eq!(options.connect_ports, [443]);
        options.validate().unwrap();
    }

    #[test]
    fn validation_names_the_field_and_the_fix() {
        let error = |options: SquidOptions| match options.validate() {
            Err(ProviderError::InvalidConfig(m)) => m,
            other => panic!("{other:?}"),
        };
        let with = |allow: &[&str], ports: &[u16]| SquidOptions {
            allow_from: allow.iter().map(|s| s.to_string()).collect(),
            connect_ports: ports.to_vec(),
            access_log: false,
        };
        assert!(error(with(&[], &[443])).starts_with("config.allowFrom: empty"));
        assert!(
            error(with(&["10.0.0.0/8", "10.0.0.0"], &[443])).starts_with("config.allowFrom[1]:")
        );
        assert!(error(with(&["0.0.0.0/0"], &[443])).contains("lets anyone use the proxy"));
        assert!(error(with(&["::/0"], &[443])).contains("lets anyone use the proxy"));
        assert!(error(with(&["10.0.0.0/8"], &[])).starts_with("config.connectPorts: empty"));
        assert!(error(with(&["10.0.0.0/8"], &[443, 0])).starts_with("config.connectPorts[1]:"));
    }

    #[test]
    fn cidrs() {
        assert!(is_cidr("fd00::/8") && is_cidr("192.168.0.0/16") && is_cidr("192.0.2.1/32"));
        assert!(!is_cidr("10.0.0.0/33") && !is_cidr("example.com/8") && !is_cidr("10.0.0.1"));
    }

    #[test]
    fn vm_conf_names_the_host_and_keeps_the_distribution_layout() {
        let options = SquidOptions {
            allow_from: vec!["192.0.2.1/32".into()],
            connect_ports: vec![443, 8443],
            access_log: true,
        };
        let dns = ["127.0.0.1".to_string()];
        let conf = squid_conf(
            &options,
            &owner(),
            3128,
            SquidHost::Vm {
                hostname: "px-1",
                dns_nameservers: &dns,
            },
            None,
        );
        for line in [
            "http_port 3128",
            "acl crawlers src 192.0.2.1/32",
            "acl SSL_ports port 443 8443",
            "http_access deny CONNECT !SSL_ports",
            "visible_hostname px-1",
            "dns_nameservers 127.0.0.1",
            "cache_log /var/log/squid/cache.log",
            "access_log daemon:/var/log/squid/access.log squid",
        ] {
            assert!(
                conf.lines().any(|l| l == line),
                "{line:?} missing in\n{conf}"
            );
        }
        assert!(
            !conf.contains("pid_filename"),
            "the service unit owns the pid file"
        );
        let no_dns = squid_conf(
            &SquidOptions::default(),
            &owner(),
            3128,
            SquidHost::Vm {
                hostname: "px-1",
                dns_nameservers: &[],
            },
            None,
        );
        assert!(!no_dns.contains("dns_nameservers"));
        assert!(no_dns.ends_with("access_log none\n"));
    }

    #[test]
    fn setup_script_writes_the_conf_verbatim() {
        let conf =
            "http_port 3128\n$HOME `x` PROXY_OPERATOR_SQUID_CONF\nPROXY_OPERATOR_SQUID_CONF\n";
        let script = vm_setup_script(conf, "px-1", None);
        assert!(script.starts_with("#!/bin/sh\n"));
        assert!(!script.contains(VM_PASSWORD_FILE));
        assert!(script.contains(
            "cat > /etc/squid/squid.conf <<'PROXY_OPERATOR_SQUID_CONF_'\nhttp_port 3128\n$HOME `x` PROXY_OPERATOR_SQUID_CONF\nPROXY_OPERATOR_SQUID_CONF\nPROXY_OPERATOR_SQUID_CONF_\n"
        ));
        assert!(script.contains("systemctl restart --no-block squid"));
        assert!(script.contains("echo '127.0.1.1 px-1' >> /etc/hosts"));
    }

    fn credentials() -> ProxyCredentials {
        ProxyCredentials {
            username: "px-egress-1".into(),
            password_hash: "$6$c2FsdA$aGFzaA".into(),
        }
    }

    #[test]
    fn with_credentials_squid_challenges_only_allowed_clients() {
        let auth = BasicAuth {
            helper: DEBIAN_BASIC_AUTH_HELPER,
            password_file: "/etc/squid/auth/passwd",
        };
        let conf = squid_conf(
            &SquidOptions::default(),
            &owner(),
            3128,
            SquidHost::Container { log_dir: "/l" },
            Some(auth),
        );
        let access: Vec<&str> = conf
            .lines()
            .filter(|l| l.starts_with("http_access"))
            .collect();
        assert_eq!(
            access,
            [
                "http_access deny !Safe_ports",
                "http_access deny CONNECT !SSL_ports",
                "http_access deny !crawlers",
                "http_access allow proxy_users",
                "http_access deny all",
            ]
        );
        assert!(conf.contains(
            "auth_param basic program /usr/lib/squid/basic_ncsa_auth /etc/squid/auth/passwd\n"
        ));
        let open = squid_conf(
            &SquidOptions::default(),
            &owner(),
            3128,
            SquidHost::Container { log_dir: "/l" },
            None,
        );
        assert!(open.contains("http_access allow crawlers\n") && !open.contains("auth_param"));
    }

    #[test]
    fn the_vm_script_writes_the_password_file_not_world_readable() {
        let script = vm_setup_script("http_port 3128\n", "px-1", Some(&credentials()));
        assert!(script.contains(&format!(
            "(umask 077; cat > {VM_PASSWORD_FILE} <<'PROXY_OPERATOR_PASSWORDS'\npx-egress-1:$6$c2FsdA$aGFzaA\nPROXY_OPERATOR_PASSWORDS\n)"
        )));
        assert!(script.contains(&format!("chmod 0640 {VM_PASSWORD_FILE}")));
        // Written before squid is (re)started.
        assert!(script.find(VM_PASSWORD_FILE).unwrap() < script.find("systemctl restart").unwrap());
    }

    #[test]
    fn credentials_that_would_break_the_files_are_refused() {
        validate_credentials(&credentials()).unwrap();
        for (username, hash) in [
            ("", "$6$s$h"),
            ("a:b", "$6$s$h"),
            ("a b", "$6$s$h"),
            ("a\nb", "$6$s$h"),
            ("a", "plain"),
            ("a", "$6$s$h\nroot:$6$x$y"),
        ] {
            let bad = ProxyCredentials {
                username: username.into(),
                password_hash: hash.into(),
            };
            assert!(
                matches!(validate_credentials(&bad), Err(ProviderError::Permanent(_))),
                "{username:?} {hash:?}"
            );
        }
    }
}
