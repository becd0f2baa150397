//! Subcommands of the operator binary.

pub mod plugin;
pub mod run;
