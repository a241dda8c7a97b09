//! What the operator configured wrong, and where: the one error of the
//! rules files, the options and the command line. Each names the place (a
//! file and its line, a flag, upstream's variables) and the rule broken.

use std::path::PathBuf;

use crate::config::upstream::ParseError;

/// A configuration that cannot be used, and where.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A rules file breaks a rule at a line, or as a whole (line 0: also
    /// a file or directory that cannot be read).
    #[error("{file}{}: {reason}", at_line(*line))]
    File {
        /// The file, as named in the configuration directory.
        file: String,
        /// 1-based; 0 when the error concerns the whole file or directory.
        line: u64,
        /// What is wrong.
        reason: String,
    },
    /// An option's value breaks a rule of its flag (or of flags together).
    #[error("--{}: {rule}", long(flag))]
    Invalid {
        /// The flag's id (its long name with `_` for `-`).
        flag: &'static str,
        /// What is wrong.
        rule: String,
    },
    /// A file a flag names cannot be read.
    #[error("--{}: cannot read {}: {source}", long(flag), path.display())]
    Unreadable {
        /// The flag's id.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// An option's error, when upstream's variables set its flag: they
    /// are named, since the operator wrote them rather than the flag.
    #[error("{error} (set by {set_by})")]
    SetBy {
        /// The option's error.
        error: Box<ConfigError>,
        /// The variables.
        set_by: String,
    },
    /// The command line or upstream's variables do not parse.
    #[error(transparent)]
    Parse(#[from] ParseError),
}

impl ConfigError {
    /// `reason` at `line` of the rules file `file` (0: the whole file).
    pub fn in_file(file: &str, line: u64, reason: impl Into<String>) -> Self {
        Self::File {
            file: file.to_owned(),
            line,
            reason: reason.into(),
        }
    }

    /// The value of `flag` breaks `rule`.
    pub fn invalid(flag: &'static str, rule: impl Into<String>) -> Self {
        Self::Invalid {
            flag,
            rule: rule.into(),
        }
    }

    /// The id of the flag at fault, if a flag is.
    pub fn flag(&self) -> Option<&'static str> {
        match self {
            Self::Invalid { flag, .. } | Self::Unreadable { flag, .. } => Some(flag),
            Self::SetBy { error, .. } => error.flag(),
            Self::File { .. } | Self::Parse(_) => None,
        }
    }

    /// This error, naming `set_by` (the upstream variables that set its
    /// flag) when they did.
    pub fn set_by(self, set_by: Option<&str>) -> Self {
        match set_by {
            Some(set_by) => Self::SetBy {
                error: Box::new(self),
                set_by: set_by.to_owned(),
            },
            None => self,
        }
    }
}

/// `:line` after a file's name, or nothing for the whole file (line 0).
fn at_line(line: u64) -> String {
    if line == 0 {
        String::new()
    } else {
        format!(":{line}")
    }
}

/// A flag's id as written on the command line, without its `--`.
fn long(flag: &str) -> String {
    flag.replace('_', "-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_names_its_place_then_the_rule() {
        assert_eq!(
            ConfigError::in_file("a.yaml", 0, "cannot read").to_string(),
            "a.yaml: cannot read"
        );
        assert_eq!(
            ConfigError::in_file("a.yaml", 3, "config file cannot have empty domain").to_string(),
            "a.yaml:3: config file cannot have empty domain"
        );
        let invalid = ConfigError::invalid("redis_url", "is empty");
        assert_eq!(invalid.flag(), Some("redis_url"));
        assert_eq!(invalid.to_string(), "--redis-url: is empty");
        let set_by = invalid.set_by(Some("REDIS_URL"));
        assert_eq!(set_by.flag(), Some("redis_url"));
        assert_eq!(
            set_by.to_string(),
            "--redis-url: is empty (set by REDIS_URL)"
        );
        let unreadable = ConfigError::Unreadable {
            flag: "admin_token_file",
            path: PathBuf::from("/no/such"),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        assert!(
            unreadable
                .to_string()
                .starts_with("--admin-token-file: cannot read /no/such: "),
            "{unreadable}"
        );
        assert!(std::error::Error::source(&unreadable).is_some());
        assert_eq!(ConfigError::in_file("a.yaml", 1, "x").flag(), None);
    }
}
