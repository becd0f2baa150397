//! Which host keys a hypervisor may present, read from the `known_hosts` text of its Secret.

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use russh::keys::ssh_key::known_hosts::{Entry, HostPatterns, Marker};
use russh::keys::ssh_key::public::KeyData;
use russh::keys::{Algorithm, HashAlg, PublicKey};
use sha1::Sha1;
use tracing::debug;

/// What is wrong with the host key the server offered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostKeyProblem {
    /// known_hosts has no entry for the host.
    Unknown {
        /// The name looked up: `[address]:port`, or `address` for port 22.
        name: String,
        /// Lines of known_hosts that could not be parsed (and so were not considered).
        skipped_lines: Vec<usize>,
    },
    /// known_hosts lists other keys for the host (fingerprints).
    Mismatch { known: Vec<String> },
    /// known_hosts marks this key `@revoked`.
    Revoked,
}

impl fmt::Display for HostKeyProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostKeyProblem::Unknown {
                name,
                skipped_lines,
            } if skipped_lines.is_empty() => {
                write!(f, "is not in known_hosts (no entry for {name})")
            }
            HostKeyProblem::Unknown {
                name,
                skipped_lines,
            } => write!(
                f,
                "is not in known_hosts (no entry for {name}; unparseable lines {skipped_lines:?})"
            ),
            HostKeyProblem::Mismatch { known } => write!(
                f,
                "does not match known_hosts, which lists {} for the host",
                known.join(", ")
            ),
            HostKeyProblem::Revoked => write!(f, "is marked @revoked in known_hosts"),
        }
    }
}

/// The known_hosts entries for one host.
///
/// Hand-written on purpose: `russh::keys::known_hosts` only reads files (we have Secret text and
/// a read-only root filesystem), splits fields on single spaces, ignores `@revoked`, and fails on
/// the first line whose key it cannot parse. Parsing one line is left to `ssh_key`'s
/// known_hosts [`Entry`]; matching follows OpenSSH: `[host]:port` for a port other than 22, the
/// plain name for 22, `*`/`?` wildcards and `!` negation, hashed names, case-insensitive.
#[derive(Debug)]
pub(crate) struct KnownHosts {
    /// The name looked up, for messages.
    name: String,
    /// Keys the host may present.
    keys: Vec<PublicKey>,
    /// Keys marked `@revoked` for the host.
    revoked: Vec<PublicKey>,
    /// 1-based line numbers that were not understood (reported when nothing matched).
    skipped_lines: Vec<usize>,
}

impl KnownHosts {
    pub(crate) fn for_host(text: &str, address: &str, port: u16) -> KnownHosts {
        let address = address.to_ascii_lowercase();
        let names: Vec<String> = if port == 22 {
            vec![address.clone(), format!("[{address}]:22")]
        } else {
            vec![format!("[{address}]:{port}")]
        };
        let mut known = KnownHosts {
            name: names[0].clone(),
            keys: Vec::new(),
            revoked: Vec::new(),
            skipped_lines: Vec::new(),
        };
        for (index, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or_default();
            // ssh_key splits fields on one space; OpenSSH accepts any run of blanks.
            let line = line.split_whitespace().collect::<Vec<_>>().join(" ");
            if line.is_empty() {
                continue;
            }
            let entry: Entry = match line.parse() {
                Ok(entry) => entry,
                Err(error) => {
                    // Like OpenSSH: one odd line (a key type we do not know) spoils nothing else.
                    debug!(line = index + 1, %error, "known_hosts: line skipped");
                    known.skipped_lines.push(index + 1);
                    continue;
                }
            };
            if !names.iter().any(|n| host_matches(entry.host_patterns(), n)) {
                continue;
            }
            match entry.marker() {
                None => known.keys.push(entry.public_key().clone()),
                Some(Marker::Revoked) => known.revoked.push(entry.public_key().clone()),
                // Host certificates are not used (see Verifier::check_server_key).
                Some(Marker::CertAuthority) => {}
            }
        }
        known
    }

