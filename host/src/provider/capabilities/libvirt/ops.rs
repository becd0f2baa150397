//! What a plugin can ask of a hypervisor: each operation is one or a few libvirt calls on a
//! blocking thread (see `LibvirtHub::call`), with results in the WIT's shapes.

use std::time::Duration;

use tracing::trace;
use virt::error::ErrorNumber;
use virt::storage_pool::StoragePool;
use virt::storage_vol::StorageVol;
use virt::stream::Stream;

use super::error::LibvirtError;
use super::hypervisor::Hypervisor;
use super::records::{PoolInfo, ProbeReport, VolumeInfo};
use super::xml::xml_escape;

/// Largest payload `upload-volume` takes: it crosses the plugin boundary (a seed ISO is KiBs).
pub const MAX_UPLOAD_BYTES: usize = 16 * 1024 * 1024;
/// Bytes per `virStreamSend`.
const STREAM_CHUNK: usize = 256 * 1024;

type Result<T> = std::result::Result<T, LibvirtError>;
type VirtResult<T> = std::result::Result<T, virt::error::Error>;

fn volume_info(volume: &StorageVol) -> VirtResult<VolumeInfo> {
    let info = volume.get_info()?;
    Ok(VolumeInfo {
        name: volume.get_name()?,
        path: volume.get_path()?,
        capacity: info.capacity,
        allocation: info.allocation,
    })
}

/// `<target><path>…</path>` of a pool's XML (dir, fs and netfs pools have one).
fn pool_target_path(xml: &str) -> Option<String> {
    let target = &xml[xml.find("<target>")?..];
    let start = target.find("<path>")? + "<path>".len();
    let end = target[start..].find("</path>")? + start;
    Some(target[start..end].trim().to_string())
}

/// The `<format type='…'/>` of a volume's `<target>` (raw, qcow2, …).
fn volume_target_format(xml: &str) -> Option<String> {
    let target = &xml[xml.find("<target>")?..];
    let format = &target[target.find("<format")?..];
    let start = format.find("type=")? + "type=".len();
    let quote = format[start..].chars().next()?;
    let end = format[start + 1..].find(quote)? + start + 1;
    Some(format[start + 1..end].to_string())
}

impl Hypervisor {
    /// Checks SSH and libvirt with its own short deadline; never drops the shared connection.
    pub async fn probe(&self, timeout: Duration) -> Result<ProbeReport> {
        self.hub.probe(&self.endpoint, timeout).await
    }

    /// Name and target directory of each granted pool the hypervisor has (a pool without a
    /// directory, or not defined there, is left out).
    pub(crate) async fn pool_paths(&self) -> Result<Vec<(String, String)>> {
        let pools = self.scope.pools.clone();
        self.hub
            .call(&self.endpoint, "storage-pool-get-xml-desc", "", move |c| {
                let mut paths = Vec::new();
                for name in pools {
                    let pool = match StoragePool::lookup_by_name(c, &name) {
                        Ok(pool) => pool,
                        Err(e) if matches!(e.code(), ErrorNumber::NoStoragePool) => continue,
                        Err(e) => return Err(e),
                    };
                    if let Some(path) = pool_target_path(&pool.get_xml_desc(0)?) {
                        paths.push((name, path));
                    }
                }
                Ok(paths)
            })
            .await
    }

    pub async fn pool_info(&self, pool: String) -> Result<PoolInfo> {
        self.granted_pool(&pool)?;
        let ids = format!("pool={pool}");
        self.hub
            .call(&self.endpoint, "storage-pool-get-info", &ids, move |c| {
                let p = StoragePool::lookup_by_name(c, &pool)?;
                let info = p.get_info()?;
                Ok(PoolInfo {
                    name: pool,
                    active: p.is_active()?,
                    path: pool_target_path(&p.get_xml_desc(0)?),
                    capacity: info.capacity,
                    allocation: info.allocation,
                    available: info.available,
                })
            })
            .await
    }

    pub async fn refresh_pool(&self, pool: String) -> Result<()> {
        self.granted_pool(&pool)?;
        let ids = format!("pool={pool}");
        self.hub
            .call(&self.endpoint, "storage-pool-refresh", &ids, move |c| {
                StoragePool::lookup_by_name(c, &pool)?.refresh(0).map(drop)
            })
            .await
    }

    /// Creates a volume from `xml` (written or checked by the host) named `name` in it.
    pub(crate) async fn create_real(
        &self,
        pool: String,
        name: &str,
        xml: String,
    ) -> Result<VolumeInfo> {
        trace!(hypervisor = %self.host, pool = %pool, xml = %xml, "create-volume");
        let ids = format!("pool={pool} volume={name}");
        self.hub
            .call(&self.endpoint, "storage-vol-create-xml", &ids, move |c| {
                let p = StoragePool::lookup_by_name(c, &pool)?;
                volume_info(&StorageVol::create_xml(&p, &xml, 0)?)
            })
            .await
    }

