//! An OpenAPI document checked by openapi-spec-validator (the suite's own
//! install, `tools.rs`).

use std::path::PathBuf;
use std::process::Command;

use super::tools;

/// openapi-spec-validator's path.
pub(crate) fn validator() -> PathBuf {
    tools::tool("openapi-spec-validator")
}

/// Panics, with the validator's words, unless `document` is valid OpenAPI.
pub(crate) fn assert_valid(document: &str) {
    let file = tempfile::NamedTempFile::new().expect("a file");
    std::fs::write(file.path(), document).expect("write the document");
    let checked = Command::new(validator())
        .arg(file.path())
        .output()
        .expect("run openapi-spec-validator");
    assert!(
        checked.status.success(),
        "openapi-spec-validator: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
}
