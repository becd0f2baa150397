//! Proxy credentials: every Proxy gets a user name and a random password, kept in a Secret in the
//! Proxy's namespace (owned by the Proxy, so it goes with it). squid checks them with HTTP basic
//! auth; what reaches the plugin is only the salted hash squid needs ([`ProxyLogin::hashed`]),
//! never the password. The health probe, the exit-IP check and a lease's `proxyUrl` use the
//! password; nothing logs it ([`ProxyLogin`]'s `Debug` redacts it).
//!
//! Rotating: change (or delete) the Secret's `password`. The controller sees the Secret change,
//! hands the provider the new hash (`set-credentials`) and records the new
//! [`ProxyLogin::fingerprint`] in the status; until then the old password keeps being used.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;
use kube::{Resource, ResourceExt};

use crate::api::Proxy;
use crate::api::ProxyKey;
use crate::support::socks::ProxyProtocol;

/// What squid needs to check a crawler's credentials: the user name and the password's salted
/// hash (a provider's squid gets it; WIT `proxy-credentials`). The password itself stays in the
/// host.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyCredentials {
    pub username: String,
    /// crypt(3) SHA-512, `$6$salt$hash`.
    pub password_hash: String,
}

/// The hash is not the password, but it is no one's business in a log either.
impl std::fmt::Debug for ProxyCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyCredentials")
            .field("username", &self.username)
            .field("password_hash", &"<redacted>")
            .finish()
    }
}

/// The Secret keys.
pub const USERNAME_KEY: &str = "username";
pub const PASSWORD_KEY: &str = "password";
use crate::api::labels::SECRET_LABEL;
/// Length of a generated password (alphanumeric: ~190 bits, and no character a URL must escape).
const PASSWORD_LENGTH: usize = 32;
/// The longest password the operator accepts from a Secret; squid's helper reads at most 255.
const MAX_PASSWORD: usize = 255;

/// The credentials Secret of Proxy `proxy_name`: `<name>-proxy-credentials`, shortened (with a
/// digest of the full name) when that would pass the 253 characters of an object name.
pub fn secret_name(proxy_name: &str) -> String {
    let name = format!("{proxy_name}-proxy-credentials");
    if name.len() <= 253 {
        return name;
    }
    let digest = crate::support::digest::sha256_hex(proxy_name.as_bytes());
    format!("{}-{}-proxy-credentials", &proxy_name[..200], &digest[..12])
}

/// A proxy's user name and password, as the host keeps them.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyLogin {
    username: String,
    password: String,
    /// Whether a lease's `proxyUrl` may carry it: always for the operator's own (made per proxy);
    /// for an upstream's (a vendor account) only where its provider instance allows it.
    hand_out: bool,
}

impl std::fmt::Debug for ProxyLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyLogin")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Why a Secret's credentials cannot be used; the message names the key and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Secret {secret}: {problem}")]
pub struct InvalidCredentials {
    pub secret: String,
    pub problem: String,
}

impl ProxyLogin {
    /// New credentials for a Proxy: its name as the user name (squid's log then says which
    /// proxy a request used) and a fresh random password.
    pub fn generate(username: &str) -> Self {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        let password = (0..PASSWORD_LENGTH)
            .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
            .collect();
        ProxyLogin {
            username: username.to_string(),
            password,
            hand_out: true,
        }
    }

    /// An upstream proxy's login (see `crate::provider::upstream`), checked as a Secret's would be; the
    /// problem names the part that is wrong, never the password.
    pub fn of_upstream(username: &str, password: &str, hand_out: bool) -> Result<Self, String> {
        if password.is_empty()
            || password.len() > MAX_PASSWORD
            || password.chars().any(|c| c.is_control())
        {
            return Err(format!(
                "the password must be 1 to {MAX_PASSWORD} bytes without control characters"
            ));
        }
        Ok(ProxyLogin {
            username: username.to_string(),
            password: password.to_string(),
            hand_out,
        })
    }

    /// Whether a lease's `proxyUrl` may carry this login.
    pub fn handed_out(&self) -> bool {
        self.hand_out
    }

    /// The credentials in a Secret. `Ok(None)`: no usable `password` key, so the operator
    /// generates one (deleting the key is a way to rotate).
    pub fn from_secret(secret: &Secret) -> Result<Option<Self>, InvalidCredentials> {
        let invalid = |problem: String| InvalidCredentials {
            secret: secret.name_any(),
            problem,
        };
        let data = secret.data.clone().unwrap_or_default();
        let text = |key: &str| -> Result<Option<String>, InvalidCredentials> {
            match data.get(key) {
                None => Ok(None),
                Some(ByteString(bytes)) => String::from_utf8(bytes.clone())
                    .map(|s| Some(s.trim_end_matches(['\n', '\r']).to_string()))
                    .map_err(|_| invalid(format!("`{key}` is not UTF-8 text"))),
            }
        };
        let Some(password) = text(PASSWORD_KEY)?.filter(|p| !p.is_empty()) else {
            return Ok(None);
        };
        let username = text(USERNAME_KEY)?.unwrap_or_default();
        if username.is_empty() || !username.chars().all(|c| c.is_ascii_graphic() && c != ':') {
            return Err(invalid(format!(
                "`{USERNAME_KEY}` must be printable ASCII without spaces or colons, e.g. the Proxy's name"
            )));
        }
        if password.len() > MAX_PASSWORD || password.chars().any(|c| c.is_control()) {
            return Err(invalid(format!(
                "`{PASSWORD_KEY}` must be at most {MAX_PASSWORD} bytes without control characters; delete the key to have a new one generated"
            )));
        }
        Ok(Some(ProxyLogin {
            username,
            password,
            hand_out: true,
        }))
    }

