//! What a test of the operator binary runs beside it: its namespace, the test provider's store
//! (provider `store`) in a providers config, a real squid every Proxy points at, and the loopback
//! target the health probes CONNECT to.

use harness::{ControlPlane, FileServer, Squid, TestNamespace};

use super::common::InstanceStore;
use super::common::operator_process::{OperatorProcess, OperatorSetup};
use super::control_plane;

pub struct World {
    pub cp: &'static ControlPlane,
    pub ns: TestNamespace,
    /// The provider's instance store.
    pub store: InstanceStore,
    pub squid: Squid,
    pub target: FileServer,
    pub dir: tempfile::TempDir,
    /// The providers config's path.
    pub config: String,
}

impl World {
    pub async fn start(prefix: &str) -> World {
        World::start_with_squid(prefix, Squid::start().await.unwrap()).await
    }

    /// A world whose Proxies all point at `squid`.
    pub async fn start_with_squid(prefix: &str, squid: Squid) -> World {
        let cp = control_plane().await;
        let ns = cp.namespace(prefix).await.unwrap();
        let store = InstanceStore::start().await;
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("providers.yaml");
        std::fs::write(
            &config,
            format!("providers:\n{}", super::store_provider("store", &store)),
        )
        .unwrap();
        World {
            cp,
            ns,
            store,
            squid,
            target: FileServer::start().await.unwrap(),
            config: config.to_str().unwrap().to_string(),
            dir,
        }
    }

    /// The operator binary for this world, once it serves leases.
    pub async fn operator(&self) -> OperatorProcess {
        self.operator_with(&[]).await
    }

    /// [`Self::operator`] with further flags.
    pub async fn operator_with(&self, extra: &[&str]) -> OperatorProcess {
        let mut operator = OperatorProcess::start_with(OperatorSetup {
            extra: extra.iter().map(|f| f.to_string()).collect(),
            ..OperatorProcess::setup(
                self.cp,
                &self.ns,
                self.dir.path(),
                &self.config,
                &self.target.addr().to_string(),
            )
        });
        operator.wait_leading().await;
        operator
    }
}
