//! Bounds on what a plugin hands back, applied where every answer enters the host (after the
//! bindings of any WIT version converted it, before anything else sees it): a plugin is code
//! written by somebody else, so its retry hints, messages and list sizes are not trusted.

use std::time::Duration;

use super::call::Output;
use super::types::{CheckTarget, Instance, ProviderError};

/// The shortest retry a provider may ask for: a hint of 0 would make a hot loop.
pub const MIN_RETRY_AFTER: Duration = Duration::from_secs(1);
/// The longest: beyond it the hint is surely a bug (and a huge one overflowed the scheduler).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);
/// Longest message (error, instance, check) kept, in bytes; the rest is cut before it reaches a
/// status, an event or a log line.
pub const MAX_MESSAGE_BYTES: usize = 2048;
/// Longest identifier or name (provider id, instance name, address, zone, check target or
/// reason) accepted; a longer one makes the answer invalid.
pub const MAX_ID_BYTES: usize = 512;
/// Most instances one `list` may return.
pub const MAX_LIST_INSTANCES: usize = 10_000;
/// Most targets one `check` may return.
pub const MAX_CHECK_TARGETS: usize = 256;

/// `text` cut to [`MAX_MESSAGE_BYTES`] on a character boundary, saying that it was.
pub fn cut(mut text: String) -> String {
    if text.len() <= MAX_MESSAGE_BYTES {
        return text;
    }
    let total = text.len();
    let mut at = MAX_MESSAGE_BYTES;
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    text.truncate(at);
    text.push_str(&format!("… ({total} bytes, cut)"));
    text
}

/// A provider's retry hint within [`MIN_RETRY_AFTER`]…[`MAX_RETRY_AFTER`].
pub fn retry_after(hint: Duration) -> Duration {
    hint.clamp(MIN_RETRY_AFTER, MAX_RETRY_AFTER)
}

/// A provider error with its message cut and its retry hint clamped.
pub fn error(error: ProviderError) -> ProviderError {
    match error {
        ProviderError::Transient {
            message,
            retry_after: hint,
        } => ProviderError::Transient {
            message: cut(message),
            retry_after: hint.map(retry_after),
        },
        ProviderError::NotFound(m) => ProviderError::NotFound(cut(m)),
        ProviderError::Permanent(m) => ProviderError::Permanent(cut(m)),
        ProviderError::InvalidConfig(m) => ProviderError::InvalidConfig(cut(m)),
        ProviderError::Unauthorized(m) => ProviderError::Unauthorized(cut(m)),
        ProviderError::Quota(m) => ProviderError::Quota(cut(m)),
        ProviderError::Denied(m) => ProviderError::Denied(cut(m)),
    }
}

/// Why an answer is refused as a whole.
fn invalid(function: &str, what: String) -> ProviderError {
    ProviderError::Permanent(format!(
        "the plugin's `{function}` answer was refused by the host: {what}"
    ))
}

/// An identifier goes into statuses, events, log lines and metric labels: at most
/// [`MAX_ID_BYTES`], and no control characters (a newline would forge a log line).
fn check_id(function: &str, field: &str, value: &str) -> Result<(), ProviderError> {
    if value.len() > MAX_ID_BYTES {
        return Err(invalid(
            function,
            format!("{field} is {} bytes; at most {MAX_ID_BYTES}", value.len()),
        ));
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(invalid(
            function,
            format!("{field} holds the control character {c:?}; identifiers are printable text"),
        ));
    }
    Ok(())
}

fn instance(function: &str, mut instance: Instance) -> Result<Instance, ProviderError> {
    // The id is what the operator records and later hands back to `get` and `delete`.
    if instance.provider_id.is_empty() {
        return Err(invalid(function, "provider-id is empty".into()));
    }
    check_id(function, "provider-id", &instance.provider_id)?;
    check_id(function, "name", &instance.name)?;
    for (field, value) in [("address", &instance.address), ("zone", &instance.zone)] {
        if let Some(value) = value {
            check_id(function, field, value)?;
        }
    }
    instance.message = instance.message.map(cut);
    Ok(instance)
}

