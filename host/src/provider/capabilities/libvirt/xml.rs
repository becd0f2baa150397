//! The one XML escaper of the host, for names put into the libvirt XML it writes itself (volume
//! definitions). Hand-written on purpose: five replacements, and no XML crate is in the
//! dependency tree (the kvm plugin has its own, in the guest, for the domain XML it builds).

/// `text` safe inside XML character data and in single- or double-quoted attribute values.
pub(crate) fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\'', "&apos;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_special_character_is_escaped_once() {
        assert_eq!(
            xml_escape(r#"a&b <c> 'd' "e" &amp;"#),
            "a&amp;b &lt;c&gt; &apos;d&apos; &quot;e&quot; &amp;amp;"
        );
        assert_eq!(xml_escape("base-12.qcow2"), "base-12.qcow2");
    }
}
