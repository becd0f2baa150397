//! How many libvirt calls to one hypervisor may be under way at once. A libvirt call blocks a
//! thread until libvirtd answers, and a thread blocked in C cannot be cancelled: without a bound,
//! a hung libvirtd (SIGSTOPped, or stuck on storage) would take one more blocking thread with
//! every call until the runtime's pool is gone. So each hypervisor has a lane: at most
//! `threads` calls block a thread at a time, at most `waiting` more wait for one, and every call
//! gives up at its deadline (its thread, if it has one, goes on until libvirtd answers, still
//! holding its place).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The bounds of every hypervisor's lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallLimits {
    /// How long one libvirt call (waiting for its thread included) may take before the caller
    /// gets `timeout`. Streams (image uploads, digests, copies) have no deadline: they are as
    /// long as the image, and hold one thread each.
    pub deadline: Duration,
    /// Calls that may block a thread at once, per hypervisor.
    pub threads: usize,
    /// Calls that may wait for a thread, per hypervisor; past that a call is refused at once.
    pub waiting: usize,
}

impl Default for CallLimits {
    fn default() -> Self {
        // 60 s: the slowest ordinary call seen (defining a domain with firmware lookups on a
        // loaded host) takes a few seconds. 8 threads: more than a provider instance's default
        // concurrency of 8 calls never helps a single libvirtd.
        CallLimits {
            deadline: Duration::from_secs(60),
            threads: 8,
            waiting: 64,
        }
    }
}

/// One hypervisor's lane.
#[derive(Debug)]
pub(crate) struct Lane {
    /// Places for calls that block a thread or wait for one.
    admitted: Arc<Semaphore>,
    threads: Arc<Semaphore>,
    /// Calls blocking a thread now (shown by [`super::LibvirtHub::blocking_calls`]).
    blocking: Arc<AtomicUsize>,
}

/// Why a call did not get a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoThread {
    /// `threads + waiting` calls are already there.
    Full,
    /// No thread came free before the deadline.
    Deadline,
}

/// A call's right to block a thread; releases it (and counts it) when dropped on that thread.
#[derive(Debug)]
pub(crate) struct Thread {
    _permit: OwnedSemaphorePermit,
    blocking: Arc<AtomicUsize>,
}

impl Thread {
    /// Marks the thread as blocked in libvirt until the returned guard is dropped.
    pub fn enter(self) -> Blocking {
        self.blocking.fetch_add(1, Ordering::Relaxed);
        Blocking(self)
    }
}

/// A thread blocked in a libvirt call; frees its place when dropped.
#[derive(Debug)]
pub(crate) struct Blocking(Thread);

impl Drop for Blocking {
    fn drop(&mut self) {
        self.0.blocking.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Lane {
    pub fn new(limits: &CallLimits) -> Self {
        let threads = limits.threads.max(1);
        Lane {
            admitted: Arc::new(Semaphore::new(threads + limits.waiting)),
            threads: Arc::new(Semaphore::new(threads)),
            blocking: Default::default(),
        }
    }

    /// A place in the lane at once, or `Full`; the place is held until the caller is answered.
    pub fn admit(&self) -> Result<OwnedSemaphorePermit, NoThread> {
        self.admitted
            .clone()
            .try_acquire_owned()
            .map_err(|_| NoThread::Full)
    }

    /// A thread, waiting at most `wait`.
    pub async fn thread(&self, wait: Option<Duration>) -> Result<Thread, NoThread> {
        let acquire = self.threads.clone().acquire_owned();
        let permit = match wait {
            Some(wait) => tokio::time::timeout(wait, acquire)
                .await
                .map_err(|_| NoThread::Deadline)?,
            None => acquire.await,
        };
        Ok(Thread {
            // The semaphore is never closed.
            _permit: permit.map_err(|_| NoThread::Deadline)?,
            blocking: self.blocking.clone(),
        })
    }

    pub fn blocking(&self) -> usize {
        self.blocking.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_lane_admits_threads_plus_waiting_and_gives_threads_up_to_its_bound() {
        let lane = Lane::new(&CallLimits {
            deadline: Duration::from_secs(1),
            threads: 2,
            waiting: 1,
        });
        let places: Vec<_> = (0..3).map(|_| lane.admit().unwrap()).collect();
        assert_eq!(lane.admit().unwrap_err(), NoThread::Full);
        let a = lane.thread(None).await.unwrap().enter();
        let b = lane.thread(None).await.unwrap().enter();
        assert_eq!(lane.blocking(), 2);
        let wait = Some(Duration::from_millis(10));
        assert_eq!(lane.thread(wait).await.unwrap_err(), NoThread::Deadline);
        drop(a);
        assert_eq!(lane.blocking(), 1);
        let _c = lane.thread(wait).await.unwrap();
        drop((b, places));
        assert_eq!(lane.blocking(), 0);
        let _place = lane.admit().unwrap();
    }
}
