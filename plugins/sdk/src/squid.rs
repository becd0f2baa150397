//! The squid every provider ships, configured the same way whatever runs it (a Pod, a VM): who
//! may use it (`allowFrom`), where CONNECT may go (`connectPorts`), which destinations it refuses
//! (the network it stands in: [`REFUSED_DESTINATIONS`], `allowDestinations`,
//! `denyDestinations`), no cache, no headers that tell a site about the crawler behind it.
//!
//! Providers keep the fields `allowFrom`, `connectPorts`, `allowDestinations`,
//! `denyDestinations` and `accessLog` in their config (with [`default_allow_from`] and
//! [`default_connect_ports`]; `serde(flatten)` cannot be combined with `deny_unknown_fields`),
//! turn them into [`SquidOptions`], check them with
//! [`SquidOptions::validate`] and render them with [`squid_conf`]; VM providers ship the result
//! through cloud-init with [`vm_setup_script`].

use serde::Deserialize;

use crate::{Owner, ProviderError, ProxyCredentials};

/// Who may use a proxy when the config says nothing: the private ranges pods, nodes and LANs
/// usually have. squid refuses everyone else, so a proxy is never open to the internet.
pub const DEFAULT_ALLOW_FROM: [&str; 3] = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"];

/// Where CONNECT may go when the config says nothing: HTTPS only (squid's own safe default).
pub const DEFAULT_CONNECT_PORTS: [u16; 1] = [443];

/// Destinations squid refuses unless `allowDestinations` lists them: the network a proxy stands
/// in, which whoever holds a lease must not reach through it (the cloud's metadata server, the
/// cluster's API server and Pods, the hypervisor, the LAN). IPv4-mapped IPv6 forms
/// (`::ffff:10.1.2.3`) are covered by the IPv4 ranges themselves, because squid holds every IPv4
/// address in that form; the NAT64 forms (`64:ff9b::/96`) are added by [`squid_conf`].
pub const REFUSED_DESTINATIONS: [&str; 10] = [
    "0.0.0.0/8",      // "this network"; 0.0.0.0 reaches the proxy's own host
    "10.0.0.0/8",     // RFC 1918
    "100.64.0.0/10",  // shared address space (carrier NAT, some clusters' Pods)
    "127.0.0.0/8",    // loopback
    "169.254.0.0/16", // link-local, with the cloud metadata address 169.254.169.254
    "172.16.0.0/12",  // RFC 1918
    "192.168.0.0/16", // RFC 1918
    "::/96",          // IPv6 unspecified, loopback (::1) and IPv4-compatible forms
    "fc00::/7",       // IPv6 unique local
    "fe80::/10",      // IPv6 link-local
];

/// The NAT64 well-known prefix (RFC 6052): `64:ff9b::10.1.2.3` reaches 10.1.2.3 through a NAT64
/// gateway, so every refused IPv4 range is refused in this form too.
pub const NAT64_PREFIX: std::net::Ipv6Addr =
    std::net::Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0);

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
    /// Destinations (CIDR) reached although [`REFUSED_DESTINATIONS`] or `cluster_ranges` hold
    /// them, e.g. an internal site the crawlers must fetch.
    #[serde(default)]
    pub allow_destinations: Vec<String>,
    /// Destinations (CIDR) always refused, even inside `allow_destinations`.
    #[serde(default)]
    pub deny_destinations: Vec<String>,
    /// The cluster's Service and Pod ranges (the kubernetes provider's `clusterRanges`), refused
    /// like [`REFUSED_DESTINATIONS`]; empty for VM providers.
    #[serde(default)]
    pub cluster_ranges: Vec<String>,
    /// Keep squid's access log (off by default: a crawler's proxy logs every request).
    #[serde(default)]
    pub access_log: bool,
}

impl Default for SquidOptions {
    fn default() -> Self {
        SquidOptions {
            allow_from: default_allow_from(),
            connect_ports: default_connect_ports(),
            allow_destinations: Vec::new(),
            deny_destinations: Vec::new(),
            cluster_ranges: Vec::new(),
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
        for (field, list) in [
            ("allowDestinations", &self.allow_destinations),
            ("denyDestinations", &self.deny_destinations),
            ("clusterRanges", &self.cluster_ranges),
        ] {
            for (index, cidr) in list.iter().enumerate() {
                check_destination(cidr).map_err(|why| {
                    ProviderError::InvalidConfig(format!("config.{field}[{index}]: `{cidr}` {why}"))
                })?;
            }
        }
        Ok(())
    }
}

/// An address range as squid reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub address: std::net::IpAddr,
    pub prefix: u8,
}

