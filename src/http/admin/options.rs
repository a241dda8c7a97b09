//! The admin API's options: its bearer token, given itself or as a file
//! holding it. Without one the admin API is not served at all.

use std::path::PathBuf;

use crate::config_error::ConfigError;
use crate::options::Secret;

/// The shortest token taken: long enough that guessing is hopeless.
pub(crate) const MIN_TOKEN_LENGTH: usize = 16;

/// The admin API's token.
#[derive(Clone, Debug, PartialEq, clap::Args)]
#[command(next_help_heading = "Admin API")]
pub struct AdminOptions {
    /// Serve the admin API (`/admin/v1/...` on the HTTP listener: peek at
    /// and reset a key, list the rules, policies and quota buckets, show
    /// this configuration) to callers that send `Authorization: Bearer
    /// <this token>`. At least 16 characters, e.g. `openssl rand -hex 32`.
    /// Unset (and no --admin-token-file): no admin API.
    #[arg(
        long,
        env = "RATELIMITD_ADMIN_TOKEN",
        conflicts_with = "admin_token_file"
    )]
    pub admin_token: Option<Secret>,

    /// As --admin-token, read from this file at start (a trailing newline
    /// is not part of it), so that the token stays out of the environment
    /// and the process list: a Kubernetes Secret mounted as a file.
    #[arg(long, env = "RATELIMITD_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
}

impl AdminOptions {
    /// The token, read from its file if given so (the error names the
    /// flag), or none: no admin API.
    pub fn token(&self) -> Result<Option<Secret>, ConfigError> {
        if let Some(path) = &self.admin_token_file {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Unreadable {
                flag: "admin_token_file",
                path: path.clone(),
                source,
            })?;
            let token = text
                .strip_suffix('\n')
                .map(|line| line.strip_suffix('\r').unwrap_or(line))
                .unwrap_or(&text);
            return checked("admin_token_file", token).map(Some);
        }
        match &self.admin_token {
            Some(token) => checked("admin_token", token.expose()).map(Some),
            None => Ok(None),
        }
    }
}

/// `token` as a token, or why not (never quoting it).
fn checked(flag: &'static str, token: &str) -> Result<Secret, ConfigError> {
    let what = if flag == "admin_token_file" {
        "the token in the file"
    } else {
        "the token"
    };
    if token.is_empty() {
        return Err(ConfigError::invalid(flag, format!("{what} is empty")));
    }
    if token.chars().count() < MIN_TOKEN_LENGTH {
        return Err(ConfigError::invalid(
            flag,
            format!(
                "{what} must be at least {MIN_TOKEN_LENGTH} characters (e.g. `openssl rand -hex 32`)"
            ),
        ));
    }
    if !token.chars().all(|c| c.is_ascii_graphic()) {
        return Err(ConfigError::invalid(
            flag,
            format!("{what} must be printable ASCII without spaces (it is sent in an HTTP header)"),
        ));
    }
    Ok(Secret::from(token.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(token: Option<&str>, file: Option<PathBuf>) -> AdminOptions {
        AdminOptions {
            admin_token: token.map(|token| Secret::from(token.to_owned())),
            admin_token_file: file,
        }
    }

    #[test]
    fn a_token_is_given_or_read_from_a_file_and_bad_ones_are_refused_without_quoting_them() {
        assert!(options(None, None).token().unwrap().is_none());
        let given = options(Some("0123456789abcdef"), None).token().unwrap();
        assert_eq!(given.unwrap().expose(), "0123456789abcdef");
        for (bad, rule) in [
            ("", "is empty"),
            ("short-secret", "at least 16"),
            ("0123456789 abcdef", "printable ASCII"),
        ] {
            let err = options(Some(bad), None).token().unwrap_err().to_string();
            assert!(
                err.starts_with("--admin-token: ") && err.contains(rule),
                "{err}"
            );
            assert!(bad.is_empty() || !err.contains(bad), "{err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "0123456789abcdef-from-a-file\r\n").unwrap();
        let read = options(None, Some(file.clone())).token().unwrap().unwrap();
        assert_eq!(read.expose(), "0123456789abcdef-from-a-file");
        std::fs::write(&file, "\n").unwrap();
        let err = options(None, Some(file)).token().unwrap_err().to_string();
        assert!(
            err.starts_with("--admin-token-file: the token in the file is empty"),
            "{err}"
        );
        let missing = options(None, Some(dir.path().join("none")))
            .token()
            .unwrap_err();
        assert!(
            missing
                .to_string()
                .starts_with("--admin-token-file: cannot read"),
            "{missing}"
        );
    }
}