    pub(crate) fn verify(&self, offered: &KeyData) -> Result<(), HostKeyProblem> {
        if self.revoked.iter().any(|k| k.key_data() == offered) {
            return Err(HostKeyProblem::Revoked);
        }
        if self.keys.iter().any(|k| k.key_data() == offered) {
            return Ok(());
        }
        if self.keys.is_empty() {
            return Err(HostKeyProblem::Unknown {
                name: self.name.clone(),
                skipped_lines: self.skipped_lines.clone(),
            });
        }
        Err(HostKeyProblem::Mismatch {
            known: self
                .keys
                .iter()
                .map(|k| {
                    format!(
                        "{} {}",
                        k.algorithm().as_str(),
                        k.fingerprint(HashAlg::Sha256)
                    )
                })
                .collect(),
        })
    }

    /// russh's default host key algorithms, those of the known keys first (as OpenSSH does), so
    /// a server with several host keys presents one that known_hosts can confirm.
    pub(crate) fn preferred_algorithms(&self) -> Vec<Algorithm> {
        let known = |a: &Algorithm| {
            self.keys.iter().any(|k| {
                let k = k.algorithm();
                // Any RSA signature hash works with an RSA key.
                &k == a || (k.is_rsa() && a.clone().is_rsa())
            })
        };
        let mut algorithms = russh::Preferred::DEFAULT.key.to_vec();
        algorithms.sort_by_key(|a| !known(a));
        algorithms
    }
}

fn host_matches(patterns: &HostPatterns, name: &str) -> bool {
    match patterns {
        HostPatterns::HashedName { salt, hash } => {
            let Ok(mac) = Hmac::<Sha1>::new_from_slice(salt) else {
                return false;
            };
            mac.chain_update(name.as_bytes()).verify_slice(hash).is_ok()
        }
        HostPatterns::Patterns(patterns) => {
            let mut matched = false;
            for pattern in patterns {
                let pattern = pattern.to_ascii_lowercase();
                match pattern.strip_prefix('!') {
                    // A matching negation excludes the host whatever else matches.
                    Some(negated) if glob_matches(negated.as_bytes(), name.as_bytes()) => {
                        return false;
                    }
                    Some(_) => {}
                    None => matched |= glob_matches(pattern.as_bytes(), name.as_bytes()),
                }
            }
            matched
        }
    }
}

