//! The quota service's policies files as the tests write them: one
//! `quota.yaml` in a test's own directory, passed to `--config`.

use std::path::Path;

/// Writes `text` as the policies file in `dir`; returns the file's path.
pub(crate) fn write_policies(dir: &Path, text: &str) -> String {
    let path = dir.join("quota.yaml");
    std::fs::write(&path, text).expect("write the policies");
    path.to_string_lossy().into_owned()
}

/// The policies of a domain with one bucket, `{name: api}`, at
/// `requests_per_second`.
pub(crate) fn api_bucket(domain: &str, requests_per_second: u32) -> String {
    format!(
        "domain: {domain}\nquota_buckets:\n  - bucket_id: {{name: api}}\n    \
         rate_limit: {{unit: second, requests_per_unit: {requests_per_second}}}\n"
    )
}
