//! Subcommands of the operator binary, and its log set-up.

pub mod args;
pub mod logging;
pub mod plugin;
pub mod run;
