//! YAML in and out: serde-saphyr, the YAML library kube-client builds too, so the binary carries
//! one YAML stack. Set to read YAML as the operator always has (it used serde_yaml before): the
//! YAML 1.2 core schema (`yes`, `on`, `0755`, `1_000` are strings unless a field's type says
//! otherwise), a repeated key handled as serde handles it, `<<` an ordinary key. Every reader of
//! the providers config, a plugin's instance and spec files, and the tests reading what kubectl
//! or Helm print go through [`options`]; the CRDs and `kubectl px -o yaml` through [`to_string`].

use std::borrow::Cow;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_saphyr::{
    DuplicateKeyPolicy, MergeKeyPolicy, MessageFormatter, NonFiniteFloatPolicy, SnippetMode,
    UserMessageFormatter,
};

/// How the operator reads YAML: what serde-saphyr does by default, except where serde_yaml (what
/// the operator read its files with before) read it otherwise; `tests` below shows each case.
pub fn options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        // `yes`/`no`/`on`/`off`/`y`/`n` are strings (YAML 1.2), refused for a boolean field.
        strict_booleans: true,
        // `name: ~` into a string is the text `~` (an `Option` is still `None`).
        null_as_string: true,
        // In untyped values (a provider's `config`), `0755`, `-007` and `1_000` stay strings.
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
        // A repeated key goes to serde: `duplicate field` for a struct, the last for a map.
        duplicate_keys: DuplicateKeyPolicy::PassThrough,
        // `<<` is a key like any other: merge keys are not expanded.
        merge_keys: MergeKeyPolicy::AsOrdinary,
        // `.inf`/`.nan` in an untyped value are that float (JSON: null), not an error.
        non_finite_float_policy: NonFiniteFloatPolicy::PassThrough,
        // `!!binary` on a string field is not decoded.
        ignore_binary_tag_for_string: true,
        // One-line messages: the caller names the file.
        with_snippet: false,
    }
}

/// A YAML document that does not read as the type: where (the field path, e.g.
/// `providers[0].grants`, when the mistake is inside the document) and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", path.as_ref().map(|p| format!("{p}: ")).unwrap_or_default())]
pub struct Error {
    /// The field path of the mistake; `None` at the top of the document.
    pub path: Option<String>,
    /// What is wrong, with the line and column.
    pub message: String,
}

/// Reads one YAML document as `T`, with [`options`]; a mistake names its field path.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, Error> {
    let mut path = None;
    serde_saphyr::with_deserializer_from_str_with_options(text, options(), |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            path = Some(e.path().to_string()).filter(|p| p != ".");
            e.into_inner()
        })
    })
    .map_err(|e| Error {
        path,
        message: match e.without_snippet() {
            serde_saphyr::Error::MultipleDocuments { .. } => format!(
                "more than one YAML document (`---`) where one is read{}",
                location(&e)
            ),
            _ => e.render_with_options(serde_saphyr::render_options! {
                formatter: &Wording,
                snippets: SnippetMode::Off,
            }),
        },
    })
}

/// serde-saphyr's messages for people, except an unknown field or variant: serde's own words,
/// each name in backticks (`expected one of `name`, `type``), as before and as the docs tests
/// read the list of fields.
struct Wording;

impl MessageFormatter for Wording {
    fn format_message<'a>(&self, err: &'a serde_saphyr::Error) -> Cow<'a, str> {
        match err {
            serde_saphyr::Error::SerdeUnknownField {
                field, expected, ..
            } => Cow::Owned(format!(
                "unknown field `{field}`, {}",
                one_of(expected, "fields")
            )),
            serde_saphyr::Error::SerdeUnknownVariant {
                variant, expected, ..
            } => Cow::Owned(format!(
                "unknown variant `{variant}`, {}",
                one_of(expected, "variants")
            )),
            _ => UserMessageFormatter.format_message(err),
        }
    }
}

/// serde's `expected `a``, `expected `a` or `b``, `expected one of `a`, `b`, `c``.
fn one_of(names: &[&str], what: &str) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match quoted.as_slice() {
        [] => format!("there are no {what}"),
        [one] => format!("expected {one}"),
        [a, b] => format!("expected {a} or {b}"),
        all => format!("expected one of {}", all.join(", ")),
    }
}

