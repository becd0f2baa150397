//! What a plugin can do with volumes: only in the pools its grant names, and only with its own
//! volumes. Ownership is in the name: the host puts the provider instance's prefix
//! ([`volume_prefix`]) in front of every name a plugin gives, and takes it off what it answers.
//! A name prefix, not a host-side record, because it needs no state to keep or lose: it
//! survives operator restarts and replicas, holds in `plugin run` without a cluster, and an
//! administrator sees in `virsh vol-list` which provider instance a volume belongs to. A plugin
//! cannot name a volume without the prefix, so it never sees or touches another's.

use sha2::{Digest, Sha256};
use virt::storage_pool::StoragePool;
use virt::storage_vol::StorageVol;
use virt::stream::Stream;

use super::allow;
use super::error::LibvirtError;
use super::hypervisor::Hypervisor;
use super::import_jobs::JobKey;
use super::records::VolumeInfo;

type Result<T> = std::result::Result<T, LibvirtError>;

/// Bytes per `virStreamRecv` when a volume is read back.
const READ_CHUNK: usize = 256 * 1024;

/// The prefix of provider instance `provider`'s volume names under operator `operator`:
/// `<provider>.<12 hex>.`. The provider name (a DNS label, no '.') keeps it readable; the hex,
/// a digest of both, tells two operators' instances of one name apart, and its fixed length
/// makes no prefix the start of another.
pub fn volume_prefix(operator: &str, provider: &str) -> String {
    let digest = hex::encode(Sha256::digest(format!("{operator}\n{provider}")));
    format!("{provider}.{}.", &digest[..12])
}

impl Hypervisor {
    fn prefix(&self) -> &str {
        &self.scope.volume_prefix
    }

    /// The name libvirt has for the plugin's volume `name`.
    pub(crate) fn real_name(&self, name: &str) -> Result<String> {
        if !allow::is_volume_name(name) {
            return Err(LibvirtError::Denied(format!(
                "`{name}` is not a volume name (1 to 200 characters, no '/')"
            )));
        }
        Ok(format!("{}{name}", self.prefix()))
    }

    /// The plugin's name for volume `real`.
    pub(crate) fn plugin_name<'a>(&self, real: &'a str) -> &'a str {
        real.strip_prefix(self.prefix()).unwrap_or(real)
    }

    /// A volume as the plugin sees it: its own name (the path is the real one, for its XML).
    pub(crate) fn plugins_view(&self, volume: VolumeInfo) -> VolumeInfo {
        VolumeInfo {
            name: self.plugin_name(&volume.name).to_string(),
            ..volume
        }
    }

    /// `not-found` in the host's words (libvirt's would name the prefixed name).
    fn no_volume(&self, pool: &str, name: &str, e: LibvirtError) -> LibvirtError {
        match e {
            LibvirtError::NotFound(_) => LibvirtError::NotFound(format!(
                "volume {name} is not among this provider instance's volumes in pool {pool} on {}",
                self.host
            )),
            other => other,
        }
    }

    /// Creates a volume from XML that passed the allow-list (a backing store only of its own
    /// volumes in the pool), named with the owner prefix.
    pub async fn create_volume(&self, pool: String, xml: String) -> Result<VolumeInfo> {
        self.granted_pool(&pool)?;
        let paths = self.pool_paths().await?;
        let path = paths
            .iter()
            .find(|(p, _)| *p == pool)
            .map(|(_, d)| d.as_str());
        let checked = allow::check_volume(&xml, &pool, path, self.prefix())
            .map_err(|m| LibvirtError::Denied(format!("create-volume: {m}")))?;
        let key: JobKey = (
            self.endpoint.clone(),
            pool.clone(),
            checked.real_name.clone(),
        );
        self.hub.imports.forget_verified(&key);
        let volume = self
            .create_real(pool, &checked.real_name, checked.xml)
            .await?;
        Ok(self.plugins_view(volume))
    }

    pub async fn lookup_volume(&self, pool: String, name: String) -> Result<VolumeInfo> {
        self.granted_pool(&pool)?;
        let real = self.real_name(&name)?;
        // A volume still being imported is not there yet: using it as a base would be wrong.
        if self.hub.imports.in_progress(&self.endpoint, &pool, &real) {
            return Err(LibvirtError::NotFound(format!(
                "volume {name} in pool {pool} is still being imported; call import-image to wait for it"
            )));
        }
        match self.volume(pool.clone(), real).await {
            Ok(volume) => Ok(self.plugins_view(volume)),
            Err(e) => Err(self.no_volume(&pool, &name, e)),
        }
    }

    pub async fn delete_volume(&self, pool: String, name: String) -> Result<()> {
        self.granted_pool(&pool)?;
        let real = self.real_name(&name)?;
        let key: JobKey = (self.endpoint.clone(), pool.clone(), real.clone());
        self.hub.imports.forget_verified(&key);
        self.delete_real(pool.clone(), real)
            .await
            .map_err(|e| self.no_volume(&pool, &name, e))
    }

    /// Writes `data` (a seed ISO) over the start of one of its volumes.
    pub async fn upload_volume(&self, pool: String, name: String, data: Vec<u8>) -> Result<()> {
        self.granted_pool(&pool)?;
        let real = self.real_name(&name)?;
        // Written to, an imported image is no longer known to have its digest.
        let key: JobKey = (self.endpoint.clone(), pool.clone(), real.clone());
        self.hub.imports.forget_verified(&key);
        self.upload_real(pool.clone(), real, data)
            .await
            .map_err(|e| self.no_volume(&pool, &name, e))
    }

    /// The sha256 of volume `real`'s bytes, read back through libvirt.
    pub(crate) async fn volume_sha256(&self, pool: String, real: String) -> Result<String> {
        let ids = format!("pool={pool} volume={real}");
        self.hub
            .call_streaming(&self.endpoint, "storage-vol-download", &ids, move |c| {
                let p = StoragePool::lookup_by_name(c, &pool)?;
                let volume = StorageVol::lookup_by_name(&p, &real)?;
                let stream = Stream::new(c, 0)?;
                // Offset and length 0: the whole volume.
                volume.download(&stream, 0, 0, 0)?;
                let mut hasher = Sha256::new();
                let mut buffer = vec![0u8; READ_CHUNK];
                loop {
                    match stream.recv(&mut buffer) {
                        Ok(0) => break,
                        Ok(n) => hasher.update(&buffer[..n]),
                        Err(e) => {
                            let _ = stream.abort();
                            return Err(e);
                        }
                    }
                }
                stream.finish()?;
                Ok(hex::encode(hasher.finalize()))
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_name_the_provider_and_differ_per_operator() {
        let a = volume_prefix("proxy-operator", "kvm-home");
        assert!(a.starts_with("kvm-home.") && a.ends_with('.'), "{a}");
        assert_eq!(a.len(), "kvm-home.".len() + 13);
        assert_eq!(a, volume_prefix("proxy-operator", "kvm-home"));
        assert_ne!(a, volume_prefix("other-operator", "kvm-home"));
        // One instance's names never start with another's prefix.
        let b = volume_prefix("proxy-operator", "kvm");
        assert!(!a.starts_with(&b) && !b.starts_with(&a));
    }
}