    /// The volume as libvirt has it, imported or not (the import job itself reads it back).
    pub(crate) async fn volume(&self, pool: String, name: String) -> Result<VolumeInfo> {
        let ids = format!("pool={pool} volume={name}");
        self.hub
            .call(
                &self.endpoint,
                "storage-vol-lookup-by-name",
                &ids,
                move |c| {
                    let p = StoragePool::lookup_by_name(c, &pool)?;
                    volume_info(&StorageVol::lookup_by_name(&p, &name)?)
                },
            )
            .await
    }

    /// Deletes the volume libvirt names `name` (the host's name, prefix and all).
    pub(crate) async fn delete_real(&self, pool: String, name: String) -> Result<()> {
        let ids = format!("pool={pool} volume={name}");
        self.hub
            .call(&self.endpoint, "storage-vol-delete", &ids, move |c| {
                let p = StoragePool::lookup_by_name(c, &pool)?;
                StorageVol::lookup_by_name(&p, &name)?.delete(0)
            })
            .await
    }

    /// Copies volume `from` to a new volume `name` in the same pool, on the hypervisor. The copy
    /// keeps the format libvirt has for `from` (raw stays raw: a byte-for-byte copy).
    pub(crate) async fn copy_volume(
        &self,
        pool: String,
        from: String,
        name: String,
    ) -> Result<VolumeInfo> {
        let ids = format!("pool={pool} volume={name} from={from}");
        self.hub
            .call_streaming(
                &self.endpoint,
                "storage-vol-create-xml-from",
                &ids,
                move |c| {
                    let p = StoragePool::lookup_by_name(c, &pool)?;
                    let source = StorageVol::lookup_by_name(&p, &from)?;
                    let capacity = source.get_info()?.capacity;
                    let format = volume_target_format(&source.get_xml_desc(0)?)
                        .unwrap_or_else(|| "raw".into());
                    let xml = format!(
                        "<volume><name>{}</name><capacity unit='bytes'>{capacity}</capacity>\
                     <target><format type='{}'/></target></volume>",
                        xml_escape(&name),
                        xml_escape(&format)
                    );
                    volume_info(&StorageVol::create_xml_from(&p, &xml, &source, 0)?)
                },
            )
            .await
    }

    /// Writes `data` (a seed ISO) over the start of the volume libvirt names `name`.
    pub(crate) async fn upload_real(
        &self,
        pool: String,
        name: String,
        data: Vec<u8>,
    ) -> Result<()> {
        if data.len() > MAX_UPLOAD_BYTES {
            return Err(LibvirtError::Failed(format!(
                "upload-volume takes at most {MAX_UPLOAD_BYTES} bytes, got {}; import large images with import-image",
                data.len()
            )));
        }
        let ids = format!("pool={pool} volume={name} bytes={}", data.len());
        self.hub
            .call(&self.endpoint, "storage-vol-upload", &ids, move |c| {
                let p = StoragePool::lookup_by_name(c, &pool)?;
                let volume = StorageVol::lookup_by_name(&p, &name)?;
                upload(c, &volume, &mut std::iter::once(Ok(data)), 0).map(drop)
            })
            .await
    }
}

/// Streams `chunks` into `volume` from `offset` and finishes the stream when they end. An `Err`
/// item aborts the stream instead (nothing is committed) and is returned as `Ok(Err(reason))`.
pub(crate) fn upload(
    connect: &virt::connect::Connect,
    volume: &StorageVol,
    chunks: &mut dyn Iterator<Item = std::result::Result<Vec<u8>, String>>,
    offset: u64,
) -> VirtResult<std::result::Result<(), String>> {
    let stream = Stream::new(connect, 0)?;
    // Length 0: up to the end of what is sent.
    volume.upload(&stream, offset, 0, 0)?;
    for chunk in chunks {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(reason) => {
                let _ = stream.abort();
                return Ok(Err(reason));
            }
        };
        for piece in chunk.chunks(STREAM_CHUNK) {
            let mut sent = 0;
            while sent < piece.len() {
                match stream.send(&piece[sent..]) {
                    Ok(n) if n > 0 => sent += n,
                    Ok(_) => {
                        let error = virt::error::Error::last_error();
                        let _ = stream.abort();
                        return Err(error);
                    }
                    Err(e) => {
                        let _ = stream.abort();
                        return Err(e);
                    }
                }
            }
        }
    }
    stream.finish().map(Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_volume_format_is_read_from_its_target() {
        let xml = "<volume type='file'><name>b.img</name><source>\n</source>\
                   <target><path>/p/b.img</path><format type='qcow2'/>\
                   <permissions><mode>0600</mode></permissions></target></volume>";
        assert_eq!(volume_target_format(xml).as_deref(), Some("qcow2"));
        let double = "<volume><target><format type=\"raw\"/></target></volume>";
        assert_eq!(volume_target_format(double).as_deref(), Some("raw"));
        assert_eq!(volume_target_format("<volume><target/></volume>"), None);
    }

    #[test]
    fn the_pool_path_is_its_target_path() {
        let xml = "<pool type='dir'><name>p</name><source></source><target>\n  <path>/var/lib/libvirt/images</path>\n  <permissions/></target></pool>";
        assert_eq!(
            pool_target_path(xml).as_deref(),
            Some("/var/lib/libvirt/images")
        );
        assert_eq!(
            pool_target_path("<pool type='rbd'><name>p</name></pool>"),
            None
        );
    }
}
