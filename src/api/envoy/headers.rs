//! The IETF rate-limit header fields, `RateLimit-Policy` and `RateLimit`, as
//! draft-ietf-httpapi-ratelimit-headers-11 defines them (structured-field
//! lists of a policy id with parameters), for Envoy to add to responses.

/// What the headers describe: the most restrictive descriptor's limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Quota<'a> {
    /// The rule's `RateLimit-Policy` id.
    pub policy_id: &'a str,
    /// `q`: units per window.
    pub quota: u64,
    /// `w`: the window in seconds.
    pub window_seconds: u64,
    /// `r`: units left.
    pub remaining: u64,
    /// `t`: seconds until units come back.
    pub reset_seconds: u64,
}

/// `(name, value)` of the two header fields.
pub(crate) fn header_fields(quota: &Quota<'_>) -> [(&'static str, String); 2] {
    let id = sf_string(quota.policy_id);
    [
        (
            "RateLimit-Policy",
            format!("{id};q={};w={}", quota.quota, quota.window_seconds),
        ),
        (
            "RateLimit",
            format!("{id};r={};t={}", quota.remaining, quota.reset_seconds),
        ),
    ]
}

/// A structured-field String: quoted, with `"` and `\` escaped, and any
/// character outside printable ASCII (which the type cannot hold) as `_`.
pub(crate) fn sf_string(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                quoted.push('\\');
                quoted.push(c);
            }
            ' '..='~' => quoted.push(c),
            _ => quoted.push('_'),
        }
    }
    quoted.push('"');
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_follow_the_draft_syntax() {
        let [policy, current] = header_fields(&Quota {
            policy_id: "per-user",
            quota: 100,
            window_seconds: 60,
            remaining: 42,
            reset_seconds: 17,
        });
        assert_eq!(
            policy,
            ("RateLimit-Policy", r#""per-user";q=100;w=60"#.to_owned())
        );
        assert_eq!(current, ("RateLimit", r#""per-user";r=42;t=17"#.to_owned()));
    }

    #[test]
    fn ids_are_valid_structured_field_strings() {
        assert_eq!(sf_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(sf_string("ключ\n"), r#""_____""#);
    }
}