fn location(e: &serde_saphyr::Error) -> String {
    e.location()
        .map(|l| format!(" at line {}, column {}", l.line(), l.column()))
        .unwrap_or_default()
}

/// `value` as a YAML document: long strings on one line (not folded, so the committed CRDs stay
/// greppable), strings with line breaks as `|` blocks, strings YAML 1.1 would read as something
/// else quoted.
pub fn to_string<T: Serialize>(value: &T) -> Result<String, serde_saphyr::SerializeError> {
    serde_saphyr::to_string_with_options(
        value,
        serde_saphyr::ser_options! {
            min_fold_chars: usize::MAX,
            folded_wrap_chars: usize::MAX,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::{Value, json};

    /// Untyped values (a provider's `config`, the objects kubectl prints) read as serde_yaml read
    /// them; serde-saphyr's defaults (YAML 1.1 booleans, merge keys, ...) read each otherwise.
    #[test]
    fn untyped_values_read_as_before() {
        let cases = [
            // YAML 1.1 booleans are strings; the YAML 1.2 spellings are booleans.
            (
                "{a: yes, b: no, c: on, d: off, e: y, f: n, g: True, h: false}",
                json!({"a": "yes", "b": "no", "c": "on", "d": "off", "e": "y", "f": "n", "g": true, "h": false}),
            ),
            // Octal-looking and underscored numbers are strings; 0o, 0x and 0b are integers.
            (
                "{a: 0755, b: -007, c: 1_000, d: 0o17, e: 0x1F, f: 0X1F, g: 0b101, h: 012.5}",
                json!({"a": "0755", "b": "-007", "c": "1_000", "d": 15, "e": 31, "f": "0X1F", "g": 5, "h": 12.5}),
            ),
            // A repeated key: the last one.
            ("{a: 1, a: 2}", json!({"a": 2})),
            // Anchors and aliases are followed; `<<` is an ordinary key, not a merge.
            (
                "{x: &a {p: 1}, y: *a, z: {<<: *a, q: 2}}",
                json!({"x": {"p": 1}, "y": {"p": 1}, "z": {"<<": {"p": 1}, "q": 2}}),
            ),
            // Non-finite floats are floats (JSON has none: null).
            (
                "{a: .inf, b: -.inf, c: .nan}",
                json!({"a": null, "b": null, "c": null}),
            ),
            (
                "{a: !!binary aGVsbG8=, b: !!str 1}",
                json!({"a": "aGVsbG8=", "b": "1"}),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(from_str::<Value>(text).unwrap(), expected, "{text}");
            assert_ne!(
                serde_saphyr::from_str::<Value>(text).ok(),
                Some(expected),
                "{text}: the option is needed (serde-saphyr's default reads it otherwise)"
            );
        }
        // The same with serde-saphyr's defaults.
        let text = "{a: ~, b: null, c: , d: '', e: 2001-12-14, f: '12:30', g: 1e3}";
        let expected = json!({"a": null, "b": null, "c": null, "d": "", "e": "2001-12-14", "f": "12:30", "g": 1000.0});
        assert_eq!(from_str::<Value>(text).unwrap(), expected);
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Typed {
        name: String,
        #[serde(default)]
        flag: Option<bool>,
        #[serde(default)]
        count: Option<u32>,
        #[serde(default)]
        note: Option<String>,
        #[serde(default)]
        inner: Option<Box<Typed>>,
        #[serde(default)]
        side: Option<Side>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    enum Side {
        Left,
        Right,
    }

    fn typed(text: &str) -> Result<Typed, String> {
        from_str::<Typed>(text).map_err(|e| e.to_string())
    }

    /// Typed fields: the type is the schema, and a mistake names its field path.
    #[test]
    fn typed_fields_read_as_before_and_name_the_path() {
        let ok = |text: &str| typed(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(ok("{name: ~, note: ~}").name, "~");
        assert_eq!(ok("{name: ~, note: ~}").note, None);
        assert_eq!(ok("{name: 0755}").name, "0755");
        assert_eq!(ok("{name: yes, flag: true}").flag, Some(true));
        assert_eq!(ok("{name: a, count: 0o17}").count, Some(15));
        assert_eq!(ok("{name: !!binary aGVsbG8=}").name, "aGVsbG8=");
        for (text, expected) in [
            (
                "{name: a, flag: yes}",
                "flag: invalid boolean (true or false expected) at line 1, column 17",
            ),
            ("{name: a, flag: on}", "flag: invalid boolean"),
            (
                "{name: a, count: 0755}",
                "count: invalid u32 at line 1, column 18",
            ),
            ("{name: a, count: -1}", "count: invalid u32"),
            (
                "{name: a, inner: {name: b, name: c}}",
                "inner: duplicate field `name`",
            ),
            (
                "{name: a, inner: {name: b, <<: {flag: true}}}",
                "inner.<<: unknown field `<<`",
            ),
            (
                "{name: a, inner: {nme: b}}",
                "inner.nme: unknown field `nme`, expected one of `name`, `flag`, `count`",
            ),
            ("{name: a, inner: {}}", "inner: missing field `name`"),
            (
                "{name: a, side: Up}",
                "side: unknown variant `Up`, expected `Left` or `Right` at line 1, column 17",
            ),
            (
                "{name: a, inner: [1]}",
                "inner: expected mapping start at line 1, column 18",
            ),
            ("name: a\nnote: 'b\n", "unclosed quote at line 2, column 7"),
            (
                "name: a\n---\nname: b\n",
                "more than one YAML document (`---`) where one is read at line 3, column 1",
            ),
        ] {
            let message = typed(text).unwrap_err();
            assert!(
                message.contains(expected),
                "{text}: got {message}, expected {expected}"
            );
        }
    }

    /// What serde-saphyr reads where serde_yaml refused (no option restores the refusal; each
    /// is a value a user could only have meant this way).
    #[test]
    fn what_reads_where_serde_yaml_refused() {
        // An underscored integer into an integer field.
        assert_eq!(typed("{name: a, count: 1_000}").unwrap().count, Some(1000));
        // JSON's escaped surrogate pairs.
        assert_eq!(from_str::<String>(r#""\ud83d\ude00""#).unwrap(), "😀");
        // An application tag on an untyped value: the value.
        assert_eq!(from_str::<Value>("{a: !x b}").unwrap(), json!({"a": "b"}));
        // An integer past u64 in an untyped value: a float.
        assert_eq!(
            from_str::<Value>("a: 18446744073709551616").unwrap(),
            json!({"a": 18446744073709551616.0})
        );
    }

    /// No document, or an empty one: an error for a struct, `None` for an `Option`.
    #[test]
    fn an_empty_document() {
        for text in ["", "# only a comment\n", "---\n", "~"] {
            assert!(typed(text).is_err(), "{text:?}");
            assert_eq!(from_str::<Option<Typed>>(text).unwrap(), None, "{text:?}");
        }
    }

    /// The printer: one line per long string, `|` for line breaks, what YAML 1.1 would read as
    /// something else quoted; read back, the same value.
    #[test]
    fn printed_yaml_reads_back_the_same() {
        let value = json!({
            "long": "word ".repeat(40).trim_end(),
            "lines": "one\ntwo\n",
            "ambiguous": ["yes", "on", "0755", "1_000", "~", "", "12:30", "2001-12-14", "true"],
            "numbers": [1, -2, 1.5, 65535.0],
            "empty": {"list": [], "map": {}},
            "nothing": null,
        });
        let text = to_string(&value).unwrap();
        assert!(
            text.contains(&format!("long: {}\n", "word ".repeat(40).trim_end())),
            "{text}"
        );
        assert!(text.contains("lines: |\n"), "{text}");
        assert_eq!(from_str::<Value>(&text).unwrap(), value, "{text}");
        assert_eq!(
            serde_saphyr::from_str::<Value>(&text).unwrap(),
            value,
            "{text}"
        );
    }
}
