//! The image imports running in this process, one job per (hypervisor, pool, volume): a second
//! call for the same volume waits for the running job instead of starting another.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;

use super::endpoint::Endpoint;
use super::error::LibvirtError;
use super::records::VolumeInfo;

/// What a job publishes: `None` while it runs, then its result.
pub(crate) type Outcome = Option<Result<VolumeInfo, LibvirtError>>;
/// Which volume a job writes: hypervisor, pool, volume name.
pub(crate) type JobKey = (Endpoint, String, String);

/// The imports running in this process.
#[derive(Default)]
pub(crate) struct Imports {
    jobs: Mutex<HashMap<JobKey, watch::Receiver<Outcome>>>,
    /// Volumes whose bytes this process saw to have a digest (imported, or read back and
    /// hashed), so import-image returns an existing volume only when it is the image.
    verified: Mutex<HashMap<JobKey, String>>,
}

/// What [`Imports::join_or_register`] found.
pub(crate) enum Job {
    /// A job for the key was already running: its outcome.
    Running(watch::Receiver<Outcome>),
    /// No job was running: the caller now owns a new one and publishes its result on `done`.
    Registered {
        done: watch::Sender<Outcome>,
        outcome: watch::Receiver<Outcome>,
    },
}

impl Imports {
    fn jobs(&self) -> std::sync::MutexGuard<'_, HashMap<JobKey, watch::Receiver<Outcome>>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn in_progress(&self, endpoint: &Endpoint, pool: &str, name: &str) -> bool {
        self.jobs()
            .contains_key(&(endpoint.clone(), pool.to_string(), name.to_string()))
    }

    pub(crate) fn running(&self, key: &JobKey) -> Option<watch::Receiver<Outcome>> {
        self.jobs().get(key).cloned()
    }

    /// The job running for `key`, or a new one registered under the same lock (so two callers
    /// never both start one).
    pub(crate) fn join_or_register(&self, key: &JobKey) -> Job {
        let mut jobs = self.jobs();
        if let Some(job) = jobs.get(key) {
            return Job::Running(job.clone());
        }
        let (done, outcome) = watch::channel(None);
        jobs.insert(key.clone(), outcome.clone());
        Job::Registered { done, outcome }
    }

    fn verified(&self) -> std::sync::MutexGuard<'_, HashMap<JobKey, String>> {
        self.verified.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn is_verified(&self, key: &JobKey, sha256: &str) -> bool {
        self.verified().get(key).is_some_and(|d| d == sha256)
    }

    pub(crate) fn record_verified(&self, key: &JobKey, sha256: &str) {
        self.verified().insert(key.clone(), sha256.to_string());
    }

    /// Forgets what was verified of `key`'s volume (it was written to or deleted).
    pub(crate) fn forget_verified(&self, key: &JobKey) {
        self.verified().remove(key);
    }

    /// Forgets the job for `key` (before its result is published: a waiter that then looks the
    /// volume up must see it).
    pub(crate) fn finish(&self, key: &JobKey) {
        self.jobs().remove(key);
    }
}
