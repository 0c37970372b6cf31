//! The one rule per sampling field, the shard's too: both are tested against
//! `proto/sampling_rules.json` (here in `tests`, the shard in
//! tests/shard/test_sampling_rules.py). These are TGI's HTTP ranges; the OpenAI routes map
//! their own (`top_p` 1, `temperature` 0) to unset before these apply.

/// A set value must be finite in f32 and inside `low..high`, each end open unless marked
/// inclusive; `None` is unbounded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rule {
    pub low: Option<f64>,
    pub low_inclusive: bool,
    pub high: Option<f64>,
    pub high_inclusive: bool,
}

impl Rule {
    const fn new(
        low: Option<f64>,
        low_inclusive: bool,
        high: Option<f64>,
        high_inclusive: bool,
    ) -> Self {
        Self {
            low,
            low_inclusive,
            high,
            high_inclusive,
        }
    }

    pub fn allows(&self, value: f32) -> bool {
        if !value.is_finite() {
            return false;
        }
        let value = f64::from(value);
        let above = self.low.is_none_or(|low| {
            if self.low_inclusive {
                value >= low
            } else {
                value > low
            }
        });
        let below = self.high.is_none_or(|high| {
            if self.high_inclusive {
                value <= high
            } else {
                value < high
            }
        });
        above && below
    }
}

pub const TEMPERATURE: Rule = Rule::new(Some(0.0), false, None, false);
pub const TOP_P: Rule = Rule::new(Some(0.0), false, Some(1.0), false);
pub const TYPICAL_P: Rule = Rule::new(Some(0.0), false, Some(1.0), false);
pub const REPETITION_PENALTY: Rule = Rule::new(Some(0.0), false, None, false);
pub const FREQUENCY_PENALTY: Rule = Rule::new(Some(-2.0), true, Some(2.0), true);
pub const PRESENCE_PENALTY: Rule = Rule::new(Some(-2.0), true, Some(2.0), true);
pub const MIN_P: Rule = Rule::new(Some(0.0), true, Some(1.0), true);
pub const TOP_K: Rule = Rule::new(Some(1.0), true, None, false);

/// Every rule by its `SamplingParameters` field name; `optional` says the field is proto3
/// `optional` (unset is not 0).
pub const RULES: &[(&str, Rule, bool)] = &[
    ("temperature", TEMPERATURE, true),
    ("top_p", TOP_P, true),
    ("typical_p", TYPICAL_P, true),
    ("repetition_penalty", REPETITION_PENALTY, true),
    ("frequency_penalty", FREQUENCY_PENALTY, false),
    ("presence_penalty", PRESENCE_PENALTY, false),
    ("min_p", MIN_P, false),
    ("top_k", TOP_K, false),
];

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = include_str!("../../proto/sampling_rules.json");

    #[test]
    fn the_routers_rules_are_the_tables() {
        let table: serde_json::Value = serde_json::from_str(TABLE).unwrap();
        let fields = table["fields"].as_object().unwrap();
        assert_eq!(fields.len(), RULES.len());
        for &(name, rule, optional) in RULES {
            let row = &fields[name];
            let expected = Rule::new(
                row["low"].as_f64(),
                row["low_inclusive"].as_bool().unwrap(),
                row["high"].as_f64(),
                row["high_inclusive"].as_bool().unwrap(),
            );
            assert_eq!(rule, expected, "{name}");
            assert_eq!(optional, row["optional"].as_bool().unwrap(), "{name}");
        }
    }

    #[test]
    fn ends_are_open_unless_inclusive() {
        assert!(!TOP_P.allows(1.0) && TOP_P.allows(0.999) && !TOP_P.allows(0.0));
        assert!(MIN_P.allows(1.0) && MIN_P.allows(0.0) && !MIN_P.allows(1.01));
        assert!(!TEMPERATURE.allows(f32::INFINITY) && !FREQUENCY_PENALTY.allows(f32::NAN));
    }
}
