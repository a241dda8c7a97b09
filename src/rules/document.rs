//! One rules file as a whole: upstream's `domain` and `descriptors`, and
//! beside them (extensions) a domain's quota service policies and
//! `CheckLimit`'s named policies; and a set of files compiled into one
//! [`Rules`]. A file whose top level is only `policies:` needs no domain.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::Rules;
use super::descriptors_file::{self, DescriptorSpec};
use super::quota::QuotaDomain;
use super::quota_file::{self, QuotaBucketSpec, QuotaDefaultSpec};
use super::rule::Source;
use super::tree::Level;
use crate::config_error::ConfigError;
use crate::policy::Policy;
use crate::policy::file::{self as policy_file, PoliciesSpec};
use crate::spec::{self, Text};

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

/// A domain of one file: its name, the line of `domain:`, its tree, and
/// its quota policies if it has any.
struct Domain {
    name: String,
    line: u64,
    level: Level,
    quota: Option<QuotaDomain>,
}

/// What one file holds: a domain, `CheckLimit` policies, or both.
struct CompiledFile {
    domain: Option<Domain>,
    /// Each policy, with the line it starts at.
    policies: Vec<(Policy, u64)>,
}

/// Parses and checks every file (path and text) into one set of rules: a
/// domain or a policy defined twice, in one file or two, is refused.
pub fn compile(files: &[(PathBuf, String)]) -> Result<Rules, ConfigError> {
    let mut rules = Rules::default();
    let mut domain_lines: HashMap<String, String> = HashMap::new();
    for (path, text) in files {
        let file = path.display().to_string();
        let CompiledFile { domain, policies } = compile_file(&file, text)?;
        for (policy, line) in policies {
            if let Some(first) = rules.policies.get(&policy.name) {
                let reason = format!(
                    "duplicate policy '{}' (first defined at {})",
                    policy.name, first.source
                );
                return Err(ConfigError::in_file(&file, line, reason));
            }
            rules.policies.insert(policy.name.clone(), Arc::new(policy));
        }
        let Some(Domain {
            name,
            line,
            level,
            quota,
        }) = domain
        else {
            continue;
        };
        if let Some(first) = domain_lines.get(&name) {
            let reason = format!("duplicate domain '{name}' (first defined at {first})");
            return Err(ConfigError::in_file(&file, line, reason));
        }
        domain_lines.insert(name.clone(), format!("{}:{line}", path.display()));
        if let Some(quota) = quota {
            rules.quotas.insert(name.clone(), quota);
        }
        rules.domains.insert(name, level);
    }
    Ok(rules)
}

/// Parses one file.
fn compile_file(file: &str, text: &str) -> Result<CompiledFile, ConfigError> {
    let spec: Option<FileSpec> = serde_saphyr::from_str(text).map_err(|err| {
        let line = err.location().map_or(0, |at| at.line());
        ConfigError::in_file(file, line, spec::parser_reason(&err.to_string()))
    })?;
    let empty_domain =
        |line: u64| ConfigError::in_file(file, line, "config file cannot have empty domain");
    // An empty file parses as nothing: upstream's "empty domain".
    let Some(spec) = spec else {
        return Err(empty_domain(1));
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
    let (name, line) = match spec.domain {
        Some(domain) if !domain.value.0.is_empty() => (domain.value.0, domain.referenced.line()),
        Some(domain) => return Err(empty_domain(domain.referenced.line())),
        None => return Err(empty_domain(1)),
    };
    let level = descriptors_file::compile(file, &name, &spec.descriptors)?;
    let quota = if spec.quota_buckets.is_some() || spec.quota_default.is_some() {
        let domain_source = Source {
            file: file.to_owned(),
            line,
        };
        Some(quota_file::compile(
            file,
            spec.quota_buckets.as_deref().unwrap_or_default(),
            spec.quota_default.as_ref(),
            domain_source,
        )?)
    } else {
        None
    };
    Ok(CompiledFile {
        domain: Some(Domain {
            name,
            line,
            level,
            quota,
        }),
        policies,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::rules::FileSelection;
    use crate::rules::directory::Files;

    fn compile_text(text: &str) -> Result<Rules, ConfigError> {
        compile(&[(PathBuf::from("limits.yaml"), text.to_owned())])
    }

    #[test]
    fn the_upstream_examples_compile() {
        let files = Files::read(
            Path::new("tests/fixtures/ratelimit"),
            FileSelection::default(),
        )
        .unwrap();
        assert_eq!(files.files.len(), 14);
        let rules = compile(&files.files).unwrap();
        assert_eq!(rules.domain_count(), 14);
    }

    #[test]
    fn errors_name_the_file_the_line_and_the_reason() {
        let cases = [
            ("", 1, "config file cannot have empty domain"),
            (
                "descriptors: []\n",
                1,
                "config file cannot have empty domain",
            ),
            (
                "# a comment\ndomain: \"\"\n",
                2,
                "config file cannot have empty domain",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    limit: 5\n",
                4,
                "unknown field `limit`",
            ),
            (
                "domain: d\nquota_buckets:\n  - bucket_id: {a: b}\n    limit: 5\n",
                4,
                "unknown field `limit`",
            ),
            (
                "domain: d\ndescriptors:\n  - key: [\n",
                3,
                "invalid type: sequence",
            ),
            ("domain: d\n  descriptors: x\n", 2, ""),
            (
                "domain: d\ndescriptors:\n  - key: k\n  - key: k\n",
                4,
                "duplicate descriptor composite key 'd.k'",
            ),
            (
                "policies:\n  free:\n    - {per: 1s}\n",
                3,
                "policy 'free': a limit needs `limit`",
            ),
        ];
        crate::spec::assert_refused("limits.yaml", &cases, compile_text);
    }

    #[test]
    fn a_domain_or_a_policy_in_two_files_is_refused() {
        let cases = [
            (
                ["domain: d\n", "# again\ndomain: d\n"],
                "duplicate domain 'd' (first defined at a.yaml:1)",
            ),
            (
                [
                    "policies:\n  free: [{per: 1s, limit: 1}]\n",
                    "policies:\n  free: [{per: 1h, limit: 9}]\n",
                ],
                "duplicate policy 'free' (first defined at a.yaml:2)",
            ),
        ];
        for ([first, second], reason) in cases {
            let files = [
                (PathBuf::from("a.yaml"), first.to_owned()),
                (PathBuf::from("b.yaml"), second.to_owned()),
            ];
            let err = compile(&files).unwrap_err();
            let ConfigError::File {
                file,
                line,
                reason: why,
            } = &err
            else {
                panic!("not a file's error: {err}");
            };
            assert_eq!((file.as_str(), *line), ("b.yaml", 2), "{err}");
            assert!(why.contains(reason), "{err}");
        }
    }

    #[test]
    fn a_file_holds_a_domain_policies_or_both() {
        let rules = compile_text("policies:\n  free: [{per: 1s, limit: 1}]\n").unwrap();
        assert_eq!((rules.domain_count(), rules.policy_count()), (0, 1));
        let rules = compile_text(
            "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\nquota_default:\n  rate_limit: {unlimited: true}\npolicies:\n  free: [{per: 1s, limit: 1}]\n",
        )
        .unwrap();
        assert!(rules.has_domain("edge") && rules.policy("free").is_some());
        assert!(rules.quota("edge").is_some());
        let entries = [("k", "v")];
        assert_eq!(
            rules.find("edge", &entries).map(|found| found.rules.len()),
            Some(1)
        );
        // A domain without quota keys has no quota policies.
        let rules = compile_text("domain: plain\n").unwrap();
        assert!(rules.quota("plain").is_none());
    }
}
