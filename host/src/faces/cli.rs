//! Subcommands of the operator binary, and its log set-up.

pub mod command;
pub mod dev_api;
pub mod gateway;
pub mod logging;
pub mod plugin;
pub mod plugin_test;
pub mod run;
pub mod scaffold;
