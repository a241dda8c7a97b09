//! Values with `*` in them, as envoyproxy/ratelimit matches descriptor
//! values (and the quota service matches bucket values): each `*` stands
//! for any run of characters.

/// A value with `*` in it, each `*` standing for any run of characters
/// (none included), as upstream matches: `files*` is a prefix, `a*b*c`
/// starts with `a`, ends with `c` and has `b` between.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wildcard {
    /// As written, `*` included.
    pub pattern: String,
    /// The pattern split at each `*`.
    parts: Vec<String>,
}

impl Wildcard {
    /// `None` when `pattern` has no `*`.
    pub fn new(pattern: &str) -> Option<Self> {
        pattern.contains('*').then(|| Self {
            pattern: pattern.to_owned(),
            parts: pattern.split('*').map(str::to_owned).collect(),
        })
    }

    /// Whether `value` matches the pattern (`*` matches any run of characters).
    pub fn matches(&self, value: &str) -> bool {
        let (first, rest) = match self.parts.split_first() {
            Some(split) => split,
            None => return false,
        };
        let Some((last, middle)) = rest.split_last() else {
            return value == first;
        };
        if value.len() < self.parts.iter().map(String::len).sum::<usize>() {
            return false;
        }
        let Some(mut remaining) = value
            .strip_prefix(first.as_str())
            .and_then(|after| after.strip_suffix(last.as_str()))
        else {
            return false;
        };
        // Each middle part in order, as early as it appears.
        for part in middle {
            let Some(at) = remaining.find(part.as_str()) else {
                return false;
            };
            remaining = &remaining[at + part.len()..];
        }
        true
    }

    /// The characters of the pattern besides `*`: how specific it is.
    pub fn literal_len(&self) -> usize {
        self.pattern.len() - self.pattern.matches('*').count()
    }
}

#[cfg(test)]
mod tests {
    use super::Wildcard;

    #[test]
    fn wildcards_match_as_upstreams() {
        let matches = |pattern: &str, value: &str| Wildcard::new(pattern).unwrap().matches(value);
        assert!(matches("files*", "files/a.pdf"));
        assert!(matches("files*", "files"));
        assert!(!matches("files*", "file"));
        assert!(matches("bar*baz*qux", "bar1baz2qux"));
        assert!(matches("bar*baz*qux", "barbazqux"));
        assert!(!matches("bar*baz*qux", "bar1qux"));
        assert!(
            !matches("ab*ba", "aba"),
            "prefix and suffix may not overlap"
        );
        assert!(matches("*.pdf", "report.pdf"));
        assert!(matches("*", ""));
        assert!(Wildcard::new("plain").is_none());
        assert_eq!(Wildcard::new("a*b*").unwrap().literal_len(), 2);
    }
}
