//! Reads envoyproxy/ratelimit configuration files, unchanged, into
//! [`Rules`]: one YAML file per domain, or a directory of them. Every error
//! names the file, the line and the reason.
//!
//! Accepted as upstream: `domain`, `descriptors` (nested), `key`, `value`
//! (a `*` anywhere makes a wildcard: any run of characters), `rate_limit` with `unit`,
//! `requests_per_unit`, `unlimited`, `name`, `replaces`, and `shadow_mode`,
//! `detailed_metric`, `value_to_metric`, `share_threshold`, `quota_mode`
//! and `metadata` on descriptors: every field upstream's schema accepts.
//! Three extensions on `rate_limit`: `count_denied_hits` (a request matching
//! the rule is counted as upstream counts), `algorithm` (`fixed_window`, the default,
//! with windows aligned to the unit as upstream; `sliding_window`;
//! `token_bucket`; `gcra`; `sliding_window_counter`) and `unit_multiplier` (the window is `unit` × this).
//!
//! An extension on descriptors: `rate_limits`, a list of entries each with
//! exactly the fields of `rate_limit`, beside or instead of it (`rate_limit`
//! then counts as the list's first entry): several limits on one
//! descriptor, all decided together with the request's other descriptors.
//! `shadow_mode`, `quota_mode`, `metadata` and `share_threshold` are the
//! descriptor's and hold for every entry. Two counted entries with the same
//! algorithm and the same window (`unit` × `unit_multiplier`) would name one
//! counter, and are refused. An `unlimited: true` entry limits nothing (a
//! descriptor whose entries all are is unlimited); a `requests_per_unit: 0`
//! entry blocks the descriptor, as a single blocked rule does. Each entry's
//! `name` is its own: reported in `current_limit` when that entry is the
//! most restrictive, and the `replaces` of any rule matched in the same
//! request drops every entry so named, the descriptor keeping its other
//! entries (with none left it has no limit, as a replaced upstream rule).
//! An entry's `replaces` may not name an entry of its own descriptor (it
//! could only ever drop it). An unnamed entry of a descriptor with several
//! has the policy id `<descriptor path>#<position>` (1-based, `rate_limit`
//! first) in the IETF headers. `rate_limits: []` is no limit, as no
//! `rate_limit`.
//!
//! Also an extension: the Envoy quota service's policies of the domain,
//! `quota_buckets` (a `bucket_id` pattern and a `rate_limit` each) and
//! `quota_default` (see [`super::quota_policies`]).
//!
//! And `CheckLimit`'s named policies ([`crate::policy`]): a file whose top
//! level is `policies:` (conventionally `policies.yaml`, with or without a
//! `domain`), each policy a list of limits with `per`, `limit`, and
//! optionally `algorithm`, `burst`, `name`, `scope` and `shadow_mode`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::metadata;
use super::quota_policies::{
    QuotaDomain, QuotaLimit, QuotaPolicy, QuotaRate, ValuePattern, allow_all_default,
    render_pattern,
};
use super::rules::{Level, Limit, Node, Rule, Rules, Source, Unit, Wildcard};
use crate::algorithm::registry::{Kind, Rate, WindowStart};
use crate::policy::Policy;
use crate::policy::file::{self as policy_file, PoliciesSpec};
pub use crate::spec::ConfigError;
use crate::spec::{self, Text};

/// The files a `--config` path names, each with its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Each file read: its path and its text.
    pub files: Vec<(PathBuf, String)>,
}

/// Which files of a configuration directory are read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileSelection {
    /// Every file in the directory and its subdirectories (as upstream's
    /// runtime loader), not only `*.yaml` / `*.yml` directly in it.
    pub every_file: bool,
    /// Names starting with `.` too.
    pub dotfiles: bool,
}

/// Deepest subdirectory read with [`FileSelection::every_file`], so that a
/// symlink loop ends.
const MAX_DEPTH: usize = 16;

impl Snapshot {
    /// Reads `path`: a file, or the files of a directory that `selection`
    /// names, in path order. By default names starting with `.` are
    /// skipped: a Kubernetes ConfigMap volume keeps its data in `..data`
    /// and `..<timestamp>` entries, with the visible names linking into
    /// them.
    pub fn read(path: &Path, selection: FileSelection) -> Result<Self, ConfigError> {
        let metadata = std::fs::metadata(path).map_err(unreadable(path))?;
        let mut paths = Vec::new();
        if metadata.is_dir() {
            collect_files(path, selection, 0, &mut paths)?;
            paths.sort();
        } else {
            paths.push(path.to_owned());
        }
        let mut files = Vec::with_capacity(paths.len());
        for file in paths {
            let text = std::fs::read_to_string(&file).map_err(unreadable(&file))?;
            files.push((file, text));
        }
        Ok(Self { files })
    }

