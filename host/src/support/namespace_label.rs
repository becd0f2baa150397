//! The `namespace` label of the usage metrics (instance-seconds, cost, leases, gateway bytes),
//! so a platform team can bill each team. Namespaces are bounded by the cluster, but a label is
//! for ever once exported (a counter cannot move to another series), so the first
//! [`NAMESPACE_LABELS`] namespaces seen by this process get a label of their own and any later
//! one is counted as [`OTHER_NAMESPACE`]. One book per process, shared by every family: a
//! namespace has the same label in all of them, so a team's usage adds up across families.

use std::collections::HashSet;
use std::sync::{Arc, LazyLock, Mutex};

/// Namespaces with a label of their own, at most (per process).
pub const NAMESPACE_LABELS: usize = 500;
/// The label of the namespaces beyond [`NAMESPACE_LABELS`].
pub const OTHER_NAMESPACE: &str = "other";

/// The namespaces given a label of their own so far.
#[derive(Default)]
pub struct NamespaceBook {
    labelled: HashSet<Arc<str>>,
}

impl NamespaceBook {
    /// The label of `namespace`, given room for `limit` namespaces of their own.
    pub fn label(&mut self, namespace: &str, limit: usize) -> Arc<str> {
        if let Some(known) = self.labelled.get(namespace) {
            return known.clone();
        }
        if self.labelled.len() >= limit || namespace == OTHER_NAMESPACE {
            return Arc::from(OTHER_NAMESPACE);
        }
        let label: Arc<str> = Arc::from(namespace);
        self.labelled.insert(label.clone());
        label
    }
}

static BOOK: LazyLock<Mutex<NamespaceBook>> = LazyLock::new(Default::default);

/// The `namespace` label value of `namespace` in this process.
pub fn namespace_label(namespace: &str) -> Arc<str> {
    BOOK.lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .label(namespace, NAMESPACE_LABELS)
}

/// The namespace of a `namespace/name` key (a pool label), or `None` for `none`/`unknown`.
pub fn namespace_of(qualified: &str) -> Option<&str> {
    qualified.split_once('/').map(|(ns, _)| ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_past_the_limit_share_the_other_label_and_a_labelled_one_keeps_its_own() {
        let mut book = NamespaceBook::default();
        assert_eq!(&*book.label("team-a", 2), "team-a");
        assert_eq!(&*book.label("team-b", 2), "team-b");
        assert_eq!(&*book.label("team-c", 2), OTHER_NAMESPACE);
        assert_eq!(&*book.label("team-a", 2), "team-a");
        // A namespace called `other` is counted with the others, never apart from them.
        let mut roomy = NamespaceBook::default();
        assert_eq!(&*roomy.label(OTHER_NAMESPACE, 10), OTHER_NAMESPACE);
        assert!(roomy.labelled.is_empty());
    }

    #[test]
    fn the_namespace_of_a_pool_label() {
        assert_eq!(namespace_of("team-a/pool-1"), Some("team-a"));
        assert_eq!(namespace_of("none"), None);
    }
}
