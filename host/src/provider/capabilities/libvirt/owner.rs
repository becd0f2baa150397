//! The host's owner mark on domains: which operator and provider instance defined a domain. The
//! host writes it into every domain a plugin defines (a plugin cannot: `allow` refuses the
//! host's namespace in a plugin's XML) and reads it back before any other call touches a domain,
//! so a plugin sees only the domains of its own provider instance.

use super::xml::xml_escape;

/// The XML namespace of the host's mark in a domain's `<metadata>` (not the plugins' own).
pub const HOST_METADATA_URI: &str = "https://proxy-operator.dev/xmlns/host/1";
/// The prefix the host writes its mark with.
const HOST_METADATA_PREFIX: &str = "poh";

/// Who owns a domain: the operator installation and the provider instance.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OwnerMark {
    pub operator: String,
    pub provider: String,
}

impl OwnerMark {
    /// The mark as an element of `<metadata>`.
    pub fn element(&self) -> String {
        format!(
            "<{p}:owner xmlns:{p}=\"{HOST_METADATA_URI}\" operator=\"{}\" provider=\"{}\"/>",
            xml_escape(&self.operator),
            xml_escape(&self.provider),
            p = HOST_METADATA_PREFIX,
        )
    }

    /// Whether `metadata` (what libvirt answers for [`HOST_METADATA_URI`], `None` when the
    /// domain has none) is this mark. Anything else, malformed included, is somebody else's.
    /// libvirt answers the element of the namespace asked for without its namespace.
    pub fn matches(&self, metadata: Option<&str>) -> bool {
        let Some(doc) = metadata.and_then(|xml| roxmltree::Document::parse(xml).ok()) else {
            return false;
        };
        let owner = doc.root_element();
        matches!(owner.tag_name().namespace(), None | Some(HOST_METADATA_URI))
            && owner.tag_name().name() == "owner"
            && owner.attribute("operator") == Some(self.operator.as_str())
            && owner.attribute("provider") == Some(self.provider.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark() -> OwnerMark {
        OwnerMark {
            operator: "op".into(),
            provider: "kvm-a".into(),
        }
    }

    #[test]
    fn only_the_same_operator_and_provider_instance_match() {
        let m = mark();
        let ns = HOST_METADATA_URI;
        let cases: &[(Option<&str>, bool)] = &[
            (Some(&m.element()), true),
            // With the namespace.
            (
                Some(&format!(
                    "<x:owner xmlns:x=\"{ns}\" operator=\"op\" provider=\"kvm-a\"/>"
                )),
                true,
            ),
            (None, false),
            (
                Some(&format!(
                    "<x:owner xmlns:x=\"{ns}\" operator=\"op\" provider=\"kvm-b\"/>"
                )),
                false,
            ),
            (
                Some(&format!(
                    "<x:owner xmlns:x=\"{ns}\" operator=\"other\" provider=\"kvm-a\"/>"
                )),
                false,
            ),
            // The plugins' namespace, or none, is not the host's mark.
            (
                Some(
                    "<x:owner xmlns:x=\"https://proxy-operator.dev/xmlns/kvm/1\" operator=\"op\" provider=\"kvm-a\"/>",
                ),
                false,
            ),
            // What libvirt answers: the element without its namespace.
            (Some("<owner operator=\"op\" provider=\"kvm-a\"/>"), true),
            (Some("<owner operator=\"op\" provider=\"kvm-b\"/>"), false),
            (
                Some(&format!(
                    "<x:other xmlns:x=\"{ns}\" operator=\"op\" provider=\"kvm-a\"/>"
                )),
                false,
            ),
            (Some("<x:owner"), false),
            (
                Some(&format!("<x:owner xmlns:x=\"{ns}\" operator=\"op\"/>")),
                false,
            ),
        ];
        for (metadata, owned) in cases {
            assert_eq!(m.matches(*metadata), *owned, "{metadata:?}");
        }
    }

    #[test]
    fn names_with_quotes_are_escaped_in_the_mark() {
        let m = OwnerMark {
            operator: "a\"b".into(),
            provider: "<p>".into(),
        };
        assert!(m.matches(Some(&m.element())), "{}", m.element());
    }
}
