//! proxy-operator: a Kubernetes operator that gives web crawlers a pool of healthy egress proxies,
//! made through sandboxed WebAssembly provider plugins.

pub mod abandoned;
pub mod api;
pub mod capabilities;
pub mod cli;
pub mod config;
pub mod conformance;
pub mod controller;
pub mod credentials;
pub mod digest;
pub mod durations;
pub mod events;
pub mod fleet;
pub mod gateway;
pub mod gc;
pub mod health;
pub mod kubeclient;
pub mod kubectl;
pub mod leader;
pub mod leader_label;
pub mod leases;
pub mod metrics;
pub mod metrics_auth;
pub mod names;
pub mod operator;
pub mod plugins;
pub mod pool;
pub mod probes;
pub mod providerhealth;
pub mod providers;
pub mod registry;
pub mod socks;
pub mod status_page;
pub mod tls;
pub mod upstream;
pub mod usage;