    /// Parses and checks every file into one set of rules.
    pub fn compile(&self) -> Result<Rules, ConfigError> {
        let mut rules = Rules::default();
        let mut domain_lines: HashMap<String, String> = HashMap::new();
        for (path, text) in &self.files {
            let file = path.display().to_string();
            let CompiledFile { domain, policies } = compile_file(&file, text)?;
            for (policy, line) in policies {
                if let Some(first) = rules.policies.get(&policy.name) {
                    return Err(ConfigError {
                        file,
                        line,
                        reason: format!(
                            "duplicate policy '{}' (first defined at {})",
                            policy.name, first.source
                        ),
                    });
                }
                rules.policies.insert(policy.name.clone(), Arc::new(policy));
            }
            let Some((domain, line, level, quota)) = domain else {
                continue;
            };
            if let Some(first) = domain_lines.get(&domain) {
                return Err(ConfigError {
                    file,
                    line,
                    reason: format!("duplicate domain '{domain}' (first defined at {first})"),
                });
            }
            domain_lines.insert(domain.clone(), format!("{}:{line}", path.display()));
            if let Some(quota) = quota {
                rules.quotas.insert(domain.clone(), quota);
            }
            rules.domains.insert(domain, level);
        }
        Ok(rules)
    }
}

/// The error for a file or directory `path` that cannot be read.
fn unreadable(path: &Path) -> impl Fn(std::io::Error) -> ConfigError + '_ {
    move |err| ConfigError {
        file: path.display().to_string(),
        line: 0,
        reason: format!("cannot read: {err}"),
    }
}

