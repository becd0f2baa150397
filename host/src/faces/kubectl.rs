//! `kubectl px` (the binary `kubectl-px`): the fleet from a shell, apart from the controllers.
//! Pure modules turn what is read into tables and explanations (`fleet`, `describe`, `why`,
//! `lease_table`, `recent_blocks`, `table`); `fetch`, `lease_api` and `actions` do the reads, the discovery API's
//! requests and the patches; `run` dispatches (docs/kubectl-plugin.md).

pub mod actions;
pub mod args;
pub mod complete;
pub mod describe;
pub mod exit;
pub mod fetch;
pub mod fleet;
pub mod lease_api;
pub mod lease_table;
pub mod recent_blocks;
pub mod run;
pub mod table;
pub mod usage;
pub mod why;

pub use run::main;
