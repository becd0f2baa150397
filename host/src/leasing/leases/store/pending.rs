//! How far the table has reached the cluster: the changes the writer (`leases/persist.rs`) has
//! not taken yet, and the version it last stored.

use crate::leasing::leases::journal::Change;

/// Changes held for the writer at most; past it the next write is a whole checkpoint.
pub const MAX_PENDING_CHANGES: usize = 100_000;

/// What the writer takes from the table: the changes since its last take, or — when they
/// overflowed [`MAX_PENDING_CHANGES`] — the word that only a whole checkpoint will do.
#[derive(Debug)]
pub struct Pending {
    pub changes: Vec<Change>,
    /// Write a checkpoint of the whole table (`changes` is empty).
    pub whole: bool,
    /// The version the cluster has once this is written.
    pub version: u64,
}

/// How far the table has reached the cluster.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Stored {
    pub(super) version: u64,
    /// False while closed (not the leader): a waiting grant gives up at once.
    pub(super) open: bool,
}

/// Why a change was not confirmed as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotStored {
    /// The store closed (leadership lost or shutdown) before the write.
    Closed,
    /// No write succeeded in time (the API server is unreachable or slow).
    TimedOut,
}
