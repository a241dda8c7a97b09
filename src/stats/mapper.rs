//! statsd_exporter's mapping language (its `mapper` package, as
//! envoyproxy/ratelimit embeds it for `USE_PROMETHEUS`), applied to the
//! statsd name of each statistic to give its Prometheus name and labels.
//!
//! As statsd_exporter reads a mapping file: `mappings` in order, each with
//! a `match` that is a glob (the default; dot-separated segments, each
//! literal or `*`, a `*` capturing one whole segment) or, with
//! `match_type: regex`, an unanchored regular expression; `name` and
//! `labels` may use the captures (`$1`, `${1}`); `match_metric_type`
//! (`counter`, `gauge`, `observer`/`timer`) narrows a mapping to one type;
//! `action: drop` drops what it matches. Globs are tried before regular
//! expressions, as statsd_exporter does, and the first match of each wins.
//! A name no mapping matches keeps its statsd name, escaped (every
//! character but `[a-zA-Z0-9_]` becomes `_`, a leading digit gains a `_`).
//! Timers are observed into a histogram (`observer_type: histogram`, or
//! the older `timer_type`) or a summary, times `scale` when given.
//!
//! Accepted and not applied: `ttl` (series stay), `honor_labels` (statistics
//! carry no labels of their own), `summary_options` and `quantiles` (every
//! summary has statsd_exporter's default quantiles), `glob_disable_ordering`.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use regex::Regex;
use serde::Deserialize;

/// statsd_exporter's checks and its glob template's references.
static LABEL_NAME: LazyLock<Regex> =
    LazyLock::new(|| Regex::new("^[a-zA-Z_][a-zA-Z0-9_]+$").expect("a valid pattern"));
static METRIC_NAME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^([a-zA-Z_]|\$\{?\d+\}?)([a-zA-Z0-9_]|\$\{?\d+\}?)*$").expect("a valid pattern")
});
static GLOB_LINE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(\*|[a-zA-Z_][a-zA-Z0-9_\-]*)(\.\*|\.[a-zA-Z0-9_][a-zA-Z0-9_\-]*)*$")
        .expect("a valid pattern")
});
static REFERENCE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\$\{?([a-zA-Z0-9_$]+)\}?").expect("a valid pattern"));

/// Prometheus's default histogram buckets (client_golang's `DefBuckets`),
/// statsd_exporter's default too.
pub const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// What a statistic is, as statsd types it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatKind {
    /// `|c`: counted up.
    Counter,
    /// `|g`: a value now.
    Gauge,
    /// `|ms`: one observation each (statsd_exporter's "observer").
    Timer,
}

/// A mapping file, compiled.
#[derive(Debug)]
pub struct Mapping {
    rules: Vec<Rule>,
}

/// Where a statistic goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Mapped {
    /// `action: drop`: nowhere.
    Drop,
    /// A Prometheus series.
    Series(Series),
}

/// A statistic's Prometheus series.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// The metric's name, escaped.
    pub name: String,
    /// Its labels, in the mapping's order.
    pub labels: Vec<(String, String)>,
    /// Each value is multiplied by this.
    pub scale: Option<f64>,
    /// A timer's observations go to a histogram with these buckets;
    /// `None`: a summary.
    pub buckets: Option<Vec<f64>>,
    /// The mapping's `help`.
    pub help: Option<String>,
}

/// A mapping file that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct MappingError(String);

#[derive(Debug)]
struct Rule {
    matcher: Matcher,
    kind: Option<StatKind>,
    drop: bool,
    name: String,
    labels: BTreeMap<String, String>,
    scale: Option<f64>,
    buckets: Option<Vec<f64>>,
    help: Option<String>,
}

