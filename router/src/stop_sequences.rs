//! Stop sequences matched on decoded text, so a match may span any number of tokens.

/// Accumulates a sequence's decoded text and reports the first stop sequence it contains.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    text: String,
}

/// Where a stop sequence matched: the text up to `end` (bytes) ends with `sequence`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopMatch {
    pub sequence: String,
    pub end: usize,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            text: String::new(),
        }
    }

    /// Everything pushed so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Appends a decoded piece; returns the earliest-ending match that the piece completed.
    pub fn push(&mut self, piece: &str) -> Option<StopMatch> {
        let before = self.text.len();
        self.text.push_str(piece);
        if piece.is_empty() {
            return None;
        }
        self.stops
            .iter()
            .filter_map(|stop| {
                // Only a match ending inside the new piece is new; start the search early
                // enough to catch one that began in earlier pieces.
                let mut from = before.saturating_sub(stop.len().saturating_sub(1));
                while !self.text.is_char_boundary(from) {
                    from -= 1;
                }
                self.text[from..].find(stop.as_str()).map(|at| StopMatch {
                    sequence: stop.clone(),
                    end: from + at + stop.len(),
                })
            })
            .min_by_key(|found| found.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(stops: &[&str], pieces: &[&str]) -> Option<(usize, StopMatch, String)> {
        let mut matcher = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        for (index, piece) in pieces.iter().enumerate() {
            if let Some(found) = matcher.push(piece) {
                return Some((index, found, matcher.text().to_owned()));
            }
        }
        None
    }

    #[test]
    fn matches_across_token_boundaries() {
        let (index, found, text) =
            feed(&["world!"], &["hel", "lo wo", "r", "ld", "!!", "x"]).unwrap();
        assert_eq!(index, 4);
        assert_eq!(&text[..found.end], "hello world!");
        assert_eq!(found.sequence, "world!");
    }

    #[test]
    fn cut_point_can_fall_inside_a_piece() {
        let (_, found, text) = feed(&["\n\n"], &["a\n", "\nmore text"]).unwrap();
        assert_eq!(&text[..found.end], "a\n\n");
    }

    #[test]
    fn earliest_match_wins() {
        let (_, found, _) = feed(&["cd", "bc"], &["a", "bcd"]).unwrap();
        assert_eq!(found.sequence, "bc");
    }

    #[test]
    fn no_match_no_stop() {
        assert!(feed(&["stop"], &["s", "t", "o", "p?"]).is_some());
        assert!(feed(&["stop"], &["s", "t", "0", "p"]).is_none());
        assert!(feed(&[], &["anything"]).is_none());
    }

    #[test]
    fn multibyte_text_before_the_stop_is_handled() {
        let (_, found, text) = feed(&["é!"], &["日本", "é", "!"]).unwrap();
        assert_eq!(&text[..found.end], "日本é!");
    }

    #[test]
    fn old_matches_are_not_reported_again() {
        let mut matcher = StopMatcher::new(vec!["ab".into()]);
        assert!(matcher.push("ab").is_some());
        assert!(matcher.push("c").is_none());
    }

    proptest::proptest! {
        /// However the text is split into pieces, the match ends where the stop sequence
        /// first ends in the whole text.
        #[test]
        fn any_split_finds_the_first_occurrence(
            text in "[abé ]{0,30}",
            stop in "[abé]{1,3}",
            cuts in proptest::collection::vec(0usize..40, 0..8),
        ) {
            let chars: Vec<char> = text.chars().collect();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(chars.len())).collect();
            cuts.sort_unstable();
            cuts.dedup();
            let mut pieces = Vec::new();
            let mut start = 0;
            for cut in cuts.into_iter().chain([chars.len()]) {
                pieces.push(chars[start..cut.max(start)].iter().collect::<String>());
                start = cut.max(start);
            }
            let mut matcher = StopMatcher::new(vec![stop.clone()]);
            let found = pieces.iter().find_map(|piece| matcher.push(piece));
            let expected = text.find(&stop).map(|at| at + stop.len());
            proptest::prop_assert_eq!(found.map(|f| f.end), expected);
        }
    }
}
