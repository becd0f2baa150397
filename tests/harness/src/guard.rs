//! The egress guard for VMs that run in the machine's own network namespace (user-mode
//! networking needs an interface with a route for passt to copy, which a private namespace does
//! not have): every packet that a process of the QEMU user (`libvirt-qemu`: QEMU and passt) sends
//! to an address off loopback is rejected by the kernel before it leaves, IPv4 and IPv6.
//!
//! A guest behind passt reaches the machine's loopback through its gateway address (passt maps
//! it), so a loopback server is reachable and nothing else is. The rules carry a comment naming
//! this process, are checked with `-C` after they are added (a guard that cannot be installed is
//! an error, never a skip), and are removed on drop and at exit.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::bins::debian_binary;
use crate::process::{ExitHook, at_exit};

/// The user QEMU and passt run as under Debian's libvirt.
pub const QEMU_USER: &str = "libvirt-qemu";

/// The installed rules; removed on drop.
pub struct EgressGuard {
    rules: Vec<(String, Vec<String>)>,
    _at_exit: ExitHook,
}

fn rules_for(user: &str, comment: &str) -> Vec<(String, Vec<String>)> {
    [
        ("/usr/sbin/iptables", "127.0.0.0/8"),
        ("/usr/sbin/ip6tables", "::1/128"),
    ]
    .into_iter()
    .map(|(tool, loopback)| {
        let rule = [
            "OUTPUT",
            "!",
            "-d",
            loopback,
            "-m",
            "owner",
            "--uid-owner",
            user,
            "-m",
            "comment",
            "--comment",
            comment,
            "-j",
            "REJECT",
        ];
        (
            tool.to_string(),
            rule.iter().map(|s| s.to_string()).collect(),
        )
    })
    .collect()
}

fn iptables(tool: &str, action: &str, rule: &[String]) -> Result<()> {
    let out = Command::new(tool)
        .arg("-w")
        .arg(action)
        .args(rule)
        .output()
        .with_context(|| format!("run {tool}"))?;
    if !out.status.success() {
        bail!(
            "{tool} {action} {}: {}",
            rule.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl EgressGuard {
    /// Installs the rules for [`QEMU_USER`] and checks that they are in place.
    pub fn install() -> Result<EgressGuard> {
        crate::squid::user_ids(QEMU_USER)
            .context("look up user libvirt-qemu (Debian package libvirt-daemon-system)")?;
        EgressGuard::install_for(QEMU_USER)
    }

    /// The same rules for another user, e.g. `proxy` (squid), so that a squid whose ACLs should
    /// refuse an address off loopback cannot reach it even when they do not.
    pub fn install_for(user: &str) -> Result<EgressGuard> {
        debian_binary("/usr/sbin/iptables", "iptables");
        debian_binary("/usr/sbin/ip6tables", "iptables");
        remove_stale_rules();
        crate::squid::user_ids(user).with_context(|| format!("look up user {user}"))?;
        // Unique per guard, so one guard's removal never takes another's rules.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let comment = format!("proxy-operator-harness-{}-{n}", std::process::id());
        let rules = rules_for(user, &comment);
        let mut installed = Vec::new();
        for (tool, rule) in &rules {
            let mut insert = rule.clone();
            insert.insert(1, "1".into());
            if let Err(e) = iptables(tool, "-I", &insert) {
                remove(&installed);
                return Err(e.context(
                    "install the egress guard for VMs (needs root and the kernel's netfilter owner match)",
                ));
            }
            installed.push((tool.clone(), rule.clone()));
        }
        for (tool, rule) in &rules {
            if let Err(e) = iptables(tool, "-C", rule) {
                remove(&installed);
                return Err(e.context("the egress guard is not in place after installing it"));
            }
        }
        let for_exit = rules.clone();
        Ok(EgressGuard {
            rules,
            _at_exit: at_exit(move || remove(&for_exit)),
        })
    }

    /// Whether every rule is still in place (`iptables -C`).
    pub fn is_in_place(&self) -> bool {
        self.rules
            .iter()
            .all(|(tool, rule)| iptables(tool, "-C", rule).is_ok())
    }

    /// Fails unless every rule is in place: call it right before booting a VM.
    pub fn check(&self) -> Result<()> {
        for (tool, rule) in &self.rules {
            iptables(tool, "-C", rule).context("the egress guard for VMs is missing")?;
        }
        Ok(())
    }
}

/// Removes the guard rules of harness processes that are gone (killed before their exit hook
/// ran): left in place they refuse the QEMU user's traffic for every later run, and the smoke
/// test that checks the machine without a guard fails. Rules of live processes stay.
pub fn remove_stale_rules() {
    for tool in ["iptables", "ip6tables"] {
        let Ok(out) = Command::new(tool).args(["-w", "-S", "OUTPUT"]).output() else {
            continue;
        };
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some(pid) = stale_rule_owner(line) else {
                continue;
            };
            if Path::new(&format!("/proc/{pid}")).exists() {
                continue;
            }
            let rule: Vec<String> = line.split_whitespace().skip(1).map(String::from).collect();
            if iptables(tool, "-D", &rule).is_ok() {
                eprintln!("[guard] removed a rule left by process {pid}, which is gone: {line}");
            }
        }
    }
}

/// The pid in a harness guard rule's comment (`proxy-operator-harness-<pid>-<n>`), for a rule
/// of `iptables -S` (`-A OUTPUT …`).
fn stale_rule_owner(line: &str) -> Option<u32> {
    let rest = line.strip_prefix("-A OUTPUT ")?;
    let comment = rest.split("--comment proxy-operator-harness-").nth(1)?;
    comment.split('-').next()?.parse().ok()
}

fn remove(rules: &[(String, Vec<String>)]) {
    for (tool, rule) in rules {
        // A rule may be there more than once only if -D ran short; remove every copy.
        while iptables(tool, "-C", rule).is_ok() {
            if iptables(tool, "-D", rule).is_err() {
                break;
            }
        }
    }
}

impl Drop for EgressGuard {
    fn drop(&mut self) {
        remove(&self.rules);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_reject_everything_off_loopback_for_the_user() {
        let rules = rules_for("libvirt-qemu", "c");
        assert_eq!(rules.len(), 2);
        assert_eq!(
            rules[0].1.join(" "),
            "OUTPUT ! -d 127.0.0.0/8 -m owner --uid-owner libvirt-qemu -m comment --comment c -j REJECT"
        );
        assert!(rules[1].0.ends_with("ip6tables"));
        assert!(rules[1].1.join(" ").contains("! -d ::1/128"));
    }

    #[test]
    fn the_owner_of_a_guard_rule_is_read_from_its_comment() {
        let ours = "-A OUTPUT ! -d 127.0.0.0/8 -m owner --uid-owner 64055 -m comment --comment proxy-operator-harness-6862-0 -j REJECT --reject-with icmp-port-unreachable";
        assert_eq!(stale_rule_owner(ours), Some(6862));
        for other in [
            "-P OUTPUT ACCEPT",
            "-A OUTPUT -m comment --comment someone-else-12-0 -j ACCEPT",
            "-A INPUT -m comment --comment proxy-operator-harness-1-0 -j REJECT",
        ] {
            assert_eq!(stale_rule_owner(other), None, "{other}");
        }
    }
}