impl Cidr {
    /// `a.b.c.d/n` or an IPv6 prefix, as written (bits beyond the prefix kept: see
    /// [`Cidr::network`]).
    pub fn parse(value: &str) -> Option<Cidr> {
        let (address, bits) = value.split_once('/')?;
        if !bits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let prefix = bits.parse::<u8>().ok()?;
        let address = address.parse::<std::net::IpAddr>().ok()?;
        let max = if address.is_ipv4() { 32 } else { 128 };
        (prefix <= max).then_some(Cidr { address, prefix })
    }

    /// The address left-aligned in 128 bits (so a prefix masks the top bits), and its width.
    fn bits(self) -> (u128, u32) {
        match self.address {
            std::net::IpAddr::V4(a) => (u128::from(u32::from(a)) << 96, 32),
            std::net::IpAddr::V6(a) => (u128::from(a), 128),
        }
    }

    /// The range with the bits beyond its prefix cleared.
    pub fn network(self) -> Cidr {
        let (bits, _) = self.bits();
        let mask = mask(u32::from(self.prefix));
        let address = match self.address {
            std::net::IpAddr::V4(_) => {
                std::net::IpAddr::V4(std::net::Ipv4Addr::from(((bits & mask) >> 96) as u32))
            }
            std::net::IpAddr::V6(_) => std::net::IpAddr::V6(std::net::Ipv6Addr::from(bits & mask)),
        };
        Cidr { address, ..self }
    }

    /// Whether `other` lies wholly inside this range (same family).
    pub fn contains(self, other: Cidr) -> bool {
        let ((a, width_a), (b, width_b)) = (self.bits(), other.bits());
        width_a == width_b
            && self.prefix <= other.prefix
            && (a ^ b) & mask(u32::from(self.prefix)) == 0
    }

    /// Whether the two ranges share an address (same family).
    pub fn overlaps(self, other: Cidr) -> bool {
        self.contains(other) || other.contains(self)
    }

    /// The NAT64 form (`64:ff9b::/96` + the IPv4 range) of an IPv4 range.
    pub fn nat64(self) -> Option<Cidr> {
        match self.address {
            std::net::IpAddr::V4(a) => Some(Cidr {
                address: std::net::IpAddr::V6(std::net::Ipv6Addr::from(
                    u128::from(NAT64_PREFIX) | u128::from(u32::from(a)),
                )),
                prefix: 96 + self.prefix,
            }),
            std::net::IpAddr::V6(_) => None,
        }
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Rust writes mapped addresses as `::ffff:a.b.c.d`; squid reads any IPv6 text.
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

/// The top `prefix` bits of 128 set.
fn mask(prefix: u32) -> u128 {
    if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - prefix)
    }
}

/// `::ffff:0:0/96`: squid holds IPv4 addresses in this form, so an IPv6 range touching it is
/// an IPv4 range to squid, read with a 128-bit mask it misapplies.
const IPV4_MAPPED: Cidr = Cidr {
    address: std::net::IpAddr::V6(std::net::Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0)),
    prefix: 96,
};

/// Why a destination range cannot be used, said as the end of a sentence after the value.
fn check_destination(value: &str) -> Result<Cidr, String> {
    let Some(cidr) = Cidr::parse(value) else {
        return Err("is not an address range like 10.1.2.3/32 or fd00::/8".into());
    };
    if cidr.prefix == 0 {
        return Err("holds every address; list the ranges you mean".into());
    }
    // squid warns and reads such a range oddly; the user most likely mistyped the prefix.
    if cidr.network() != cidr {
        return Err(format!(
            "has address bits beyond its /{}; write the range's first address, `{}`",
            cidr.prefix,
            cidr.network()
        ));
    }
    if cidr.address.is_ipv6() && cidr.overlaps(IPV4_MAPPED) {
        return Err(
            "is an IPv4-mapped range (::ffff:0:0/96), which squid misreads; write it as IPv4, e.g. 10.0.0.0/8"
                .into(),
        );
    }
    Ok(cidr)
}

/// The ranges of `values` (checked by [`SquidOptions::validate`]) without those inside another
/// one: squid warns about, and drops, a range inside another of the same ACL.
fn outermost(values: impl IntoIterator<Item = Cidr>) -> Vec<Cidr> {
    let all: Vec<Cidr> = values.into_iter().collect();
    let mut kept: Vec<Cidr> = Vec::new();
    for (index, cidr) in all.iter().enumerate() {
        let inside_another = all.iter().enumerate().any(|(other_index, other)| {
            other_index != index
                && other.contains(*cidr)
                && (!cidr.contains(*other) || other_index < index)
        });
        if !inside_another {
            kept.push(*cidr);
        }
    }
    kept
}

