//! Usage: what the fleet costs and what each team used. The meter (`meter.rs`) counts
//! instance-seconds into `/metrics`; the leader's usage book (`book.rs`, fed by `ledger.rs`,
//! kept in a ConfigMap by `persist.rs`) adds each team's figures per pool and provider instance
//! since the book began and over the last hour and day, for `kubectl px usage`
//! (`/status/usage.json`).

pub mod book;
pub mod ledger;
mod meter;
pub mod persist;

pub use ledger::UsageLedger;
pub use meter::{UsageMetrics, run};
