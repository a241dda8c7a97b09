//! The runtime directory: which files a `--config` path names, and their
//! text. A file is read alone; a directory gives its `*.yaml` / `*.yml`
//! files, or with [`FileSelection::every_file`] every file in it and its
//! subdirectories (as upstream's runtime loader), in path order. Names
//! starting with `.` are skipped unless [`FileSelection::dotfiles`]: a
//! Kubernetes ConfigMap volume keeps its data in `..data` and
//! `..<timestamp>` entries, with the visible names linking into them.

use std::path::{Path, PathBuf};

use walkdir::{DirEntry, WalkDir};

use crate::config_error::ConfigError;

/// Which files of a configuration directory are read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileSelection {
    /// Every file in the directory and its subdirectories (as upstream's
    /// runtime loader), not only `*.yaml` / `*.yml` directly in it.
    pub every_file: bool,
    /// Names starting with `.` too.
    pub dotfiles: bool,
}

/// Deepest subdirectory read with [`FileSelection::every_file`]: a bound
/// on the walk whatever links it follows.
const MAX_DEPTH: usize = 16;

/// The files a `--config` path names, each with its content.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Files {
    /// Each file read: its path and its text.
    pub files: Vec<(PathBuf, String)>,
}

impl Files {
    /// Reads `path`: a file, or the files of a directory that `selection`
    /// names, in path order.
    pub(crate) fn read(path: &Path, selection: FileSelection) -> Result<Self, ConfigError> {
        let metadata = std::fs::metadata(path).map_err(|err| unreadable(path, &err))?;
        let paths = if metadata.is_dir() {
            selected(path, selection)?
        } else {
            vec![path.to_owned()]
        };
        let mut files = Vec::with_capacity(paths.len());
        for file in paths {
            let text = std::fs::read_to_string(&file).map_err(|err| unreadable(&file, &err))?;
            files.push((file, text));
        }
        Ok(Self { files })
    }
}

/// The error for a file or directory `path` that cannot be read.
fn unreadable(path: &Path, err: &dyn std::fmt::Display) -> ConfigError {
    ConfigError::in_file(
        &path.display().to_string(),
        0,
        format!("cannot read: {err}"),
    )
}

/// The files of `directory` that `selection` names, in path order: the
/// walk visits each directory's entries sorted by name, depth first, which
/// is the order of their whole paths. Links are followed, to files and to
/// directories; a link that leads back to a directory above it is refused.
fn selected(directory: &Path, selection: FileSelection) -> Result<Vec<PathBuf>, ConfigError> {
    let max_depth = if selection.every_file {
        MAX_DEPTH + 1
    } else {
        1
    };
    let hidden = |entry: &DirEntry| entry.file_name().to_string_lossy().starts_with('.');
    let walk = WalkDir::new(directory)
        .follow_links(true)
        .min_depth(1)
        .max_depth(max_depth)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|entry| selection.dotfiles || entry.depth() == 0 || !hidden(entry));
    let mut paths = Vec::new();
    for entry in walk {
        let entry = match entry {
            Ok(entry) => entry,
            Err(err) => {
                let at = err.path().unwrap_or(directory);
                // An entry that cannot be looked at (a broken link, or one
                // removed meanwhile) is no file, and is passed over; a
                // directory that cannot be listed, or a loop, is an error.
                if err.loop_ancestor().is_none() && !at.is_dir() {
                    continue;
                }
                return Err(match err.io_error() {
                    Some(io) => unreadable(at, io),
                    None => unreadable(at, &err),
                });
            }
        };
        let name = entry.file_name().to_string_lossy();
        let is_yaml = name.ends_with(".yaml") || name.ends_with(".yml");
        if entry.file_type().is_file() && (is_yaml || selection.every_file) {
            paths.push(entry.into_path());
        }
    }
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(root: &Path, selection: FileSelection) -> Vec<String> {
        let files = Files::read(root, selection).unwrap();
        files
            .files
            .iter()
            .map(|(path, _)| {
                let relative = path.strip_prefix(root).unwrap();
                relative.display().to_string()
            })
            .collect()
    }

    fn tree(files: &[&str]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        for file in files {
            let path = root.path().join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, file).unwrap();
        }
        root
    }

    #[test]
    fn yaml_files_in_the_directory_by_default_every_file_below_it_on_demand() {
        let root = tree(&[
            "b.yaml",
            "a.yml",
            "notes.txt",
            ".hidden.yaml",
            "a/z.yaml",
            "a/.h/x",
            ".d/y.yaml",
        ]);
        let path = root.path();
        assert_eq!(names(path, FileSelection::default()), ["a.yml", "b.yaml"]);
        let every_file = FileSelection {
            every_file: true,
            dotfiles: false,
        };
        // Path order: `a/z.yaml` before `a.yml`, as whole paths sort.
        assert_eq!(
            names(path, every_file),
            ["a/z.yaml", "a.yml", "b.yaml", "notes.txt"]
        );
        let everything = FileSelection {
            every_file: true,
            dotfiles: true,
        };
        assert_eq!(
            names(path, everything),
            [
                ".d/y.yaml",
                ".hidden.yaml",
                "a/.h/x",
                "a/z.yaml",
                "a.yml",
                "b.yaml",
                "notes.txt"
            ]
        );
        let single = path.join("b.yaml");
        let files = Files::read(&single, FileSelection::default()).unwrap();
        assert_eq!(files.files, [(single, "b.yaml".to_owned())]);
    }

    #[test]
    fn links_are_followed_broken_ones_skipped_and_loops_refused() {
        let root = tree(&["data/limits.yaml"]);
        let path = root.path();
        std::os::unix::fs::symlink("data/limits.yaml", path.join("limits.yaml")).unwrap();
        std::os::unix::fs::symlink("gone.yaml", path.join("broken.yaml")).unwrap();
        assert_eq!(names(path, FileSelection::default()), ["limits.yaml"]);
        let every_file = FileSelection {
            every_file: true,
            dotfiles: false,
        };
        assert_eq!(names(path, every_file), ["data/limits.yaml", "limits.yaml"]);
        std::os::unix::fs::symlink("..", path.join("data/up")).unwrap();
        let err = Files::read(path, every_file).unwrap_err();
        let ConfigError::File { file, reason, .. } = &err else {
            panic!("not a file's error: {err}");
        };
        assert!(file.ends_with("data/up"), "{err}");
        assert!(
            reason.starts_with("cannot read: File system loop found"),
            "{err}"
        );
        assert_eq!(
            names(path, FileSelection::default()),
            ["limits.yaml"],
            "only the top directory is read by default"
        );
    }

    #[test]
    fn a_missing_path_names_itself() {
        let root = tree(&[]);
        let missing = root.path().join("missing");
        let err = Files::read(&missing, FileSelection::default()).unwrap_err();
        let ConfigError::File { file, line, reason } = err else {
            panic!("not a file's error: {err}");
        };
        assert_eq!((file, line), (missing.display().to_string(), 0));
        assert!(reason.starts_with("cannot read: "), "{reason}");
    }

    #[test]
    fn subdirectories_deeper_than_the_bound_are_not_read() {
        let deepest = format!("{}f", "d/".repeat(MAX_DEPTH));
        let too_deep = format!("{}g", "d/".repeat(MAX_DEPTH + 1));
        let root = tree(&[&deepest, &too_deep]);
        let every_file = FileSelection {
            every_file: true,
            dotfiles: false,
        };
        assert_eq!(names(root.path(), every_file), [deepest]);
    }
}
