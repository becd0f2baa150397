//! The capabilities a plugin declares in `describe`: a call into one it did not declare is
//! refused even when its provider instance is granted it, so a plugin cannot quietly use more
//! than its author said (and a platform engineer reviewed).

/// Which capabilities the plugin declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Declared {
    pub log: bool,
    pub http: bool,
    pub kube: bool,
    pub libvirt: bool,
}

impl Declared {
    /// Every capability (a plugin's `describe` at load, before it has said anything).
    pub const ALL: Declared = Declared {
        log: true,
        http: true,
        kube: true,
        libvirt: true,
    };
}

/// The refusal of a call into `capability`, which the plugin did not declare.
pub fn undeclared(capability: &str) -> String {
    format!(
        "the plugin does not declare the `{capability}` capability in describe, so the host refuses its {capability} calls; declare it (and grant it)"
    )
}
