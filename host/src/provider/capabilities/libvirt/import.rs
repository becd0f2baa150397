//! `import-image`: the host downloads a base image into a pool volume itself, streaming it from the
//! URL into libvirt and checking its sha256 on the way, so gigabytes never pass through a plugin.
//!
//! An import runs as a background job per (hypervisor, pool, volume): a plugin call that times out
//! leaves it running, and the next call waits for the same job instead of starting another. The
//! image is written to a staging volume (`<name>.partial`) and copied to `<name>` once its digest
//! is right, so nothing ever uses a half-written base, not even after a crash mid-import.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tracing::{info, warn};

use super::error::LibvirtError;
use super::hypervisor::Hypervisor;
use super::import_jobs::{Job, JobKey, Outcome};
use super::ops::upload;
use super::records::{ImageSource, VolumeInfo};
use super::xml::xml_escape;
use crate::provider::capabilities::CallContext;
use crate::provider::capabilities::http::HttpError;

/// A silent image server for this long fails the import.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a running import logs its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// What the download hands to the upload at a time.
const FEED_CHUNK: usize = 1024 * 1024;

impl Hypervisor {
    /// Downloads `source` into a new volume `name` of `pool`, or returns the volume when it is
    /// already there and has the image's digest (checked once per process: a volume this process
    /// did not import is read back and hashed first). The URL must be allowed by the provider
    /// instance's `grants.http`.
    pub async fn import_image(
        &self,
        context: Arc<CallContext>,
        pool: String,
        name: String,
        source: ImageSource,
    ) -> Result<VolumeInfo, LibvirtError> {
        self.granted_pool(&pool)?;
        if source.sha256.len() != 64
            || !source
                .sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(LibvirtError::Failed(format!(
                "image sha256 `{}` is not 64 lowercase hex digits",
                source.sha256
            )));
        }
        if !matches!(source.format.as_str(), "qcow2" | "raw") {
            return Err(LibvirtError::Failed(format!(
                "image format `{}` is not qcow2 or raw",
                source.format
            )));
        }
        let real = self.real_name(&name)?;
        let key: JobKey = (self.endpoint.clone(), pool.clone(), real.clone());
        let mut outcome = match self.hub.imports.running(&key) {
            Some(job) => job,
            None => {
                match self.volume(pool.clone(), real.clone()).await {
                    Ok(volume) => {
                        self.verify_existing(&key, &source).await?;
                        return Ok(self.plugins_view(volume));
                    }
                    Err(LibvirtError::NotFound(_)) => {}
                    Err(e) => return Err(e),
                }
                self.start_import(key, context, source)
            }
        };
        let done = outcome
            .wait_for(Option::is_some)
            .await
            .map_err(|_| LibvirtError::Failed("the import job ended without a result".into()))?;
        let result = done
            .clone()
            .unwrap_or_else(|| Err(LibvirtError::Failed("the import job has no result".into())));
        result.map(|volume| self.plugins_view(volume))
    }

    /// An existing volume is the image only once its bytes are seen to have its digest: a
    /// volume made another way (created and uploaded to, or left on the hypervisor before this
    /// process started) is read back through libvirt and hashed, then remembered as verified.
    async fn verify_existing(
        &self,
        key: &JobKey,
        source: &ImageSource,
    ) -> Result<(), LibvirtError> {
        if self.hub.imports.is_verified(key, &source.sha256) {
            return Ok(());
        }
        let (_, pool, real) = key.clone();
        let digest = self.volume_sha256(pool, real).await?;
        if digest != source.sha256 {
            return Err(LibvirtError::ChecksumMismatch(format!(
                "volume {} in pool {} exists with sha256 {digest}, not the image's {}; delete it (delete-volume) and import again",
                self.plugin_name(&key.2),
                key.1,
                source.sha256
            )));
        }
        self.hub.imports.record_verified(key, &source.sha256);
        Ok(())
    }

    /// Starts the job for `key` unless one started meanwhile; returns its outcome channel.
    fn start_import(
        &self,
        key: JobKey,
        context: Arc<CallContext>,
        source: ImageSource,
    ) -> watch::Receiver<Outcome> {
        let (done, outcome) = match self.hub.imports.join_or_register(&key) {
            Job::Running(outcome) => return outcome,
            Job::Registered { done, outcome } => (done, outcome),
        };
        let hypervisor = self.clone();
        tokio::spawn(async move {
            // However the task ends (a panic included), the job is forgotten: a failed import
            // never blocks the next one.
            let registered = Registered {
                hub: hypervisor.hub.clone(),
                key: key.clone(),
            };
            let (_, pool, name) = key.clone();
            let result = hypervisor
                .run_import(&context, pool.clone(), name.clone(), &source)
                .await
                .map_err(|e| {
                    interrupted(
                        e,
                        &hypervisor.host,
                        &pool,
                        hypervisor.plugin_name(&name),
                        &source.url,
                    )
                });
            match &result {
                Ok(volume) => info!(
                    hypervisor = %hypervisor.host, pool, volume = name, url = %source.url,
                    bytes = volume.allocation, "image imported"
                ),
                Err(e) => warn!(
                    hypervisor = %hypervisor.host, pool, volume = name, url = %source.url,
                    error = %e, "image import failed"
                ),
            }
            if result.is_ok() {
                hypervisor.hub.imports.record_verified(&key, &source.sha256);
            }
            // Forgotten before the result is out: a waiter that then looks the volume up must
            // see it.
            drop(registered);
            let _ = done.send(Some(result));
        });
        outcome
    }

    async fn run_import(
        &self,
        context: &CallContext,
        pool: String,
        name: String,
        source: &ImageSource,
    ) -> Result<VolumeInfo, LibvirtError> {
        let (response, length) = open_image(context, source).await?;
        info!(
            hypervisor = %self.host, pool, volume = name, url = %source.url, bytes = length,
            "importing image"
        );
        // The bytes go to a staging volume first and reach `name` only once verified, by a
        // copy on the hypervisor (libvirt has no rename). So `name` never exists half-written,
        // even when this process dies mid-download; the staging volume it leaves is replaced by
        // the next import.
        let staging = staging_name(&name);
        match self.volume(pool.clone(), staging.clone()).await {
            Ok(_) => {
                warn!(hypervisor = %self.host, pool, volume = staging, "removing a staging volume left by an interrupted import");
                self.delete_real(pool.clone(), staging.clone()).await?;
            }
            Err(LibvirtError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        // A raw file of the image's size, so the copy below is byte for byte; libvirt sees the
        // real format (qcow2) of the copy on the refresh.
        let xml = format!(
            "<volume><name>{}</name><capacity unit='bytes'>{length}</capacity>\
             <target><format type='raw'/></target></volume>",
            xml_escape(&staging)
        );
        self.create_real(pool.clone(), &staging, xml).await?;
        let uploaded = self
            .stream_into(response, &pool, &staging, length, source)
            .await;
        let (copied, orphaned) = match uploaded {
            Ok(()) => {
                let copied = self
                    .copy_volume(pool.clone(), staging.clone(), name.clone())
                    .await;
                // The connection went during the copy: libvirtd goes on copying without a
                // client, and `name` is there half-copied until it is done. The job (which
                // lookups of `name` wait for) ends only once libvirt has let go of the
                // staging volume.
                let orphaned = matches!(copied, Err(LibvirtError::Transport(_)));
                (copied, orphaned)
            }
            Err(e) => (Err(e), false),
        };
        let removed = if orphaned {
            self.remove_after_orphaned_copy(&pool, &staging).await
        } else {
            self.delete_real(pool.clone(), staging.clone()).await
        };
        if let Err(cleanup) = removed {
            warn!(hypervisor = %self.host, pool, volume = staging, error = %cleanup, "cannot remove the staging volume");
        }
        match copied {
            Ok(_) => {}
            Err(LibvirtError::Transport(m)) if orphaned => {
                if !self.orphaned_copy_is_whole(&pool, &name, source).await {
                    return Err(LibvirtError::Transport(format!(
                        "the connection went while libvirt copied the verified image to {}, and \
                         the copy libvirt went on with did not make it whole: {m}",
                        self.plugin_name(&name)
                    )));
                }
                info!(
                    hypervisor = %self.host, pool, volume = name,
                    "the copy went on without its connection and has the image's digest"
                );
            }
            Err(e) => return Err(e),
        }
        self.refresh_pool(pool.clone()).await?;
        self.volume(pool, name).await
    }

    /// Removes the staging volume once the copy from it, which libvirtd finishes (or drops)
    /// on its own after its client went away, is over: libvirt refuses to delete a copy's
    /// source while it copies ("still in use"), and that refusal is the only sign of the copy
    /// it gives (there is no volume event), so it is polled.
    async fn remove_after_orphaned_copy(
        &self,
        pool: &str,
        staging: &str,
    ) -> Result<(), LibvirtError> {
        let started = Instant::now();
        loop {
            let removed = self
                .delete_real(pool.to_string(), staging.to_string())
                .await;
            match after_orphaned_copy(&removed, started.elapsed()) {
                OrphanedCopy::Over => return Ok(()),
                OrphanedCopy::GiveUp => return removed,
                OrphanedCopy::Wait => {
                    info!(
                        hypervisor = %self.host, pool, volume = staging,
                        waited_s = started.elapsed().as_secs(),
                        "waiting for libvirt to finish a copy whose connection was lost"
                    );
                    tokio::time::sleep(ORPHANED_COPY_POLL).await;
                }
            }
        }
    }

    /// Whether the copy to `name` that libvirtd went on with after its connection was lost made
    /// the whole image: only its digest can tell (a libvirtd that died mid-copy leaves a
    /// half-written volume). A volume that is not the image is deleted, so nothing takes it for
    /// the base.
    async fn orphaned_copy_is_whole(&self, pool: &str, name: &str, source: &ImageSource) -> bool {
        match self.volume(pool.to_string(), name.to_string()).await {
            Ok(_) => {}
            // libvirt removed it after a failed copy.
            Err(LibvirtError::NotFound(_)) => return false,
            Err(e) => {
                warn!(hypervisor = %self.host, pool, volume = name, error = %e, "cannot look at a copy whose connection was lost");
                return false;
            }
        }
        match self.volume_sha256(pool.to_string(), name.to_string()).await {
            Ok(digest) if digest == source.sha256 => true,
            outcome => {
                warn!(hypervisor = %self.host, pool, volume = name, digest = ?outcome, "removing a copy whose connection was lost and that is not the image");
                if let Err(e) = self.delete_real(pool.to_string(), name.to_string()).await {
                    warn!(hypervisor = %self.host, pool, volume = name, error = %e, "cannot remove a copy that is not the image");
                }
                false
            }
        }
    }

    /// Feeds the response body to a blocking libvirt upload through a small bounded channel,
    /// hashing it on the way; a wrong digest or length aborts the upload before it is finished.
    async fn stream_into(
        &self,
        response: reqwest::Response,
        pool: &str,
        name: &str,
        length: u64,
        source: &ImageSource,
    ) -> Result<(), LibvirtError> {
        let (chunks_tx, chunks_rx) = std::sync::mpsc::sync_channel::<Result<Vec<u8>, String>>(4);
        // What the upload was handed (an upper bound of what reached the hypervisor), for the
        // error when it stops half-way.
        let handed_total = std::sync::atomic::AtomicU64::new(0);
        let handed = &handed_total;
        let (pool_name, volume_name) = (pool.to_string(), name.to_string());
        let ids = format!("pool={pool} volume={name} bytes={length}");
        let upload =
            self.hub
                .call_streaming(&self.endpoint, "storage-vol-upload", &ids, move |c| {
                    let p = virt::storage_pool::StoragePool::lookup_by_name(c, &pool_name)?;
                    let volume = virt::storage_vol::StorageVol::lookup_by_name(&p, &volume_name)?;
                    upload(c, &volume, &mut chunks_rx.into_iter(), 0)
                });
        let feed = async move {
            let mut body = response.bytes_stream();
            let mut hasher = Sha256::new();
            let (mut received, started) = (0u64, Instant::now());
            let mut last_report = started;
            let mut pending = Vec::with_capacity(FEED_CHUNK);
            loop {
                let chunk = match tokio::time::timeout(READ_TIMEOUT, body.next()).await {
                    Err(_) => {
                        abort_upload(&chunks_tx, "the image server stalled").await;
                        return Err(LibvirtError::Timeout(format!(
                            "image {}: no data for {READ_TIMEOUT:?}",
                            source.url
                        )));
                    }
                    Ok(None) => break,
                    Ok(Some(Err(e))) => {
                        abort_upload(&chunks_tx, "the download failed").await;
                        return Err(LibvirtError::Transport(format!(
                            "image {}: {e}",
                            source.url
                        )));
                    }
                    Ok(Some(Ok(chunk))) => chunk,
                };
                received += chunk.len() as u64;
                if received > length {
                    break;
                }
                hasher.update(&chunk);
                pending.extend_from_slice(&chunk);
                if pending.len() >= FEED_CHUNK {
                    let size = pending.len() as u64;
                    if !send_chunk(&chunks_tx, std::mem::take(&mut pending)).await {
                        // The upload stopped; its own error says why.
                        return Ok(());
                    }
                    handed.fetch_add(size, std::sync::atomic::Ordering::Relaxed);
                }
                if last_report.elapsed() >= PROGRESS_EVERY {
                    last_report = Instant::now();
                    info!(
                        hypervisor = %self.host, volume = %name, url = %source.url,
                        percent = received * 100 / length.max(1), bytes = received,
                        elapsed_s = started.elapsed().as_secs(), "importing image"
                    );
                }
            }
            if !pending.is_empty() && !send_chunk(&chunks_tx, pending).await {
                return Ok(());
            }
            // Every byte is sent but the stream is not finished: a wrong image is aborted here
            // and never becomes a volume.
            let digest = hex::encode(hasher.finalize());
            if let Err((error, why)) = whole_image(received, length, &digest, source) {
                abort_upload(&chunks_tx, why).await;
                return Err(error);
            }
            // Dropping the sender ends the chunks: the upload finishes the stream.
            drop(chunks_tx);
            Ok(())
        };
        let (uploaded, fed) = tokio::join!(upload, feed);
        fed?;
        let uploaded = uploaded.map_err(|e| match e {
            LibvirtError::Transport(m) => LibvirtError::Transport(format!(
                "the upload stopped at most {} into the {} image: {m}",
                mib(handed_total.load(std::sync::atomic::Ordering::Relaxed)),
                mib(length)
            )),
            other => other,
        });
        uploaded?.map_err(|reason| {
            LibvirtError::Failed(format!("image {}: upload aborted ({reason})", source.url))
        })
    }
}

/// The image's download, with its length (an image server must send Content-Length).
async fn open_image(
    context: &CallContext,
    source: &ImageSource,
) -> Result<(reqwest::Response, u64), LibvirtError> {
    let response = context
        .http
        .open_download(&context.provider, &source.url)
        .await
        .map_err(|e| match e {
            HttpError::Denied(m) => LibvirtError::Denied(format!(
                "image {}: {m}; add the image server to grants.http.allow",
                source.url
            )),
            HttpError::Timeout(m) => LibvirtError::Timeout(m),
            other => LibvirtError::Transport(format!("image {}: {other}", source.url)),
        })?;
    if !response.status().is_success() {
        return Err(LibvirtError::Failed(format!(
            "image {}: the server answered {}",
            source.url,
            response.status()
        )));
    }
    let Some(length) = response.content_length() else {
        return Err(LibvirtError::Failed(format!(
            "image {}: the server sent no Content-Length; serve the image as a plain file",
            source.url
        )));
    };
    Ok((response, length))
}

/// Whether the bytes received are the image: its length and its digest. The error comes with
/// the reason the upload is aborted for.
fn whole_image(
    received: u64,
    length: u64,
    digest: &str,
    source: &ImageSource,
) -> Result<(), (LibvirtError, &'static str)> {
    if received != length {
        return Err((
            LibvirtError::Transport(format!(
                "image {}: got {received} bytes or more, Content-Length said {length}",
                source.url
            )),
            "length mismatch",
        ));
    }
    if digest != source.sha256 {
        return Err((
            LibvirtError::ChecksumMismatch(format!(
                "image {} has sha256 {digest}, the config expects {}; fix the sha256 or the URL",
                source.url, source.sha256
            )),
            "checksum mismatch",
        ));
    }
    Ok(())
}

type ChunkSender = std::sync::mpsc::SyncSender<Result<Vec<u8>, String>>;

/// Hands a chunk to the blocking upload; false when the upload has stopped.
async fn send_chunk(sender: &ChunkSender, chunk: Vec<u8>) -> bool {
    match sender.try_send(Ok(chunk)) {
        Ok(()) => true,
        Err(std::sync::mpsc::TrySendError::Disconnected(_)) => false,
        // The channel is bounded and the upload blocks: wait on a blocking thread.
        Err(std::sync::mpsc::TrySendError::Full(item)) => {
            let sender = sender.clone();
            tokio::task::spawn_blocking(move || sender.send(item).is_ok())
                .await
                .unwrap_or(false)
        }
    }
}

/// Tells the upload to abort rather than finish (waits for room in the channel: a dropped
/// sender would finish the stream).
async fn abort_upload(sender: &ChunkSender, reason: &str) {
    let sender = sender.clone();
    let item = Err(reason.to_string());
    let _ = tokio::task::spawn_blocking(move || sender.send(item)).await;
}

/// How often a copy that lost its connection is looked at.
const ORPHANED_COPY_POLL: Duration = Duration::from_secs(1);
/// Past this, the import stops waiting for such a copy (a copy of the largest image takes
/// minutes, not this long): the hypervisor is unreachable or libvirt in a state nobody can
/// tell from here.
const ORPHANED_COPY_MAX: Duration = Duration::from_secs(30 * 60);

/// What the staging volume's delete says of a copy from it that lost its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OrphanedCopy {
    /// The staging volume is gone: libvirt is done with the copy (the base is whole, or
    /// libvirt removed it after a failed copy).
    Over,
    /// Still copying, or the hypervisor cannot be asked yet.
    Wait,
    GiveUp,
}

