//! Tool-call ids. Injectable, so tests see fixed ids.
use rand::distr::{Alphanumeric, SampleString};

use super::format::ToolCallFormat;

/// Makes the id of each new call.
pub type IdGenerator = Box<dyn FnMut() -> String + Send>;

/// Random ids as the format's chat templates expect them back: OpenAI's style
/// (`call_` + 24 alphanumerics), except Mistral's, whose templates raise unless an id
/// is exactly 9 alphanumerics (as vLLM's Mistral parser makes them).
pub fn random_ids(format: ToolCallFormat) -> IdGenerator {
    match format {
        ToolCallFormat::Mistral | ToolCallFormat::MistralV11 => {
            Box::new(|| Alphanumeric.sample_string(&mut rand::rng(), 9))
        }
        ToolCallFormat::Hermes | ToolCallFormat::Llama3Json => {
            Box::new(|| format!("call_{}", Alphanumeric.sample_string(&mut rand::rng(), 24)))
        }
    }
}

/// `prefix0`, `prefix1`, ...: for tests.
pub fn sequential_ids(prefix: &str) -> IdGenerator {
    let prefix = prefix.to_owned();
    let mut next = 0usize;
    Box::new(move || {
        next += 1;
        format!("{prefix}{}", next - 1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_the_shape_templates_expect() {
        let id = random_ids(ToolCallFormat::Hermes)();
        assert_eq!(id.len(), 29);
        assert!(id.starts_with("call_"));
        assert!(id[5..].chars().all(|c| c.is_ascii_alphanumeric()));
        let mut mistral = random_ids(ToolCallFormat::Mistral);
        let (a, b) = (mistral(), mistral());
        assert_eq!(a.len(), 9);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, b);
        let mut seq = sequential_ids("id");
        assert_eq!((seq(), seq()), ("id0".into(), "id1".into()));
    }
}
