//! Leasing and the gateway: the lease store, the discovery API that grants leases, and the
//! gateway that carries crawlers' bytes to the leased proxies. Below the Proxy life cycle, which
//! feeds the lease table (health verdicts, pool members) but is never called from here. Imports
//! only `support`, `api` and `provider` (docs/architecture.md, "Tiers").

pub mod gateway;
pub mod leases;