/// `*` (any run) and `?` (one character) wildcards, as in OpenSSH's `match_pattern`.
fn glob_matches(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|skip| glob_matches(rest, &text[skip..])),
        Some((b'?', rest)) => !text.is_empty() && glob_matches(rest, &text[1..]),
        Some((c, rest)) => text.first() == Some(c) && glob_matches(rest, &text[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ED_A: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJdD7y3aLq454yWBdwLWbieU1ebz9/cu7/QEXn9OIeZJ";
    const ED_B: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILIG2T/B0l0gaqj3puu510tu9N1OkQ4znY3LYuEm5zCF";

    fn key(openssh: &str) -> PublicKey {
        PublicKey::from_openssh(openssh).unwrap()
    }

    fn verify(text: &str, address: &str, port: u16, offered: &str) -> Result<(), HostKeyProblem> {
        KnownHosts::for_host(text, address, port).verify(key(offered).key_data())
    }

    #[test]
    fn bracketed_host_and_port() {
        let text = format!("[hv1.example.com]:2222 {ED_A}\n");
        assert_eq!(verify(&text, "hv1.example.com", 2222, ED_A), Ok(()));
        assert_eq!(verify(&text, "HV1.example.com", 2222, ED_A), Ok(()));
        // Another port is another host.
        assert!(matches!(
            verify(&text, "hv1.example.com", 22, ED_A),
            Err(HostKeyProblem::Unknown { .. })
        ));
        assert!(matches!(
            verify(&text, "hv1.example.com", 2223, ED_A),
            Err(HostKeyProblem::Unknown { .. })
        ));
    }

    #[test]
    fn plain_host_is_port_22_only() {
        let text = format!("10.0.0.5,hv1 {ED_A} root@hv1\n");
        assert_eq!(verify(&text, "hv1", 22, ED_A), Ok(()));
        assert_eq!(verify(&text, "10.0.0.5", 22, ED_A), Ok(()));
        assert!(matches!(
            verify(&text, "hv1", 2222, ED_A),
            Err(HostKeyProblem::Unknown { .. })
        ));
    }

    #[test]
    fn other_key_for_the_host_is_a_mismatch_naming_it() {
        let text = format!("[hv1]:2222 {ED_B}\n");
        let Err(HostKeyProblem::Mismatch { known }) = verify(&text, "hv1", 2222, ED_A) else {
            panic!("expected a mismatch");
        };
        let fp = key(ED_B).fingerprint(HashAlg::Sha256).to_string();
        assert_eq!(known, vec![format!("ssh-ed25519 {fp}")]);
    }

    #[test]
    fn any_listed_key_is_accepted() {
        let text = format!("[hv1]:2222 {ED_B}\n[hv1]:2222 {ED_A}\n");
        assert_eq!(verify(&text, "hv1", 2222, ED_A), Ok(()));
    }

    #[test]
    fn hashed_entry() {
        // `ssh-keygen -H` of "example.com" (russh's own test vector).
        let text = format!("|1|O33ESRMWPVkMYIwJ1Uw+n877jTo=|nuuC5vEqXlEZ/8BXQR7m619W6Ak= {ED_B}\n");
        assert_eq!(verify(&text, "example.com", 22, ED_B), Ok(()));
        assert!(matches!(
            verify(&text, "example.org", 22, ED_B),
            Err(HostKeyProblem::Unknown { .. })
        ));
    }

    #[test]
    fn wildcards_and_negation() {
        let text = format!("*.lab.example,!bad.lab.example {ED_A}\n");
        assert_eq!(verify(&text, "hv7.lab.example", 22, ED_A), Ok(()));
        assert!(verify(&text, "bad.lab.example", 22, ED_A).is_err());
        let text = format!("[hv?]:2222 {ED_A}\n");
        assert_eq!(verify(&text, "hv1", 2222, ED_A), Ok(()));
        assert!(verify(&text, "hv10", 2222, ED_A).is_err());
    }

    #[test]
    fn revoked_wins() {
        let text = format!("hv1 {ED_A}\n@revoked hv1 {ED_A}\n");
        assert_eq!(verify(&text, "hv1", 22, ED_A), Err(HostKeyProblem::Revoked));
    }

    #[test]
    fn comments_blanks_and_bad_lines_are_skipped() {
        let text = format!(
            "# a comment\n\n  hv1    {ED_A}   \nhv1 ssh-ed25519 not-base64\nhv2 {ED_B} # trailing\n"
        );
        assert_eq!(verify(&text, "hv1", 22, ED_A), Ok(()));
        assert_eq!(verify(&text, "hv2", 22, ED_B), Ok(()));
        assert_eq!(
            verify(&text, "hv3", 22, ED_A),
            Err(HostKeyProblem::Unknown {
                name: "hv3".into(),
                skipped_lines: vec![4]
            })
        );
    }

    #[test]
    fn known_algorithms_are_preferred() {
        let rsa = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQDKyS6Yqnu9X8hYPs12lkJS1PST9/l/n9WFHxsdPtJ4Xaq0Q+cjrDMWwDtdUlEbooyj/K81iLwQbak1nUBI/WK2428MURucPhmlJRlwWks8sNBLELhPeX+xzYP5nUKvOmzdJnEvJOOyQG6wrgr8ud62B4FOSLa+sH8hIbJaLpNUdQ==";
        let text = format!("hv1 {rsa}\n");
        let known = KnownHosts::for_host(&text, "hv1", 22);
        let preferred = known.preferred_algorithms();
        assert!(
            preferred[..3]
                .iter()
                .all(|a| matches!(a, Algorithm::Rsa { .. })),
            "{preferred:?}"
        );
        assert_eq!(preferred.len(), russh::Preferred::DEFAULT.key.len());
        let none = KnownHosts::for_host("", "hv1", 22).preferred_algorithms();
        assert_eq!(none, russh::Preferred::DEFAULT.key.to_vec());
    }

    #[test]
    fn glob() {
        assert!(glob_matches(b"*", b""));
        assert!(glob_matches(b"a*c", b"abbbc"));
        assert!(!glob_matches(b"a?c", b"ac"));
        assert!(glob_matches(b"[10.0.0.*]:22?2", b"[10.0.0.9]:2202"));
    }
}
