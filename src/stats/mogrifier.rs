//! DogStatsD mogrifiers, as envoyproxy/ratelimit's godogstats sink applies
//! them: the first whose pattern (a regular expression, unanchored) matches
//! a statistic's name renames it by a template and adds tags, `$0`, `$1`,
//! ... in either standing for the pattern's groups.
//!
//! Written `pattern=<regex>;name=<template>[;tags=<key>:<value>,...]`.

use std::fmt;
use std::str::FromStr;
use std::sync::LazyLock;

use regex::Regex;

/// `$0`, `$1`, ...: a group of the pattern.
static REFERENCE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\$\d+").expect("a valid pattern"));

/// One mogrifier.
#[derive(Clone)]
pub struct Mogrifier {
    pattern: Regex,
    name: String,
    tags: Vec<(String, String)>,
}

impl fmt::Debug for Mogrifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for Mogrifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pattern={};name={}", self.pattern.as_str(), self.name)?;
        if !self.tags.is_empty() {
            let tags: Vec<String> = self.tags.iter().map(|(k, v)| format!("{k}:{v}")).collect();
            write!(f, ";tags={}", tags.join(","))?;
        }
        Ok(())
    }
}

impl PartialEq for Mogrifier {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

impl FromStr for Mogrifier {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let rest = text
            .strip_prefix("pattern=")
            .ok_or("must start with pattern=")?;
        let (pattern, rest) = rest
            .split_once(";name=")
            .ok_or("must have ;name= after the pattern")?;
        let (name, tags) = match rest.split_once(";tags=") {
            Some((name, tags)) => (name, tags),
            None => (rest, ""),
        };
        if pattern.is_empty() {
            return Err("the pattern is empty".into());
        }
        if name.is_empty() {
            return Err("the name is empty".into());
        }
        let pattern = Regex::new(pattern).map_err(|err| format!("the pattern: {err}"))?;
        let tags = tags
            .split(',')
            .filter(|pair| !pair.is_empty())
            .map(|pair| match pair.split_once(':') {
                Some((key, value)) if !key.is_empty() && !value.is_empty() => {
                    Ok((key.to_owned(), value.to_owned()))
                }
                _ => Err(format!("tag {pair:?} is not key:value")),
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            pattern,
            name: name.to_owned(),
            tags,
        })
    }
}

/// `name` through the first mogrifier that matches it: the new name and
/// the tags (`key:value`) it adds; unchanged, with none, when none does.
pub(crate) fn mogrify(mogrifiers: &[Mogrifier], name: &str) -> (String, Vec<String>) {
    for mogrifier in mogrifiers {
        let Some(groups) = mogrifier.pattern.captures(name) else {
            continue;
        };
        let fill = |template: &str| {
            REFERENCE
                .replace_all(template, |found: &regex::Captures<'_>| {
                    match found[0][1..].parse::<usize>() {
                        Ok(i) if i < groups.len() => {
                            groups.get(i).map_or("", |g| g.as_str()).to_owned()
                        }
                        _ => found[0].to_owned(),
                    }
                })
                .into_owned()
        };
        let tags = mogrifier
            .tags
            .iter()
            .map(|(key, value)| format!("{key}:{}", fill(value)))
            .collect();
        return (fill(&mogrifier.name), tags);
    }
    (name.to_owned(), Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_match_renames_and_tags() {
        let rules: Vec<Mogrifier> = [
            r"pattern=^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$;name=ratelimit.service.rate_limit.$3;tags=domain:$1,descriptor:$2,odd:$9",
            "pattern=.*;name=all",
        ]
        .iter()
        .map(|text| text.parse().unwrap())
        .collect();
        let (name, tags) = mogrify(&rules, "ratelimit.service.rate_limit.d.k_v.total_hits");
        assert_eq!(name, "ratelimit.service.rate_limit.total_hits");
        assert_eq!(tags, ["domain:d", "descriptor:k_v", "odd:$9"]);
        assert_eq!(mogrify(&rules, "other").0, "all");
        assert_eq!(mogrify(&[], "other"), ("other".to_owned(), Vec::new()));
        assert!("name=x".parse::<Mogrifier>().is_err());
        assert!("pattern=(;name=x".parse::<Mogrifier>().is_err());
        assert!(
            "pattern=a;name=x;tags=nocolon"
                .parse::<Mogrifier>()
                .is_err()
        );
    }
}
