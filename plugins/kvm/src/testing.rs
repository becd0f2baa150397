//! Fixtures shared by the unit tests.

use proxy_operator_sdk::{Owner, ProviderError, parse_config};

use crate::config::Config;

/// Two hosts in two zones, one image.
pub const SAMPLE: &str = r#"{
    "hosts": [
        {"name": "hv1", "zone": "home-a", "pool": "default", "network": "default"},
        {"name": "hv2", "zone": "home-b", "bridge": "br0"},
        {"name": "hv3", "zone": "home-a", "pool": "vms", "network": "lan"}
    ],
    "images": {
        "debian-12": {"url": "https://cloud.debian.org/debian-12-genericcloud-amd64.qcow2",
                      "sha256": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
        "alpine": {"url": "https://dl-cdn.alpinelinux.org/alpine.img",
                   "sha256": "FEDCBA9876543210FEDCBA9876543210FEDCBA9876543210FEDCBA9876543210",
                   "firmware": "bios", "format": "raw"}
    },
    "defaultImage": "debian-12"
}"#;

/// [`SAMPLE`], parsed.
pub fn sample() -> Config {
    parse_config::<Config>(SAMPLE).expect("the sample config parses")
}

/// An owner with characters that need escaping in XML.
pub fn owner() -> Owner {
    Owner {
        namespace: "crawlers".into(),
        name: "egress-<1>&\"q\"".into(),
        uid: "5f0c6e1a-9a4b-4a35-b1f6-0d2c1e7c9a11".into(),
        operator_id: "op's-1".into(),
    }
}

/// The message of a `permanent` error; panics on anything else.
pub fn permanent(result: Result<impl std::fmt::Debug, ProviderError>) -> String {
    match result {
        Err(ProviderError::Permanent(m)) => m,
        other => panic!("expected permanent, got {other:?}"),
    }
}