/// The ranges with the NAT64 form of each IPv4 one.
fn with_nat64(ranges: &[Cidr]) -> Vec<Cidr> {
    ranges
        .iter()
        .copied()
        .chain(ranges.iter().filter_map(|c| c.nat64()))
        .collect()
}

/// The ranges [`SquidOptions::validate`] accepts; one that slipped past it is left out rather
/// than written in a form squid misreads (an IPv4-mapped range is every IPv6 address to squid).
fn parsed(values: &[String]) -> Vec<Cidr> {
    values
        .iter()
        .filter_map(|v| check_destination(v).ok())
        .collect()
}

/// The `acl` and `http_access deny` lines that keep crawlers out of the proxy's own network:
/// `to_internal` (the refused ranges and the cluster's, with their NAT64 forms) unless
/// `to_allowed`, and `to_denied` always. squid's `dst` resolves a name first and matches when
/// any of its addresses is in the list, so a name resolving into a refused range is refused.
pub fn destination_rules(options: &SquidOptions) -> (String, String) {
    let builtin = REFUSED_DESTINATIONS.iter().map(|c| Cidr::parse(c).unwrap());
    let internal = outermost(with_nat64(
        &builtin
            .chain(parsed(&options.cluster_ranges))
            .collect::<Vec<_>>(),
    ));
    let allowed = outermost(parsed(&options.allow_destinations));
    let denied = outermost(with_nat64(&parsed(&options.deny_destinations)));
    let line = |name: &str, ranges: &[Cidr]| {
        let list: Vec<String> = ranges.iter().map(Cidr::to_string).collect();
        format!("acl {name} dst {}\n", list.join(" "))
    };
    let mut acls = line("to_internal", &internal);
    let mut access = String::new();
    if !denied.is_empty() {
        acls.push_str(&line("to_denied", &denied));
        access.push_str("http_access deny to_denied\n");
    }
    if allowed.is_empty() {
        access.push_str("http_access deny to_internal\n");
    } else {
        acls.push_str(&line("to_allowed", &allowed));
        access.push_str("http_access deny to_internal !to_allowed\n");
    }
    (acls, access)
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
    Cidr::parse(value).is_some()
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

/// squid.conf for one proxy: only `allow_from` may use it, CONNECT only to `connect_ports`, no
/// destination in the proxy's own network ([`destination_rules`]), and with `auth`, only
/// crawlers with the proxy's credentials (HTTP basic auth).
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
    let (destination_acls, destination_access) = destination_rules(options);
    let mut conf = format!(
        "# proxy-operator: squid for Proxy {}/{} (uid {})\n\
         http_port {port}\n\
         acl crawlers src {allow}\n\
         acl SSL_ports port {connect_ports}\n\
         acl Safe_ports port 80 443 1025-65535 {connect_ports}\n\
         acl CONNECT method CONNECT\n\
         {destination_acls}",
        owner.namespace,
        owner.name,
        owner.uid,
        allow = options.allow_from.join(" "),
    );
    if let Some(BasicAuth {
        helper,
        password_file,
    }) = auth
    {
        conf.push_str(&format!(
            "auth_param basic program {helper} {password_file}\n\
             auth_param basic children 4 startup=1 idle=1\n\
             auth_param basic realm proxy-operator\n\
             auth_param basic credentialsttl 5 seconds\n\
             acl proxy_users proxy_auth REQUIRED\n"
        ));
    }
    // Every deny before the allow. Outside allowFrom: refused before squid looks a name up.
    // A refused destination: 403, credentials or not. Inside: with auth, a 407 asks for them.
    conf.push_str(&format!(
        "http_access deny !Safe_ports\n\
         http_access deny CONNECT !SSL_ports\n\
         http_access deny !crawlers\n\
         {destination_access}"
    ));
    conf.push_str(if auth.is_some() {
        "http_access allow proxy_users\n"
    } else {
        "http_access allow crawlers\n"
    });
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
            ..SquidOptions::default()
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
            ..SquidOptions::default()
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
                "http_access deny to_internal",
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

    /// The ranges of an `acl NAME dst …` line of `conf`.
    fn dst_acl(conf: &str, name: &str) -> Option<Vec<Cidr>> {
        let prefix = format!("acl {name} dst ");
        conf.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .map(|list| list.split(' ').map(|c| Cidr::parse(c).unwrap()).collect())
    }

    /// squid's `dst` match, as squid does it: an IPv4-mapped address is the IPv4 address (squid
    /// holds IPv4 in that form), and any listed range holding the address matches.
    fn matches(ranges: &[Cidr], address: &str) -> bool {
        let address: std::net::IpAddr = address.parse().unwrap();
        let address = match address {
            std::net::IpAddr::V6(v6) => v6
                .to_ipv4_mapped()
                .map(std::net::IpAddr::V4)
                .unwrap_or(address),
            v4 => v4,
        };
        let host = Cidr {
            address,
            prefix: if address.is_ipv4() { 32 } else { 128 },
        };
        ranges.iter().any(|r| r.contains(host))
    }

    /// Whether squid from `conf` refuses `address` (the `http_access deny` lines on destinations).
    fn refused(conf: &str, address: &str) -> bool {
        let internal = dst_acl(conf, "to_internal").unwrap();
        let allowed = dst_acl(conf, "to_allowed").unwrap_or_default();
        let denied = dst_acl(conf, "to_denied").unwrap_or_default();
        matches(&denied, address) || (matches(&internal, address) && !matches(&allowed, address))
    }

    fn conf_with(options: &SquidOptions) -> String {
        squid_conf(
            options,
            &owner(),
            3128,
            SquidHost::Container { log_dir: "/l" },
            None,
        )
    }

    #[test]
    fn the_proxys_own_network_is_refused_by_default() {
        let conf = conf_with(&SquidOptions::default());
        for (address, refused_by_default) in [
            ("127.0.0.1", true),
            ("127.255.0.9", true),
            ("::1", true),
            ("::", true),
            ("0.0.0.0", true),
            ("0.1.2.3", true),
            ("169.254.169.254", true), // the cloud metadata server
            ("169.254.0.1", true),
            ("fe80::1", true),
            ("10.1.2.3", true),
            ("172.16.0.1", true),
            ("172.31.255.255", true),
            ("192.168.1.1", true),
            ("100.64.0.1", true),
            ("100.127.255.255", true),
            ("fd00::1", true),
            ("fc00::1", true),
            // IPv4-mapped forms: the IPv4 ranges themselves, as squid holds them.
            ("::ffff:169.254.169.254", true),
            ("::ffff:10.1.2.3", true),
            ("::ffff:127.0.0.1", true),
            ("::ffff:100.64.0.1", true),
            // IPv4-compatible (deprecated) forms.
            ("::10.1.2.3", true),
            ("::127.0.0.1", true),
            // NAT64 forms.
            ("64:ff9b::a9fe:a9fe", true),
            ("64:ff9b::10.1.2.3", true),
            ("64:ff9b::127.0.0.1", true),
            ("64:ff9b::192.168.0.1", true),
            ("64:ff9b::100.64.0.1", true),
            ("64:ff9b::0.0.0.1", true),
            // The internet stays reachable, through NAT64 too.
            ("93.184.215.14", false),
            ("8.8.8.8", false),
            ("172.32.0.1", false),
            ("100.128.0.1", false),
            ("169.255.0.1", false),
            ("11.0.0.1", false),
            ("2606:4700::1111", false),
            ("::ffff:93.184.215.14", false),
            ("64:ff9b::93.184.215.14", false),
            ("fec0::1", false),
        ] {
            assert_eq!(refused(&conf, address), refused_by_default, "{address}");
        }
    }

    #[test]
    fn the_destination_acl_lines() {
        let conf = conf_with(&SquidOptions::default());
        assert!(conf.contains(
            "acl to_internal dst 0.0.0.0/8 10.0.0.0/8 100.64.0.0/10 127.0.0.0/8 169.254.0.0/16 172.16.0.0/12 192.168.0.0/16 ::/96 fc00::/7 fe80::/10 \
             64:ff9b::/104 64:ff9b::a00:0/104 64:ff9b::6440:0/106 64:ff9b::7f00:0/104 64:ff9b::a9fe:0/112 64:ff9b::ac10:0/108 64:ff9b::c0a8:0/112\n"
        ), "{conf}");
        // squid reads `::ffff:10.0.0.0/104` as ::/0 (every IPv6 address): never written.
        assert!(!conf.contains("::ffff:"), "{conf}");
        assert!(!conf.contains("to_allowed") && !conf.contains("to_denied"));

        let options = SquidOptions {
            allow_destinations: vec!["127.0.0.1/32".into(), "10.20.0.0/16".into()],
            deny_destinations: vec!["10.20.5.0/24".into(), "203.0.113.0/24".into()],
            cluster_ranges: vec!["198.18.0.0/15".into(), "10.96.0.0/12".into()],
            ..SquidOptions::default()
        };
        options.validate().unwrap();
        let conf = conf_with(&options);
        assert!(
            conf.contains("acl to_allowed dst 127.0.0.1/32 10.20.0.0/16\n"),
            "{conf}"
        );
        assert!(conf.contains(
            "acl to_denied dst 10.20.5.0/24 203.0.113.0/24 64:ff9b::a14:500/120 64:ff9b::cb00:7100/120\n"
        ), "{conf}");
        let internal = dst_acl(&conf, "to_internal").unwrap();
        // A cluster range inside a built-in one is left out (squid would warn and drop it).
        assert!(!internal.contains(&Cidr::parse("10.96.0.0/12").unwrap()));
        assert!(internal.contains(&Cidr::parse("198.18.0.0/15").unwrap()));
        assert!(internal.contains(&Cidr::parse("64:ff9b::c612:0/111").unwrap()));
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
                "http_access deny to_denied",
                "http_access deny to_internal !to_allowed",
                "http_access allow crawlers",
                "http_access deny all",
            ]
        );
        for (address, is_refused) in [
            ("127.0.0.1", false),
            ("::ffff:127.0.0.1", false),
            ("127.0.0.2", true),
            ("64:ff9b::127.0.0.1", true), // allowing an address allows it, not its NAT64 form
            ("10.20.1.1", false),
            ("10.20.5.1", true), // denyDestinations wins inside allowDestinations
            ("64:ff9b::10.20.5.1", true),
            ("203.0.113.9", true),
            ("64:ff9b::203.0.113.9", true),
            ("198.19.0.1", true),
            ("10.96.0.1", true),
            ("169.254.169.254", true),
            ("93.184.215.14", false),
        ] {
            assert_eq!(refused(&conf, address), is_refused, "{address}");
        }
    }

    #[test]
    fn destination_ranges_are_checked() {
        let error = |field: &str, value: &str| {
            let mut options = SquidOptions::default();
            let list = match field {
                "allowDestinations" => &mut options.allow_destinations,
                "denyDestinations" => &mut options.deny_destinations,
                _ => &mut options.cluster_ranges,
            };
            list.push("192.0.2.0/24".into());
            list.push(value.into());
            match options.validate() {
                Err(ProviderError::InvalidConfig(m)) => m,
                other => panic!("{field} {value}: {other:?}"),
            }
        };
        for field in ["allowDestinations", "denyDestinations", "clusterRanges"] {
            let at = format!("config.{field}[1]: ");
            for (value, why) in [
                ("10.1.2.3", "is not an address range like 10.1.2.3/32"),
                ("metadata.google.internal/32", "is not an address range"),
                ("10.0.0.0/33", "is not an address range"),
                ("10.0.0.0/+8", "is not an address range"),
                (
                    "10.1.2.3/8",
                    "has address bits beyond its /8; write the range's first address, `10.0.0.0/8`",
                ),
                (
                    "fd00::1/8",
                    "has address bits beyond its /8; write the range's first address, `fd00::/8`",
                ),
                ("0.0.0.0/0", "holds every address"),
                ("::/0", "holds every address"),
                (
                    "::ffff:10.0.0.0/104",
                    "IPv4-mapped range (::ffff:0:0/96), which squid misreads; write it as IPv4",
                ),
                ("::/64", "IPv4-mapped range"),
            ] {
                let message = error(field, value);
                assert!(message.starts_with(&format!("{at}`{value}` ")), "{message}");
                assert!(message.contains(why), "{message}");
            }
        }
        let fine = SquidOptions {
            allow_destinations: vec![
                "127.0.0.1/32".into(),
                "fd12:3456::/48".into(),
                "64:ff9b::/96".into(),
            ],
            ..SquidOptions::default()
        };
        fine.validate().unwrap();
    }

    #[test]
    fn ranges_inside_others_are_left_out() {
        let cidrs = |list: &[&str]| {
            list.iter()
                .map(|c| Cidr::parse(c).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            outermost(cidrs(&[
                "10.1.0.0/16",
                "10.0.0.0/8",
                "10.0.0.0/8",
                "11.0.0.0/8",
                "::/96",
                "::1/128"
            ])),
            cidrs(&["10.0.0.0/8", "11.0.0.0/8", "::/96"])
        );
        assert_eq!(
            Cidr::parse("10.0.0.0/8").unwrap().nat64(),
            Cidr::parse("64:ff9b::a00:0/104")
        );
        assert_eq!(Cidr::parse("fd00::/8").unwrap().nat64(), None);
        assert!(Cidr::parse("::/64").unwrap().overlaps(IPV4_MAPPED));
        assert!(!Cidr::parse("64:ff9b::/96").unwrap().overlaps(IPV4_MAPPED));
    }
}