fn after_orphaned_copy(removed: &Result<(), LibvirtError>, waited: Duration) -> OrphanedCopy {
    let copying = match removed {
        Ok(()) | Err(LibvirtError::NotFound(_)) => return OrphanedCopy::Over,
        Err(LibvirtError::Failed(m)) => m.contains("still in use"),
        Err(LibvirtError::Transport(_) | LibvirtError::Timeout(_)) => true,
        // Anything else will not change by waiting.
        Err(_) => false,
    };
    if copying && waited < ORPHANED_COPY_MAX {
        OrphanedCopy::Wait
    } else {
        OrphanedCopy::GiveUp
    }
}

/// Forgets its import job when dropped (see [`Hypervisor::start_import`]).
struct Registered {
    hub: Arc<super::hub::LibvirtHub>,
    key: JobKey,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.hub.imports.finish(&self.key);
    }
}

/// A failed import's error as the plugin gets it: a connection or an image server that went
/// away mid-import says that the import was interrupted, that nothing half-written is used,
/// and that the next call starts over; a wrong image or a refusal is left as it is (trying
/// again would not help).
fn interrupted(e: LibvirtError, host: &str, pool: &str, volume: &str, url: &str) -> LibvirtError {
    let say = |m: String| {
        format!(
            "image import of {volume} (pool {pool} on hypervisor {host}, from {url}) was interrupted: {m}; \
             nothing half-written is ever used as {volume} (the bytes go to a staging volume \
             first), and the next import-image tries again"
        )
    };
    match e {
        LibvirtError::Transport(m) => LibvirtError::Transport(say(m)),
        LibvirtError::Timeout(m) => LibvirtError::Timeout(say(m)),
        other => other,
    }
}