#[derive(Debug)]
enum Matcher {
    /// Per segment: the literal, or `None` for `*`.
    Glob(Vec<Option<String>>),
    Regex(Regex),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    #[serde(default)]
    defaults: DefaultsSpec,
    #[serde(default)]
    mappings: Vec<MappingSpec>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DefaultsSpec {
    observer_type: Option<String>,
    timer_type: Option<String>,
    buckets: Option<Vec<f64>>,
    #[allow(dead_code)]
    quantiles: Option<serde_json::Value>,
    match_type: Option<String>,
    #[allow(dead_code)]
    glob_disable_ordering: Option<bool>,
    #[allow(dead_code)]
    ttl: Option<serde_json::Value>,
    #[allow(dead_code)]
    summary_options: Option<serde_json::Value>,
    histogram_options: Option<HistogramSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MappingSpec {
    #[serde(rename = "match")]
    matches: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[allow(dead_code)]
    honor_labels: Option<bool>,
    observer_type: Option<String>,
    timer_type: Option<String>,
    buckets: Option<Vec<f64>>,
    #[allow(dead_code)]
    quantiles: Option<serde_json::Value>,
    match_type: Option<String>,
    help: Option<String>,
    action: Option<String>,
    match_metric_type: Option<String>,
    #[allow(dead_code)]
    ttl: Option<serde_json::Value>,
    #[allow(dead_code)]
    summary_options: Option<serde_json::Value>,
    histogram_options: Option<HistogramSpec>,
    scale: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HistogramSpec {
    buckets: Option<Vec<f64>>,
    #[allow(dead_code)]
    native_histogram_bucket_factor: Option<f64>,
    #[allow(dead_code)]
    native_histogram_max_buckets: Option<u32>,
}

impl Mapping {
    /// A mapping file's text, compiled; the error says which mapping is
    /// wrong and why, in statsd_exporter's terms.
    pub fn parse(text: &str) -> Result<Self, MappingError> {
        let spec: Option<FileSpec> = serde_saphyr::from_str(text)
            .map_err(|err| MappingError(format!("not a statsd_exporter mapping: {err}")))?;
        let Some(spec) = spec else {
            return Ok(Self { rules: Vec::new() });
        };
        let defaults = &spec.defaults;
        let default_glob = match defaults.match_type.as_deref() {
            None | Some("" | "glob") => true,
            Some("regex") => false,
            Some(other) => return Err(MappingError(format!("invalid match type {other:?}"))),
        };
        let default_histogram = observer_is_histogram(
            defaults
                .observer_type
                .as_deref()
                .or(defaults.timer_type.as_deref()),
        )
        .map_err(MappingError)?
        .unwrap_or(false);
        let default_buckets = defaults
            .histogram_options
            .as_ref()
            .and_then(|options| options.buckets.clone())
            .or_else(|| defaults.buckets.clone())
            .unwrap_or_else(|| DEFAULT_BUCKETS.to_vec());
        let rules = spec
            .mappings
            .into_iter()
            .enumerate()
            .map(|(i, mapping)| {
                compile(mapping, default_glob, default_histogram, &default_buckets)
                    .map_err(|why| MappingError(format!("mappings[{i}]: {why}")))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { rules })
    }

    /// Where the statistic `name` of `kind` goes: the first glob that
    /// matches, else the first regular expression, else its own name,
    /// escaped.
    pub fn map(&self, name: &str, kind: StatKind) -> Mapped {
        let applies = |rule: &&Rule| rule.kind.is_none_or(|k| k == kind);
        let globs = self
            .rules
            .iter()
            .filter(applies)
            .find_map(|rule| match &rule.matcher {
                Matcher::Glob(segments) => glob_captures(segments, name).map(|c| (rule, c)),
                Matcher::Regex(_) => None,
            });
        if let Some((rule, captures)) = globs {
            let format = |template: &str| glob_format(template, &captures);
            return rule.mapped(format);
        }
        for rule in &self.rules {
            let Matcher::Regex(regex) = &rule.matcher else {
                continue;
            };
            let Some(captures) = regex.captures(name) else {
                continue;
            };
            // statsd_exporter checks the type after the match: a regex of
            // another type stops nothing, the next is tried.
            if !applies(&rule) {
                continue;
            }
            let format = |template: &str| {
                let mut out = String::new();
                captures.expand(template, &mut out);
                out
            };
            return rule.mapped(format);
        }
        Mapped::Series(Series {
            name: escape(name),
            labels: Vec::new(),
            scale: None,
            buckets: None,
            help: None,
        })
    }

    /// The histograms' names and buckets, as far as the file says them
    /// (a templated name by what precedes its first capture).
    pub fn histograms(&self) -> Vec<(HistogramName, Vec<f64>)> {
        self.rules
            .iter()
            .filter(|rule| !rule.drop && rule.kind.is_none_or(|k| k == StatKind::Timer))
            .filter_map(|rule| {
                let buckets = rule.buckets.clone()?;
                let name = match rule.name.split_once('$') {
                    None => HistogramName::Full(escape(&rule.name)),
                    Some((prefix, _)) => HistogramName::Prefix(escape(prefix)),
                };
                Some((name, buckets))
            })
            .collect()
    }
}

/// A histogram's name in a mapping: whole, or only its start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistogramName {
    /// The whole name.
    Full(String),
    /// What every name it makes starts with.
    Prefix(String),
}

impl Rule {
    fn mapped(&self, format: impl Fn(&str) -> String) -> Mapped {
        if self.drop {
            return Mapped::Drop;
        }
        Mapped::Series(Series {
            name: escape(&format(&self.name)),
            labels: self
                .labels
                .iter()
                .map(|(label, value)| (label.clone(), format(value)))
                .collect(),
            scale: self.scale,
            buckets: self.buckets.clone(),
            help: self.help.clone(),
        })
    }
}

/// One mapping, checked as statsd_exporter checks it.
fn compile(
    spec: MappingSpec,
    default_glob: bool,
    default_histogram: bool,
    default_buckets: &[f64],
) -> Result<Rule, String> {
    if let Some(label) = spec.labels.keys().find(|label| !LABEL_NAME.is_match(label)) {
        return Err(format!("invalid label key: {label}"));
    }
    if spec.name.is_empty() {
        return Err("metric mapping didn't set a metric name".into());
    }
    if !METRIC_NAME.is_match(&spec.name) {
        return Err(format!("metric name '{}' is not a valid name", spec.name));
    }
    let glob = match spec.match_type.as_deref() {
        None | Some("") => default_glob,
        Some("glob") => true,
        Some("regex") => false,
        Some(other) => return Err(format!("invalid match type {other:?}")),
    };
    let matcher = if glob {
        if !GLOB_LINE.is_match(&spec.matches) {
            return Err(format!("invalid match: {}", spec.matches));
        }
        let segments = spec.matches.split('.');
        Matcher::Glob(segments.map(|s| (s != "*").then(|| s.to_owned())).collect())
    } else {
        Matcher::Regex(
            Regex::new(&spec.matches)
                .map_err(|err| format!("invalid regex {} in mapping: {err}", spec.matches))?,
        )
    };
    let drop = match spec.action.as_deref() {
        None | Some("" | "map") => false,
        Some("drop") => true,
        Some(other) => return Err(format!("invalid action type {other:?}")),
    };
    let kind = match spec.match_metric_type.as_deref() {
        None | Some("") => None,
        Some("counter") => Some(StatKind::Counter),
        Some("gauge") => Some(StatKind::Gauge),
        Some("observer" | "timer") => Some(StatKind::Timer),
        Some(other) => return Err(format!("invalid metric type '{other}'")),
    };
    let observer = spec.observer_type.as_deref().or(spec.timer_type.as_deref());
    let histogram = observer_is_histogram(observer)?.unwrap_or(default_histogram);
    let buckets = histogram.then(|| {
        spec.histogram_options
            .and_then(|options| options.buckets)
            .or(spec.buckets)
            .filter(|buckets| !buckets.is_empty())
            .unwrap_or_else(|| default_buckets.to_vec())
    });
    Ok(Rule {
        matcher,
        kind,
        drop,
        name: spec.name,
        labels: spec.labels,
        scale: spec.scale,
        buckets,
        help: spec.help,
    })
}

/// `observer_type` (or `timer_type`): `Some(true)` for a histogram,
/// `Some(false)` for a summary, `None` when not said.
fn observer_is_histogram(text: Option<&str>) -> Result<Option<bool>, String> {
    match text {
        None | Some("") => Ok(None),
        Some("histogram") => Ok(Some(true)),
        Some("summary") => Ok(Some(false)),
        Some(other) => Err(format!("invalid observer type '{other}'")),
    }
}

/// The segments a glob's `*`s capture in `name`, if it matches: as many
/// segments, each literal equal.
fn glob_captures<'a>(segments: &[Option<String>], name: &'a str) -> Option<Vec<&'a str>> {
    let mut captures = Vec::new();
    let mut fields = name.split('.');
    for segment in segments {
        let field = fields.next()?;
        match segment {
            Some(literal) if literal != field => return None,
            Some(_) => {}
            None => captures.push(field),
        }
    }
    fields.next().is_none().then_some(captures)
}

/// A glob mapping's template with its captures: `$n` or `${n}` (from 1)
/// is the nth capture, and any other `$...` reference is dropped.
fn glob_format(template: &str, captures: &[&str]) -> String {
    REFERENCE
        .replace_all(template, |found: &regex::Captures<'_>| {
            found[1]
                .parse::<usize>()
                .ok()
                .filter(|&n| (1..=captures.len()).contains(&n))
                .map(|n| captures[n - 1].to_owned())
                .unwrap_or_default()
        })
        .into_owned()
}

/// statsd_exporter's `EscapeMetricName`: every character but
/// `[a-zA-Z0-9_]` becomes `_` (a run of `-` one `_`), and a leading digit
/// gains a `_` before it.
pub fn escape(name: &str) -> String {
    let mut escaped = String::with_capacity(name.len() + 1);
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        escaped.push('_');
    }
    let mut previous = None;
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            escaped.push(c);
        } else if c == '-' && previous == Some('-') {
            // A second dash adds nothing, and the one before it stays
            // the previous character.
            continue;
        } else {
            escaped.push('_');
        }
        previous = Some(c);
    }
    escaped
}

#[cfg(test)]
#[path = "mapper_tests.rs"]
mod tests;