    pub fn username(&self) -> &str {
        &self.username
    }

    pub fn password(&self) -> &str {
        &self.password
    }

    /// What squid needs to check the password: the SHA-512 crypt(3) hash with a fresh salt.
    pub fn hashed(&self) -> ProxyCredentials {
        use sha_crypt::{PasswordHasher, ShaCrypt};
        // 12 bytes are 16 salt characters once encoded: the most crypt(3) reads (it would cut a
        // longer salt, and no longer agree with this hash).
        let salt: [u8; 12] = rand::random();
        let hash = ShaCrypt::SHA512
            .hash_password_with_salt(self.password.as_bytes(), &salt)
            .expect("SHA-crypt hashes any password with a 12-byte salt");
        ProxyCredentials {
            username: self.username.clone(),
            password_hash: hash.to_string(),
        }
    }

    /// Identifies these credentials for a Proxy without revealing them: what the status records
    /// as applied, so a changed Secret is noticed.
    pub fn fingerprint(&self, proxy_uid: &str) -> String {
        let digest = crate::support::digest::sha256_hex(
            format!("{proxy_uid}\n{}\n{}", self.username, self.password).as_bytes(),
        );
        digest[..16].to_string()
    }

    /// The `Proxy-Authorization` header value.
    pub fn basic_authorization(&self) -> String {
        use base64::Engine;
        let pair = format!("{}:{}", self.username, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    }

    /// `http://user:password@address:port` (or `socks5://`: RFC 1929's login in the same
    /// place), each part escaped as a URL needs.
    pub fn proxy_url(&self, protocol: ProxyProtocol, address: &str, port: u16) -> String {
        let escape =
            |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
        let host = if address.contains(':') {
            format!("[{address}]")
        } else {
            address.to_string()
        };
        format!(
            "{}://{}:{}@{host}:{port}",
            protocol.scheme(),
            escape(&self.username),
            escape(&self.password)
        )
    }
}

/// The credentials Secret for `proxy` holding `login`, owned by the Proxy (deleted with it).
pub fn secret_for(proxy: &Proxy, login: &ProxyLogin) -> Secret {
    let owner = OwnerReference {
        api_version: Proxy::api_version(&()).into_owned(),
        kind: Proxy::kind(&()).into_owned(),
        name: proxy.name_any(),
        uid: proxy.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(&proxy.name_any())),
            namespace: proxy.namespace(),
            labels: Some(BTreeMap::from([(
                SECRET_LABEL.to_string(),
                proxy.uid().unwrap_or_default(),
            )])),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        type_: Some("kubernetes.io/basic-auth".into()),
        string_data: Some(BTreeMap::from([
            (USERNAME_KEY.to_string(), login.username.clone()),
            (PASSWORD_KEY.to_string(), login.password.clone()),
        ])),
        ..Default::default()
    }
}

/// The credentials each provisioned proxy requires now, for the health engine and the lease
/// API, each with its fingerprint (computed once here, not on every probe round). Filled by the
/// controller; in memory only, never persisted.
#[derive(Default, Clone)]
pub struct CredentialsBook {
    logins: Arc<RwLock<HashMap<ProxyKey, (ProxyLogin, String)>>>,
}

impl CredentialsBook {
    /// Records `login` for the proxy `key` whose UID is `proxy_uid`.
    pub fn set(&self, key: ProxyKey, proxy_uid: &str, login: ProxyLogin) {
        let fingerprint = login.fingerprint(proxy_uid);
        let mut logins = self.logins.write().expect("not poisoned");
        logins.insert(key, (login, fingerprint));
    }

    pub fn remove(&self, key: &ProxyKey) {
        self.logins.write().expect("not poisoned").remove(key);
    }

    /// The login of `key` if it is the one with `fingerprint` (what the Proxy's status records as
    /// applied): a Secret changed but not yet applied is never taken for the proxy's.
    pub fn applied(&self, key: &ProxyKey, fingerprint: &str) -> Option<ProxyLogin> {
        let logins = self.logins.read().expect("not poisoned");
        let (login, recorded) = logins.get(key)?;
        (recorded == fingerprint).then(|| login.clone())
    }
}

#[cfg(test)]
mod tests;
