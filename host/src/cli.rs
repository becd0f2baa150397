//! Subcommands of the operator binary other than running the operator.

pub mod plugin;