fn check_target(mut target: CheckTarget) -> Result<CheckTarget, ProviderError> {
    check_id("check", "target", &target.target)?;
    check_id("check", "reason", &target.reason)?;
    target.message = cut(target.message);
    Ok(target)
}

/// The answer of `function`, bounded: messages cut, retry hints clamped, lists capped, and an
/// answer with an oversized identifier refused.
pub(crate) fn answer(
    function: &str,
    answer: Result<Output, ProviderError>,
) -> Result<Output, ProviderError> {
    match answer {
        Err(e) => Err(error(e)),
        Ok(Output::Instance(i)) => instance(function, i).map(Output::Instance),
        Ok(Output::Instances(list)) if list.len() > MAX_LIST_INSTANCES => Err(invalid(
            function,
            format!(
                "{} instances; at most {MAX_LIST_INSTANCES} in one answer",
                list.len()
            ),
        )),
        Ok(Output::Instances(list)) => list
            .into_iter()
            .map(|i| instance(function, i))
            .collect::<Result<_, _>>()
            .map(Output::Instances),
        Ok(Output::Checks(targets)) if targets.len() > MAX_CHECK_TARGETS => Err(invalid(
            function,
            format!(
                "{} check targets; at most {MAX_CHECK_TARGETS}",
                targets.len()
            ),
        )),
        Ok(Output::Checks(targets)) => targets
            .into_iter()
            .map(check_target)
            .collect::<Result<_, _>>()
            .map(Output::Checks),
        Ok(other) => Ok(other),
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    #[rstest]
    #[case::zero_is_a_second(0, 1_000)]
    #[case::in_range_is_kept(2_500, 2_500)]
    #[case::huge_is_an_hour(u64::MAX, 3_600_000)]
    fn retry_hints_are_clamped(#[case] hint_ms: u64, #[case] expected_ms: u128) {
        assert_eq!(
            retry_after(Duration::from_millis(hint_ms)).as_millis(),
            expected_ms
        );
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        assert_eq!(cut("short".into()), "short");
        let long = "é".repeat(MAX_MESSAGE_BYTES);
        let cut = cut(long);
        assert!(cut.len() <= MAX_MESSAGE_BYTES + 32, "{}", cut.len());
        assert!(cut.ends_with(&format!("… ({} bytes, cut)", 2 * MAX_MESSAGE_BYTES)));
    }

    #[test]
    fn oversized_lists_and_ids_are_refused() {
        let one = |id: String| Instance {
            provider_id: id,
            name: "n".into(),
            state: crate::provider::plugins::types::InstanceState::Running,
            address: None,
            port: 1,
            zone: None,
            created_at: None,
            owner: None,
            message: Some("m".repeat(10 * MAX_MESSAGE_BYTES)),
        };
        let many = (0..=MAX_LIST_INSTANCES)
            .map(|i| one(i.to_string()))
            .collect();
        let refused = answer("list", Ok(Output::Instances(many))).err().unwrap();
        assert!(refused.to_string().contains("10001 instances"), "{refused}");
        let refused = answer(
            "get",
            Ok(Output::Instance(one("x".repeat(MAX_ID_BYTES + 1)))),
        );
        assert!(
            refused
                .err()
                .unwrap()
                .to_string()
                .contains("provider-id is 513 bytes")
        );
        for (id, says) in [
            ("", "provider-id is empty"),
            ("vm\nERROR forged", "control character '\\n'"),
        ] {
            let refused = answer("get", Ok(Output::Instance(one(id.into()))));
            let message = refused.err().unwrap().to_string();
            assert!(message.contains(says), "{message}");
        }
        let Ok(Output::Instance(kept)) = answer("get", Ok(Output::Instance(one("ok".into()))))
        else {
            panic!()
        };
        assert!(kept.message.unwrap().len() < 2 * MAX_MESSAGE_BYTES);
    }
}
