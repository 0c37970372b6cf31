//! An incremental scanner that finds where one JSON value ends in a stream of
//! characters and drops the whitespace between its tokens (whitespace inside strings is
//! kept). It checks only the nesting, not the full JSON grammar: the call's grammar does
//! that while generating; `parse.rs` reports whether the result is valid JSON.

/// Deeper nesting than this is an error (hostile unconstrained output).
pub const MAX_DEPTH: usize = 512;

/// What to do with the character just fed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Part of the value: keep it.
    Keep,
    /// Whitespace between tokens: part of the value, but dropped.
    Drop,
    /// Part of the value, and the value is complete.
    Done,
    /// Not part of the value: the value ended before this character (a bare scalar).
    End,
    /// Cannot be part of a JSON value here.
    Error,
}

#[derive(Debug, Clone, Default)]
pub struct ValueScanner {
    stack: Vec<char>,
    started: bool,
    scalar: bool,
    in_string: bool,
    escape: bool,
}

fn is_scalar_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '+' | '.')
}

impl ValueScanner {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the value is a bare scalar (a number, `true`, ...) that ends only at the
    /// next character or at the end of the text.
    pub fn in_scalar(&self) -> bool {
        self.scalar
    }

    pub fn feed(&mut self, c: char) -> Step {
        if !self.started {
            self.started = true;
            return match c {
                '{' => {
                    self.stack.push('}');
                    Step::Keep
                }
                '[' => {
                    self.stack.push(']');
                    Step::Keep
                }
                '"' => {
                    self.in_string = true;
                    Step::Keep
                }
                c if is_scalar_char(c) => {
                    self.scalar = true;
                    Step::Keep
                }
                _ => {
                    self.started = false;
                    Step::Error
                }
            };
        }
        if self.scalar {
            return if is_scalar_char(c) {
                Step::Keep
            } else {
                Step::End
            };
        }
        if self.in_string {
            if self.escape {
                self.escape = false;
            } else if c == '\\' {
                self.escape = true;
            } else if c == '"' {
                self.in_string = false;
                if self.stack.is_empty() {
                    return Step::Done;
                }
            }
            return Step::Keep;
        }
        match c {
            ' ' | '\t' | '\n' | '\r' => Step::Drop,
            '"' => {
                self.in_string = true;
                Step::Keep
            }
            '{' | '[' => {
                if self.stack.len() >= MAX_DEPTH {
                    return Step::Error;
                }
                self.stack.push(if c == '{' { '}' } else { ']' });
                Step::Keep
            }
            '}' | ']' => {
                if self.stack.pop() != Some(c) {
                    return Step::Error;
                }
                if self.stack.is_empty() {
                    Step::Done
                } else {
                    Step::Keep
                }
            }
            _ => Step::Keep,
        }
    }
}

/// `text` with the whitespace between JSON tokens removed, when it is one JSON value.
pub fn minify(text: &str) -> Option<String> {
    let mut scanner = ValueScanner::new();
    let mut out = String::with_capacity(text.len());
    let mut done = false;
    for c in text.trim().chars() {
        if done {
            return None;
        }
        match scanner.feed(c) {
            Step::Keep => out.push(c),
            Step::Drop => {}
            Step::Done => {
                out.push(c);
                done = true;
            }
            Step::End | Step::Error => return None,
        }
    }
    (done || scanner.in_scalar()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minifies_outside_strings_only() {
        assert_eq!(
            minify("{ \"a b\" : [1, 2 ,\n 3], \"c\": {\"d\": \"x } \\\" y\"} }").as_deref(),
            Some("{\"a b\":[1,2,3],\"c\":{\"d\":\"x } \\\" y\"}}")
        );
        assert_eq!(minify(" 12.5e3 ").as_deref(), Some("12.5e3"));
        assert_eq!(minify("\"s\"").as_deref(), Some("\"s\""));
        assert_eq!(minify("{\"a\": 1"), None);
        assert_eq!(minify("{]"), None);
        assert_eq!(minify("{} x"), None);
        assert_eq!(minify(":"), None);
    }

    #[test]
    fn finds_the_end_of_a_value() {
        let mut s = ValueScanner::new();
        let steps: Vec<Step> = "{\"a\": [1]}".chars().map(|c| s.feed(c)).collect();
        assert_eq!(*steps.last().unwrap(), Step::Done);
        assert_eq!(steps[5], Step::Drop);
        let mut n = ValueScanner::new();
        assert_eq!(n.feed('4'), Step::Keep);
        assert_eq!(n.feed('2'), Step::Keep);
        assert_eq!(n.feed('}'), Step::End);
    }

    #[test]
    fn hostile_nesting_is_an_error_not_a_crash() {
        let mut s = ValueScanner::new();
        let mut last = Step::Keep;
        for _ in 0..100_000 {
            last = s.feed('[');
            if last == Step::Error {
                break;
            }
        }
        assert_eq!(last, Step::Error);
    }
}