/// `12.3 MiB`
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Where an import of `name` writes until the image is verified.
fn staging_name(name: &str) -> String {
    format!("{name}.partial")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only what trying again can fix is called interrupted (and retried by the plugin as
    /// transient); a wrong image or a refusal keeps its kind and its words.
    #[test]
    fn an_interrupted_import_says_so_and_a_wrong_image_does_not() {
        let e = |error| interrupted(error, "hv1", "pool", "base.img", "http://i/b");
        let cases = [
            (LibvirtError::Transport("ssh dropped".into()), true),
            (LibvirtError::Timeout("no data".into()), true),
            (LibvirtError::ChecksumMismatch("sha".into()), false),
            (LibvirtError::Denied("grant".into()), false),
            (LibvirtError::Failed("aborted".into()), false),
            (LibvirtError::NotFound("pool".into()), false),
        ];
        for (error, retried) in cases {
            let kind = std::mem::discriminant(&error);
            let said = e(error.clone());
            assert_eq!(std::mem::discriminant(&said), kind, "{said}");
            let text = said.to_string();
            assert_eq!(text.contains("was interrupted"), retried, "{text}");
            if retried {
                for needed in ["base.img", "hv1", "pool", "http://i/b", "tries again"] {
                    assert!(text.contains(needed), "{needed} missing: {text}");
                }
            } else {
                assert_eq!(said, error);
            }
        }
        assert_eq!(mib(6 << 20), "6.0 MiB");
    }

    /// After a copy lost its connection, the import waits while libvirt still copies (it
    /// refuses to delete the source) or cannot be asked, and no longer than the bound.
    #[test]
    fn an_orphaned_copy_is_waited_for_while_libvirt_still_copies() {
        use OrphanedCopy::{GiveUp, Over, Wait};
        let in_use = || {
            Err(LibvirtError::Failed(
                "storage-vol-delete pool=p volume=b.partial: Requested operation is not valid: volume 'b.partial' is still in use.".into(),
            ))
        };
        let early = Duration::from_secs(3);
        let late = ORPHANED_COPY_MAX + Duration::from_secs(1);
        let cases = [
            (Ok(()), early, Over),
            (Err(LibvirtError::NotFound("gone".into())), early, Over),
            (in_use(), early, Wait),
            (in_use(), late, GiveUp),
            (Err(LibvirtError::Transport("ssh".into())), early, Wait),
            (Err(LibvirtError::Timeout("slow".into())), early, Wait),
            (Err(LibvirtError::Transport("ssh".into())), late, GiveUp),
            (
                Err(LibvirtError::Failed("permission denied".into())),
                early,
                GiveUp,
            ),
            (Err(LibvirtError::Denied("pool".into())), early, GiveUp),
        ];
        for (removed, waited, expected) in cases {
            assert_eq!(
                after_orphaned_copy(&removed, waited),
                expected,
                "{removed:?} after {waited:?}"
            );
        }
    }

    /// A job whose task dies (a bug, a panic) is forgotten all the same, and its waiters are
    /// told: the next import-image starts a new job instead of waiting on a dead one forever.
    #[tokio::test]
    async fn a_job_whose_task_panics_is_forgotten() {
        use super::super::endpoint::Endpoint;
        use super::super::hub::LibvirtHub;
        use super::super::import_jobs::Job;
        use super::super::material::MaterialSource;
        use super::super::tunnel::{SshMaterial, SshTarget};

        let hub = LibvirtHub::new(
            MaterialSource::Static(SshMaterial {
                private_key: String::new(),
                known_hosts: String::new(),
            }),
            std::env::temp_dir(),
        );
        let endpoint = Endpoint {
            target: SshTarget {
                address: "hv1".into(),
                port: 22,
                user: "root".into(),
            },
            socket: "/run/libvirt/libvirt-sock".into(),
            secret: "kvm-ssh".into(),
        };
        let key: JobKey = (endpoint, "pool".into(), "base.img".into());
        let Job::Registered { done, mut outcome } = hub.imports.join_or_register(&key) else {
            panic!("no job was running");
        };
        assert!(hub.imports.running(&key).is_some());
        let registered = Registered {
            hub: hub.clone(),
            key: key.clone(),
        };
        let task = tokio::spawn(async move {
            let _held = (registered, done);
            panic!("a bug in an import");
        });
        assert!(task.await.unwrap_err().is_panic());
        assert!(hub.imports.running(&key).is_none(), "the job is forgotten");
        assert!(
            outcome.wait_for(Option::is_some).await.is_err(),
            "a waiter is told the job ended without a result"
        );
        assert!(matches!(
            hub.imports.join_or_register(&key),
            Job::Registered { .. }
        ));
    }
}