/// Adds the files of `directory` that `selection` names to `paths`.
fn collect_files(
    directory: &Path,
    selection: FileSelection,
    depth: usize,
    paths: &mut Vec<PathBuf>,
) -> Result<(), ConfigError> {
    let unreadable = unreadable(directory);
    for entry in std::fs::read_dir(directory).map_err(&unreadable)? {
        let entry_path = entry.map_err(&unreadable)?.path();
        let name = entry_path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.starts_with('.') && !selection.dotfiles {
            continue;
        }
        if entry_path.is_dir() {
            if selection.every_file && depth < MAX_DEPTH {
                collect_files(&entry_path, selection, depth + 1, paths)?;
            }
            continue;
        }
        let is_yaml = name.ends_with(".yaml") || name.ends_with(".yml");
        if (is_yaml || selection.every_file) && entry_path.is_file() {
            paths.push(entry_path);
        }
    }
    Ok(())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    domain: Option<Spanned<Text>>,
    #[serde(default)]
    descriptors: Vec<Spanned<DescriptorSpec>>,
    /// Extension: the quota service's policies.
    quota_buckets: Option<Vec<Spanned<QuotaBucketSpec>>>,
    /// Extension: the quota service's policy for buckets no other governs.
    quota_default: Option<Spanned<QuotaDefaultSpec>>,
    /// Extension: `CheckLimit`'s named policies, name → limits.
    policies: Option<PoliciesSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaBucketSpec {
    bucket_id: Option<Spanned<BTreeMap<Text, Text>>>,
    rate_limit: Option<Spanned<QuotaRateSpec>>,
    #[serde(default)]
    shadow_mode: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaDefaultSpec {
    rate_limit: Option<Spanned<QuotaRateSpec>>,
    #[serde(default)]
    shadow_mode: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaRateSpec {
    unit: Option<Text>,
    requests_per_unit: Option<u64>,
    unit_multiplier: Option<u32>,
    #[serde(default)]
    unlimited: bool,
    name: Option<Text>,
    /// Requests a bucket may take at once beyond its rate.
    burst: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DescriptorSpec {
    key: Option<Text>,
    value: Option<Text>,
    rate_limit: Option<Spanned<RateLimitSpec>>,
    /// Extension: more limits on the same descriptor, each as
    /// `rate_limit`, all decided together (after `rate_limit`, if given).
    #[serde(default)]
    rate_limits: Vec<Spanned<RateLimitSpec>>,
    #[serde(default)]
    descriptors: Vec<Spanned<DescriptorSpec>>,
    #[serde(default)]
    shadow_mode: bool,
    /// Upstream: finer statistics names. Accepted; no effect on limiting.
    #[serde(default)]
    #[allow(dead_code)]
    detailed_metric: bool,
    /// Upstream: values in statistics names. Accepted; no effect on limiting.
    #[serde(default)]
    #[allow(dead_code)]
    value_to_metric: bool,
    #[serde(default)]
    share_threshold: bool,
    /// Over the limit, denies only when every quota descriptor is over.
    #[serde(default)]
    quota_mode: bool,
    /// Attached to the response's dynamic metadata when the descriptor
    /// passes.
    metadata: Option<Spanned<serde_json::Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitSpec {
    unit: Option<Text>,
    requests_per_unit: Option<u32>,
    #[serde(default)]
    unlimited: bool,
    name: Option<Text>,
    #[serde(default)]
    replaces: Vec<ReplacesSpec>,
    /// Extension: `fixed_window` (default), `sliding_window`, `token_bucket`,
    /// `gcra`, `sliding_window_counter`.
    algorithm: Option<Text>,
    /// Extension: the window is `unit` × this.
    unit_multiplier: Option<u32>,
    /// Extension: a request matching this rule is counted as upstream
    /// counts (each descriptor on its own, denied hits too), for rules
    /// Envoy charges after the response (`apply_on_stream_done`).
    #[serde(default)]
    count_denied_hits: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplacesSpec {
    name: Option<Text>,
}

/// What one file holds: a domain (its name, the line of `domain:`, its
/// tree, and its quota policies if it has any), `CheckLimit` policies, or
/// both.
struct CompiledFile {
    domain: Option<(String, u64, Level, Option<QuotaDomain>)>,
    /// Each policy, with the line it starts at.
    policies: Vec<(Policy, u64)>,
}

/// Parses one file.
fn compile_file(file: &str, text: &str) -> Result<CompiledFile, ConfigError> {
    let spec: Option<FileSpec> = serde_saphyr::from_str(text).map_err(|err| ConfigError {
        file: file.to_owned(),
        line: err.location().map_or(0, |at| at.line()),
        reason: spec::parser_reason(&err.to_string()),
    })?;
    let error = |line: u64, reason: String| ConfigError {
        file: file.to_owned(),
        line,
        reason,
    };
    // An empty file parses as nothing: upstream's "empty domain".
    let Some(spec) = spec else {
        return Err(error(1, "config file cannot have empty domain".into()));
    };
    let policies = match &spec.policies {
        Some(policies) => policy_file::compile(file, policies)?,
        None => Vec::new(),
    };
    // A policies file needs no domain, unless it limits Envoy too.
    let domain_less =
        spec.descriptors.is_empty() && spec.quota_buckets.is_none() && spec.quota_default.is_none();
    if spec.policies.is_some() && spec.domain.is_none() && domain_less {
        return Ok(CompiledFile {
            domain: None,
            policies,
        });
    }
    let (domain, line) = match spec.domain {
        Some(domain) if !domain.value.0.is_empty() => (domain.value.0, domain.referenced.line()),
        Some(domain) => {
            let line = domain.referenced.line();
            return Err(error(line, "config file cannot have empty domain".into()));
        }
        None => return Err(error(1, "config file cannot have empty domain".into())),
    };
    let mut context = Context {
        file,
        path: vec![domain.clone()],
    };
    let level = context.level(&spec.descriptors)?;
    let quota = if spec.quota_buckets.is_some() || spec.quota_default.is_some() {
        let domain_source = Source {
            file: file.to_owned(),
            line,
        };
        Some(context.quota(
            spec.quota_buckets.as_deref().unwrap_or_default(),
            spec.quota_default.as_ref(),
            domain_source,
        )?)
    } else {
        None
    };
    Ok(CompiledFile {
        domain: Some((domain, line, level, quota)),
        policies,
    })
}

/// What a descriptor gives the rule it holds.
struct DescriptorSettings {
    shadow: bool,
    quota: bool,
    metadata: Option<prost_types::Struct>,
}

struct Context<'a> {
    file: &'a str,
    /// The descriptor path down to the level being read, for policy ids.
    path: Vec<String>,
}

impl Context<'_> {
    fn error(&self, line: u64, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_owned(),
            line,
            reason: reason.into(),
        }
    }

    fn level(&mut self, descriptors: &[Spanned<DescriptorSpec>]) -> Result<Level, ConfigError> {
        let mut level = Level::default();
        for descriptor in descriptors {
            let line = descriptor.referenced.line();
            let spec = &descriptor.value;
            let key = match &spec.key {
                Some(Text(key)) if !key.is_empty() => key.clone(),
                _ => return Err(self.error(line, "descriptor has empty key")),
            };
            let value = spec
                .value
                .as_ref()
                .map(|Text(value)| value.clone())
                .filter(|v| !v.is_empty());
            let composite = match &value {
                Some(value) => format!("{key}_{value}"),
                None => key.clone(),
            };
            let wildcard = value.as_deref().and_then(Wildcard::new);
            if spec.share_threshold && wildcard.is_none() {
                return Err(self.error(
                    line,
                    format!(
                        "share_threshold can only be used with wildcard values (containing '*'), \
                         but found key '{composite}'"
                    ),
                ));
            }
            self.path.push(composite.clone());
            let metadata = match &spec.metadata {
                None => None,
                Some(metadata) => {
                    Some(metadata::json_to_struct(&metadata.value).ok_or_else(|| {
                        self.error(metadata.referenced.line(), "metadata must be a map")
                    })?)
                }
            };
            let settings = DescriptorSettings {
                shadow: spec.shadow_mode,
                quota: spec.quota_mode,
                metadata,
            };
            let rules = self.rules(spec, &settings)?;
            let children = self.level(&spec.descriptors)?;
            self.path.pop();
            let node = Node {
                rules: rules.into_iter().map(Arc::new).collect(),
                shared_pattern: spec.share_threshold.then(|| value.clone()).flatten(),
                children,
            };
            let duplicate = match (&value, wildcard) {
                (Some(_), Some(pattern)) => {
                    let taken = level
                        .wildcards
                        .iter()
                        .any(|(k, p, _)| *k == key && *p == pattern);
                    if !taken {
                        level.wildcards.push((key, pattern, node));
                    }
                    taken
                }
                (Some(value), None) => {
                    let values = level.exact.entry(key).or_default();
                    let taken = values.contains_key(value);
                    if !taken {
                        values.insert(value.clone(), node);
                    }
                    taken
                }
                (None, _) => {
                    let taken = level.any_value.contains_key(&key);
                    if !taken {
                        level.any_value.insert(key, node);
                    }
                    taken
                }
            };
            if duplicate {
                let at = self.path.join(".");
                return Err(self.error(
                    line,
                    format!("duplicate descriptor composite key '{at}.{composite}'"),
                ));
            }
        }
        Ok(level)
    }

    /// A `rate_limit`'s period, `unit` (as parsed from `unit_text`) and
    /// `unit_multiplier` (1 unless written; at least 1), for rules and
    /// quota policies alike.
    fn period(
        &self,
        line: u64,
        unit: Option<Unit>,
        unit_text: &str,
        unit_multiplier: Option<u32>,
    ) -> Result<(Unit, u32), ConfigError> {
        let Some(unit) = unit else {
            return Err(self.error(line, format!("invalid rate limit unit '{unit_text}'")));
        };
        let unit_multiplier = unit_multiplier.unwrap_or(1);
        if unit_multiplier == 0 {
            return Err(self.error(line, "unit_multiplier must be at least 1"));
        }
        Ok((unit, unit_multiplier))
    }

    /// A domain's quota policies, from `quota_buckets` and
    /// `quota_default`.
    fn quota(
        &self,
        buckets: &[Spanned<QuotaBucketSpec>],
        default: Option<&Spanned<QuotaDefaultSpec>>,
        domain_source: Source,
    ) -> Result<QuotaDomain, ConfigError> {
        let mut policies: Vec<Arc<QuotaPolicy>> = Vec::with_capacity(buckets.len());
        for spanned in buckets {
            let line = spanned.referenced.line();
            let spec = &spanned.value;
            let Some(bucket_id) = &spec.bucket_id else {
                return Err(self.error(line, "quota bucket has no bucket_id"));
            };
            let id_line = bucket_id.referenced.line();
            let mut bucket = Vec::with_capacity(bucket_id.value.len());
            for (Text(key), Text(value)) in &bucket_id.value {
                if key.is_empty() || value.is_empty() {
                    return Err(self.error(
                        id_line,
                        "bucket_id keys and values must not be empty (Envoy sends none)",
                    ));
                }
                bucket.push((key.clone(), ValuePattern::new(value)));
            }
            if bucket.is_empty() {
                return Err(self.error(
                    id_line,
                    "bucket_id must name at least one key (quota_default governs the rest)",
                ));
            }
            let pattern = render_pattern(&bucket);
            if let Some(first) = policies
                .iter()
                .find(|policy| render_pattern(&policy.bucket) == pattern)
            {
                return Err(self.error(
                    line,
                    format!(
                        "duplicate quota bucket '{pattern}' (first at line {})",
                        first.source.line
                    ),
                ));
            }
            let (limit, name) = self.quota_limit(spec.rate_limit.as_ref(), line)?;
            policies.push(Arc::new(QuotaPolicy {
                name: name.unwrap_or(pattern),
                bucket,
                limit,
                shadow: spec.shadow_mode,
                source: Source {
                    file: self.file.to_owned(),
                    line,
                },
            }));
        }
        let default = match default {
            None => allow_all_default(domain_source),
            Some(spanned) => {
                let line = spanned.referenced.line();
                let (limit, name) = self.quota_limit(spanned.value.rate_limit.as_ref(), line)?;
                Arc::new(QuotaPolicy {
                    name: name.unwrap_or_else(|| "default".to_owned()),
                    bucket: Vec::new(),
                    limit,
                    shadow: spanned.value.shadow_mode,
                    source: Source {
                        file: self.file.to_owned(),
                        line,
                    },
                })
            }
        };
        Ok(QuotaDomain { policies, default })
    }

    /// A quota policy's `rate_limit`: what it allows, and its name.
    fn quota_limit(
        &self,
        spanned: Option<&Spanned<QuotaRateSpec>>,
        line: u64,
    ) -> Result<(QuotaLimit, Option<String>), ConfigError> {
        let Some(spanned) = spanned else {
            return Err(self.error(line, "quota bucket has no rate_limit"));
        };
        let line = spanned.referenced.line();
        let spec = &spanned.value;
        let name = spec
            .name
            .as_ref()
            .map(|Text(name)| name.clone())
            .filter(|name| !name.is_empty());
        let unit_text = spec.unit.as_ref().map_or("", |Text(unit)| unit.as_str());
        let unit = Unit::parse(unit_text);
        if spec.unlimited {
            if unit.is_some() || spec.requests_per_unit.is_some() || spec.burst.is_some() {
                return Err(self.error(
                    line,
                    "should not specify unit, requests_per_unit or burst when unlimited",
                ));
            }
            return Ok((QuotaLimit::AllowAll, name));
        }
        let (unit, unit_multiplier) = self.period(line, unit, unit_text, spec.unit_multiplier)?;
        // As upstream reads a rate_limit: a missing requests_per_unit is 0.
        let requests = spec.requests_per_unit.unwrap_or(0);
        if requests == 0 {
            return Ok((QuotaLimit::DenyAll, name));
        }
        if spec.burst == Some(0) {
            return Err(self.error(line, "burst must be at least 1"));
        }
        let rate = QuotaRate::new(requests, unit, unit_multiplier, spec.burst)
            .map_err(|reason| self.error(line, reason))?;
        Ok((QuotaLimit::Rate(rate), name))
    }

    /// A descriptor's limits: its `rate_limit` first, then each entry of
    /// its `rate_limits`.
    fn rules(
        &self,
        spec: &DescriptorSpec,
        settings: &DescriptorSettings,
    ) -> Result<Vec<Rule>, ConfigError> {
        let entries: Vec<&Spanned<RateLimitSpec>> =
            spec.rate_limit.iter().chain(&spec.rate_limits).collect();
        let several = entries.len() > 1;
        let mut rules: Vec<Rule> = Vec::with_capacity(entries.len());
        for (position, entry) in entries.into_iter().enumerate() {
            let mut rule = self.rule(entry, settings)?;
            let line = rule.source.line;
            // The headers name one limit of several: the path alone would
            // not say which.
            if several && rule.name.is_none() {
                rule.policy_id = format!("{}#{}", rule.policy_id, position + 1);
            }
            for earlier in &rules {
                if let Some((tag, algorithm, window)) = counter(&rule)
                    && counter(earlier).is_some_and(|(t, _, w)| (t, w) == (tag, window))
                {
                    return Err(self.error(
                        line,
                        format!(
                            "this limit and the one at line {} would share one counter \
                             (both {algorithm} over {} s): change the unit, \
                             unit_multiplier or algorithm of one of them",
                            earlier.source.line,
                            window.as_secs()
                        ),
                    ));
                }
                // Both decide every request of the descriptor: replacing
                // one by the other could only ever drop it.
                for (replacing, replaced) in [(&rule, earlier), (earlier, &rule)] {
                    if let Some(name) = &replaced.name
                        && replacing.replaces.contains(name)
                    {
                        return Err(self.error(
                            line,
                            format!(
                                "replaces should not name a limit of the same descriptor \
                                 ('{name}', line {})",
                                replaced.source.line
                            ),
                        ));
                    }
                }
            }
            rules.push(rule);
        }
        Ok(rules)
    }

    fn rule(
        &self,
        spanned: &Spanned<RateLimitSpec>,
        settings: &DescriptorSettings,
    ) -> Result<Rule, ConfigError> {
        let shadow = settings.shadow;
        let line = spanned.referenced.line();
        let spec = &spanned.value;
        let unit_text = spec
            .unit
            .as_ref()
            .map(|Text(unit)| unit.as_str())
            .unwrap_or("");
        let unit = Unit::parse(unit_text);
        if spec.unlimited && unit.is_some() {
            return Err(self.error(line, "should not specify rate limit unit when unlimited"));
        }
        let name = spec
            .name
            .as_ref()
            .map(|Text(name)| name.clone())
            .filter(|n| !n.is_empty());
        let mut replaces = Vec::with_capacity(spec.replaces.len());
        for replaced in &spec.replaces {
            match &replaced.name {
                Some(Text(replaced)) if !replaced.is_empty() => {
                    if Some(replaced) == name.as_ref() {
                        return Err(
                            self.error(line, "replaces should not contain name of same descriptor")
                        );
                    }
                    replaces.push(replaced.clone());
                }
                _ => return Err(self.error(line, "should not have an empty replaces entry")),
            }
        }
        let stats_key = self.path[1..].to_vec();
        let policy_id = name.clone().unwrap_or_else(|| stats_key.join("."));
        let source = Source {
            file: self.file.to_owned(),
            line,
        };
        if spec.unlimited {
            return Ok(Rule {
                name,
                requests_per_unit: 0,
                unit: Unit::Second,
                unit_multiplier: 1,
                limit: Limit::Unlimited,
                replaces,
                shadow,
                quota: settings.quota,
                metadata: settings.metadata.clone(),
                stats_key,
                upstream_counters: Default::default(),
                count_denied_hits: spec.count_denied_hits,
                policy_id,
                source,
            });
        }
        let (unit, unit_multiplier) = self.period(line, unit, unit_text, spec.unit_multiplier)?;
        // Upstream reads a missing requests_per_unit as 0: always denied.
        let requests_per_unit = spec.requests_per_unit.unwrap_or(0);
        let mut rule = Rule {
            name,
            requests_per_unit,
            unit,
            unit_multiplier,
            limit: Limit::Blocked,
            replaces,
            shadow,
            quota: settings.quota,
            metadata: settings.metadata.clone(),
            stats_key,
            upstream_counters: Default::default(),
            count_denied_hits: spec.count_denied_hits,
            policy_id,
            source,
        };
        let name = spec
            .algorithm
            .as_ref()
            .map_or(Kind::FixedWindow.name(), |Text(name)| name.as_str());
        let Some(kind) = Kind::from_name(name) else {
            return Err(self.error(
                line,
                format!("unknown algorithm '{name}': use {}", Kind::names(" or ")),
            ));
        };
        // Envoy's fixed windows are aligned to the unit, as upstream's.
        let rate = Rate::new(u64::from(requests_per_unit), rule.window());
        let counted = kind.build(rate, WindowStart::Epoch);
        if requests_per_unit > 0 {
            let algorithm = counted.map_err(|err| {
                let field = match err.field.as_str() {
                    "window" | "period" => "unit × unit_multiplier",
                    "limit" | "capacity" | "rate" | "burst" => "requests_per_unit",
                    other => other,
                };
                self.error(line, format!("{field}: {}", err.rule))
            })?;
            rule.limit = Limit::Counted(algorithm);
        }
        Ok(rule)
    }
}

/// What names a counted rule's counter beside its descriptor's entries:
/// its window, and its algorithm (storage keys carry the algorithm's tag).
/// Unlimited and blocked rules keep none.
fn counter(rule: &Rule) -> Option<(&'static str, &'static str, std::time::Duration)> {
    match &rule.limit {
        Limit::Counted(algorithm) => Some((
            crate::algorithm::key_tag(algorithm),
            algorithm.name(),
            rule.window(),
        )),
        Limit::Unlimited | Limit::Blocked => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::envoy::quota_policies::{QuotaLimit, QuotaRate};

    fn compile(text: &str) -> Result<Rules, ConfigError> {
        Snapshot {
            files: vec![(PathBuf::from("limits.yaml"), text.to_owned())],
        }
        .compile()
    }

    #[test]
    fn the_upstream_examples_compile() {
        let snapshot = Snapshot::read(
            Path::new("tests/fixtures/ratelimit"),
            FileSelection::default(),
        )
        .unwrap();
        assert_eq!(snapshot.files.len(), 14);
        let rules = snapshot.compile().unwrap();
        assert_eq!(rules.domains.len(), 14);
    }

    #[test]
    fn errors_name_the_file_the_line_and_the_reason() {
        let cases = [
            ("", 1, "config file cannot have empty domain"),
            (
                "domain: d\ndescriptors:\n  - value: v\n",
                3,
                "descriptor has empty key",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
                5,
                "invalid rate limit unit 'fortnight'",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n",
                4,
                "should not specify rate limit unit when unlimited",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n  - key: k\n",
                4,
                "duplicate descriptor composite key 'd.k'",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: a, replaces: [{name: a}]}\n",
                4,
                "replaces should not contain name of same descriptor",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    share_threshold: true\n",
                3,
                "share_threshold can only be used with wildcard values",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: leaky}\n",
                4,
                "unknown algorithm 'leaky'",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100001, algorithm: sliding_window}\n",
                4,
                "requests_per_unit: must be at most 100000",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, unit_multiplier: 2, requests_per_unit: 1}\n",
                4,
                "unit × unit_multiplier: must be at most",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    limit: 5\n",
                4,
                "unknown field `limit`",
            ),
            (
                "domain: d\ndescriptors:\n  - key: [\n",
                3,
                "invalid type: sequence",
            ),
            ("domain: d\n  descriptors: x\n", 2, ""),
        ];
        for (text, line, reason) in cases {
            let err = compile(text).expect_err(text);
            assert_eq!(err.file, "limits.yaml");
            assert_eq!(err.line, line, "{text:?}: {err}");
            assert!(err.reason.contains(reason), "{text:?}: {err}");
        }
    }

    #[test]
    fn a_domain_in_two_files_is_refused() {
        let snapshot = Snapshot {
            files: vec![
                (PathBuf::from("a.yaml"), "domain: d\n".into()),
                (PathBuf::from("b.yaml"), "# again\ndomain: d\n".into()),
            ],
        };
        let err = snapshot.compile().unwrap_err();
        assert_eq!((err.file.as_str(), err.line), ("b.yaml", 2));
        assert!(err.reason.contains("duplicate domain 'd'"), "{err}");
    }

    #[test]
    fn scalars_of_any_type_are_text_and_units_ignore_case() {
        let rules = compile(
            "domain: d\ndescriptors:\n  - key: code\n    value: 429\n    rate_limit: {unit: MINUTE, requests_per_unit: 1}\n",
        )
        .unwrap();
        let entries = [("code".to_owned(), "429".to_owned())];
        let found = rules.find("d", &entries).unwrap();
        assert_eq!(found.rules[0].unit, Unit::Minute);
    }

    #[test]
    fn a_descriptor_may_carry_several_limits() {
        let rules = compile(
            "domain: d\ndescriptors:\n  - key: api\n    rate_limits:\n      - {unit: second, requests_per_unit: 3, name: burst}\n      - unit: minute\n        requests_per_unit: 5\n",
        )
        .unwrap();
        let entries = [("api".to_owned(), "x".to_owned())];
        let found = rules.find("d", &entries).unwrap();
        let limits: Vec<(u32, Unit, u64)> = found
            .rules
            .iter()
            .map(|rule| (rule.requests_per_unit, rule.unit, rule.source.line))
            .collect();
        assert_eq!(limits, [(3, Unit::Second, 5), (5, Unit::Minute, 6)]);
        assert_eq!(found.rules[0].policy_id, "burst");
        assert_eq!(found.rules[1].policy_id, "api#2", "unnamed, one of several");
    }

    #[test]
    fn rate_limit_comes_first_before_rate_limits() {
        let rules = compile(
            "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 100}\n    rate_limits:\n      - {unit: second, requests_per_unit: 2}\n      - {unit: second, requests_per_unit: 5, algorithm: token_bucket}\n      - {unlimited: true}\n",
        )
        .unwrap();
        let entries = [("k".to_owned(), "v".to_owned())];
        let found = rules.find("d", &entries).unwrap();
        let units: Vec<Unit> = found.rules.iter().map(|rule| rule.unit).collect();
        assert_eq!(
            units,
            [Unit::Hour, Unit::Second, Unit::Second, Unit::Second]
        );
        assert_eq!(found.rules[0].policy_id, "k#1");
        assert!(
            found.rules.iter().all(|rule| rule.shadow),
            "the descriptor's"
        );
        assert_eq!(found.rules[3].limit, Limit::Unlimited);
        // One rate_limit alone keeps upstream's id; so does a list of one.
        let rules = compile(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: b\n    rate_limits: [{unit: hour, requests_per_unit: 1}]\n  - key: c\n    rate_limits: []\n",
        )
        .unwrap();
        for key in ["a", "b"] {
            let entries = [(key.to_owned(), "v".to_owned())];
            let found = rules.find("d", &entries).unwrap();
            assert_eq!(found.rules.len(), 1);
            assert_eq!(found.rules[0].policy_id, key);
        }
        let entries = [("c".to_owned(), "v".to_owned())];
        assert!(
            rules.find("d", &entries).is_none(),
            "an empty list: no limit"
        );
    }

    #[test]
    fn several_limits_errors_name_the_entry() {
        let cases = [
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: minute, requests_per_unit: 3}\n      - {unit: second, unit_multiplier: 60, requests_per_unit: 5}\n",
                6,
                "this limit and the one at line 5 would share one counter (both fixed_window over 60 s): change the unit, unit_multiplier or algorithm of one of them",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3, algorithm: gcra}\n    rate_limits:\n      - {unit: second, requests_per_unit: 5, algorithm: gcra}\n",
                6,
                "would share one counter (both gcra over 1 s)",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 3}\n      - unit: fortnight\n        requests_per_unit: 5\n",
                6,
                "invalid rate limit unit 'fortnight'",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 3}\n      - {unit: minute, requests_per_unit: 5, burst: 2}\n",
                6,
                "unknown field `burst`",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 3, name: a}\n      - {unit: minute, requests_per_unit: 5, replaces: [{name: a}]}\n",
                6,
                "replaces should not name a limit of the same descriptor ('a', line 5)",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 3, replaces: [{name: b}]}\n      - {unit: minute, requests_per_unit: 5, name: b}\n",
                6,
                "replaces should not name a limit of the same descriptor ('b', line 6)",
            ),
        ];
        for (text, line, reason) in cases {
            let err = compile(text).expect_err(text);
            assert_eq!(err.line, line, "{text:?}: {err}");
            assert!(err.reason.contains(reason), "{text:?}: {err}");
        }
        // Without a counter, or with another window or algorithm, no clash.
        compile(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 3}\n      - {unit: second, requests_per_unit: 3, algorithm: sliding_window}\n      - {unit: second, unit_multiplier: 2, requests_per_unit: 5}\n      - {unit: second, requests_per_unit: 0}\n      - {unlimited: true}\n      - {unlimited: true}\n",
        )
        .unwrap();
    }

    #[test]
    fn quota_policies_compile_with_their_default() {
        let rules = compile(
            "domain: edge\nquota_buckets:\n  - bucket_id: {name: api, tenant: \"*\"}\n    rate_limit: {unit: second, requests_per_unit: 100}\n  - bucket_id: {name: blocked}\n    rate_limit: {unit: second, requests_per_unit: 0, name: nobody}\n    shadow_mode: true\nquota_default:\n  rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 5000, burst: 50}\n",
        )
        .unwrap();
        let quota = &rules.quotas["edge"];
        assert_eq!(quota.policies.len(), 2);
        assert_eq!(quota.policies[0].name, "name=api,tenant=*");
        assert_eq!(quota.policies[0].source.line, 3);
        assert!(
            matches!(quota.policies[0].limit, QuotaLimit::Rate(rate) if rate.micro_rps() == 100_000_000)
        );
        assert_eq!(quota.policies[1].name, "nobody");
        assert_eq!(quota.policies[1].limit, QuotaLimit::DenyAll);
        assert!(quota.policies[1].shadow);
        assert_eq!(
            quota.default.limit,
            QuotaLimit::Rate(QuotaRate {
                requests: 5000,
                period_seconds: 300,
                burst: Some(50)
            })
        );
        // A domain without quota keys has no quota policies; one with only
        // buckets allows the rest.
        let rules = compile("domain: plain\n").unwrap();
        assert!(rules.quotas.is_empty());
        let rules = compile(
            "domain: d\nquota_buckets:\n  - bucket_id: {a: b}\n    rate_limit: {unlimited: true}\n",
        )
        .unwrap();
        assert_eq!(rules.quotas["d"].default.limit, QuotaLimit::AllowAll);
        assert_eq!(rules.quotas["d"].policies[0].limit, QuotaLimit::AllowAll);
    }

    #[test]
    fn quota_errors_name_the_line_and_the_reason() {
        let cases = [
            (
                "domain: d\nquota_buckets:\n  - rate_limit: {unlimited: true}\n",
                3,
                "quota bucket has no bucket_id",
            ),
            (
                "domain: d\nquota_buckets:\n  - bucket_id: {}\n    rate_limit: {unlimited: true}\n",
                3,
                "at least one key",
            ),
            (
                "domain: d\nquota_buckets:\n  - bucket_id: {a: \"\"}\n    rate_limit: {unlimited: true}\n",
                3,
                "must not be empty",
            ),
            (
                "domain: d\nquota_buckets:\n  - bucket_id: {a: b}\n",
                3,
                "quota bucket has no rate_limit",
            ),
            (
                "domain: d\nquota_buckets:\n  - bucket_id: {a: b}\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
                4,
                "invalid rate limit unit 'fortnight'",
            ),
            (
                "domain: d\nquota_buckets:\n  - bucket_id: {a: b}\n    rate_limit: {unit: second, requests_per_unit: 2000000}\n",
                4,
                "at most 1000000 requests per second",
            ),
            (
                "domain: d\nquota_buckets:\n  - bucket_id: {a: b}\n    rate_limit: {unit: year, requests_per_unit: 1}\n",
                4,
                "below the smallest quota rate",
            ),
            (
                "domain: d\nquota_buckets:\n  - bucket_id: {a: b}\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 0}\n",
                4,
                "burst must be at least 1",
            ),
            (
                "domain: d\nquota_buckets:\n  - bucket_id: {a: b}\n    rate_limit: {unlimited: true, unit: second}\n",
                4,
                "when unlimited",
            ),
            (
                "domain: d\nquota_buckets:\n  - bucket_id: {a: b}\n    rate_limit: {unlimited: true}\n  - bucket_id: {a: b}\n    rate_limit: {unlimited: true}\n",
                5,
                "duplicate quota bucket 'a=b' (first at line 3)",
            ),
            (
                "domain: d\nquota_buckets:\n  - bucket_id: {a: b}\n    limit: 5\n",
                4,
                "unknown field `limit`",
            ),
        ];
        for (text, line, reason) in cases {
            let err = compile(text).expect_err(text);
            assert_eq!(err.line, line, "{text:?}: {err}");
            assert!(err.reason.contains(reason), "{text:?}: {err}");
        }
    }
}
