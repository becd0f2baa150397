//! A provider instance's `limits` in the providers config: the platform's budget for it, as a
//! number of Proxies at most and a spend per hour at most (at a price per instance-hour the
//! platform states). Parsed and checked here; the controllers hold creates to the cap
//! (`crate::lifecycle::caps`, docs/pools.md "Caps per provider instance").

use serde::Deserialize;

/// `providers[i].limits`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Limits {
    /// Proxies of this instance at most, in every namespace.
    #[serde(default)]
    pub max_proxies: Option<i64>,
    /// What one instance costs per hour, in the platform's currency (for the spend bound and
    /// the cost figures).
    #[serde(default)]
    pub price_per_hour: Option<f64>,
    /// Spend per hour at most: `floor(maxSpendPerHour / pricePerHour)` Proxies. Needs
    /// `pricePerHour`.
    #[serde(default)]
    pub max_spend_per_hour: Option<f64>,
}

/// The number of Proxies a provider instance may have, and which figure of its limits says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyCap {
    pub proxies: usize,
    /// What the cap comes from, for messages: `limits.maxProxies`, or the spend and the price.
    pub source: String,
}

/// Spend divided by price is floored; this much below a whole number still counts as it
/// (`0.3 / 0.1` is `2.9999999999999996` in floating point, and means 3).
const ROUNDING: f64 = 1e-9;

impl Limits {
    /// Checks the section; the error starts with the field (`limits.<field>`), for the caller to
    /// put the entry's path before.
    pub fn validate(&self) -> Result<(), String> {
        let amount = |field: &str, value: Option<f64>| match value {
            Some(v) if !v.is_finite() || v < 0.0 => Err(format!(
                "limits.{field}: {v} is not an amount; give 0 or more, e.g. 0.012"
            )),
            _ => Ok(()),
        };
        if let Some(n) = self.max_proxies.filter(|n| *n < 0) {
            return Err(format!(
                "limits.maxProxies: {n} is below 0; give the most Proxies of this instance, e.g. 20 (0 stops new ones)"
            ));
        }
        amount("pricePerHour", self.price_per_hour)?;
        amount("maxSpendPerHour", self.max_spend_per_hour)?;
        match (self.max_spend_per_hour, self.price_per_hour) {
            (Some(_), None) => Err(
                "limits.maxSpendPerHour: needs limits.pricePerHour (what one instance costs per hour) to become a number of Proxies; add pricePerHour, or use maxProxies alone"
                    .into(),
            ),
            (Some(_), Some(price)) if price <= 0.0 => Err(
                "limits.pricePerHour: 0 makes maxSpendPerHour no bound at all; give the price of one instance-hour, or remove maxSpendPerHour"
                    .into(),
            ),
            _ => Ok(()),
        }
    }

    /// The effective cap: the smaller of `maxProxies` and `floor(maxSpendPerHour /
    /// pricePerHour)`; `None` when neither is set (a price alone is for the cost figures).
    pub fn cap(&self) -> Option<ProxyCap> {
        let by_count = self.max_proxies.map(|n| ProxyCap {
            proxies: n.max(0) as usize,
            source: "limits.maxProxies".into(),
        });
        let by_spend = match (self.max_spend_per_hour, self.price_per_hour) {
            (Some(spend), Some(price)) if price > 0.0 => Some(ProxyCap {
                proxies: (spend / price + ROUNDING).floor().min(u32::MAX as f64) as usize,
                source: format!("limits.maxSpendPerHour {spend} at pricePerHour {price}"),
            }),
            _ => None,
        };
        match (by_count, by_spend) {
            (Some(count), Some(spend)) if spend.proxies < count.proxies => Some(spend),
            (Some(count), _) => Some(count),
            (None, spend) => spend,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn limits(max: Option<i64>, price: Option<f64>, spend: Option<f64>) -> Limits {
        Limits {
            max_proxies: max,
            price_per_hour: price,
            max_spend_per_hour: spend,
        }
    }

    #[rstest]
    #[case::nothing(limits(None, None, None), None)]
    #[case::price_alone(limits(None, Some(0.012), None), None)]
    #[case::count(limits(Some(20), None, None), Some((20, "limits.maxProxies")))]
    #[case::zero_freezes(limits(Some(0), None, None), Some((0, "limits.maxProxies")))]
    #[case::spend(
        limits(None, Some(0.012), Some(0.20)),
        Some((16, "limits.maxSpendPerHour 0.2 at pricePerHour 0.012"))
    )]
    #[case::spend_exact_in_decimal(limits(None, Some(0.1), Some(0.3)), Some((3, "limits.maxSpendPerHour 0.3 at pricePerHour 0.1")))]
    #[case::count_is_smaller(limits(Some(10), Some(0.012), Some(0.20)), Some((10, "limits.maxProxies")))]
    #[case::spend_is_smaller(limits(Some(20), Some(0.012), Some(0.20)), Some((16, "limits.maxSpendPerHour 0.2 at pricePerHour 0.012")))]
    #[case::equal_says_count(limits(Some(16), Some(0.012), Some(0.20)), Some((16, "limits.maxProxies")))]
    fn the_cap_is_the_smaller_bound(#[case] limits: Limits, #[case] want: Option<(usize, &str)>) {
        let cap = limits.cap();
        assert_eq!(
            cap.as_ref().map(|c| (c.proxies, c.source.as_str())),
            want,
            "{limits:?}"
        );
    }
}
