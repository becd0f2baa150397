//! Real components on loopback for proxy-operator's tests.
//!
//! | fixture | what | start |
//! |---|---|---|
//! | [`ControlPlane`] | etcd + kube-apiserver (built from Go modules), RBAC, admin token | ~4 s, once per test binary |
//! | [`Cluster`] | a real single-node cluster: etcd, kube-apiserver, controller-manager, scheduler, kubelet, kube-proxy, containerd + runc, bridge CNI, in a network namespace with no uplink; local pause/squid/web images | ~15 s (8 s of it importing the images), once per test binary; needs root |
//! | [`TestNamespace`] | a fresh namespace (+ `default` ServiceAccount) per test | ~20 ms |
//! | [`Squid`] | squid on a free port, CONNECT to any port from loopback | ~0.1 s |
//! | [`SocksServer`] | a SOCKS5 server on a free port: dante without a login, or microsocks with one | ~0.1 s |
//! | [`Sshd`] | sshd with generated ed25519 host and client keys | ~0.05 s |
//! | [`Libvirtd`] | private libvirtd + virtlogd, QEMU (TCG), a `dir` pool | ~0.7 s |
//! | [`FileServer`] | HTTP file server that counts requests | instant |
//! | [`netns::Netns`] | a network namespace with only `lo`, no route off it (checked); `listen`/`connect` inside it, `command` runs a program in it | ~15 ms |
//! | [`EgressGuard`] | iptables rules rejecting whatever QEMU/passt send off loopback | ~20 ms |
//! | [`guest_image()`] | the proxy VM image (Debian, cloud-init, squid, guest agent) built by `tests/fixtures/guest-image/build.sh` | instant (cached; build ~4 min) |
//!
//! Add it as a dev-dependency: `proxy-operator-harness = { path = "../tests/harness" }`
//! and `use harness::...`. Run `.ci/install-fixtures.sh` once per machine. A
//! missing fixture is a panic that names the install command, never a skip.
//!
//! # One control plane per test binary, one namespace per test
//!
//! Starting kube-apiserver takes seconds, so all tests in a test binary share
//! one, started by whichever test comes first. Each `#[tokio::test]` runs on its
//! own tokio runtime, and a [`kube::Client`] belongs to the runtime it was
//! created on (its connection pool and buffer task die with that runtime), so
//! only the *processes and configuration* are shared; every test makes its own
//! client and its own namespace:
//!
//! ```no_run
//! use harness::{ControlPlane, TestNamespace};
//! use k8s_openapi::api::core::v1::ConfigMap;
//!
//! #[tokio::test]
//! async fn creates_a_configmap() -> anyhow::Result<()> {
//!     let cp = ControlPlane::shared().await;    // &'static, started once
//!     let ns = TestNamespace::create(cp, "creates-a-configmap").await?;
//!     let client = cp.client();                  // on this test's runtime
//!     let cms: kube::Api<ConfigMap> = kube::Api::namespaced(client, ns.name());
//!     // ...
//!     Ok(())
//! }
//! ```
//!
//! Isolate tests by namespace (or by unique names for cluster-scoped objects
//! such as CRDs and `ProviderHealth`). A test that needs to stop or restart the
//! apiserver starts a private [`ControlPlane::start`] instead.
//!
//! # Nothing leaks
//!
//! Every child process gets `PR_SET_PDEATHSIG = SIGKILL` (forked from one
//! long-lived thread, see [`process`]), its own process group, and is stopped
//! on drop (SIGTERM, then SIGKILL). The shared instance is never dropped: an
//! `atexit` hook kills it, and the kernel does if the test binary aborts or is
//! killed. Scratch directories live in `$TMPDIR/proxy-operator-harness/`
//! (`PROXY_OPERATOR_KEEP_SCRATCH=1` keeps them for debugging).
//!
//! # Environment
//!
//! * `PROXY_OPERATOR_K8S_BIN`: directory with `kube-apiserver`, `kubectl`, `etcd`
//!   (default: the cache `tests/fixtures/k8s/build.sh` fills, see [`bins`]).
//! * `PROXY_OPERATOR_FIXTURES`: root of that cache (default
//!   `$HOME/.cache/proxy-operator/fixtures`).

pub mod bins;
pub mod bootdisk;
pub mod chromium;
pub mod control_plane;
pub mod gateway;
pub mod guard;
pub mod guest_image;
pub mod http;
pub mod libvirtd;
pub mod moto;
pub mod netns;
pub mod node;
pub mod process;
pub mod shared;
pub mod socks;
pub mod squid;
pub mod sshd;
pub mod stack;

pub use control_plane::{ADMIN_USER, ControlPlane, ControlPlaneOptions, TestNamespace};
pub use guard::EgressGuard;
pub use guest_image::{GuestImage, guest_image};
pub use http::FileServer;
pub use libvirtd::Libvirtd;
pub use moto::Moto;
pub use node::{Cluster, Images};
pub use socks::SocksServer;
pub use squid::Squid;
pub use sshd::{SshKey, Sshd};
