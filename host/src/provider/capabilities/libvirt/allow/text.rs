//! An element's text as libvirt reads it: all the text inside it, so a comment cannot split a
//! path or a number into parts that pass the checks one by one.

use roxmltree::Node;

pub(super) fn string_value(node: Node<'_, '_>) -> String {
    node.descendants()
        .filter(Node::is_text)
        .filter_map(|n| n.text())
        .collect()
}

/// [`string_value`], trimmed.
pub(super) fn text(node: Node<'_, '_>) -> String {
    string_value(node).trim().to_string()
}
