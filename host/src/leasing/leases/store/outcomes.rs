//! Why a lease ended and how a crawler's use of a proxy went: the fixed label sets of the lease
//! metrics, so they live apart from the lease table that records them.

use serde::{Deserialize, Serialize};

/// Why a lease is over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum EndReason {
    Released,
    Expired,
    Blocked,
    Unhealthy,
    Deleted,
}

impl EndReason {
    /// Every reason, in declaration order (`reason as usize` indexes it).
    pub const ALL: [EndReason; 5] = [
        EndReason::Released,
        EndReason::Expired,
        EndReason::Blocked,
        EndReason::Unhealthy,
        EndReason::Deleted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Released => "released",
            EndReason::Expired => "expired",
            EndReason::Blocked => "blocked",
            EndReason::Unhealthy => "unhealthy",
            EndReason::Deleted => "deleted",
        }
    }
}

/// How a crawler's use of a proxy went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Success,
    Failure,
    Blocked,
}

impl Outcome {
    /// Every outcome, in declaration order (`outcome as usize` indexes it).
    pub const ALL: [Outcome; 3] = [Outcome::Success, Outcome::Failure, Outcome::Blocked];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Failure => "failure",
            Outcome::Blocked => "blocked",
        }
    }
}
