//! Smoke tests: every fixture really starts here and does its job.
//! One test binary, so the control plane is shared between the kube tests.

mod dev_cluster;
mod file_server;
mod guard;
mod kube_api;
mod libvirt;
mod squid;
mod sshd;
