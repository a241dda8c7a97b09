//! The documentation installs the clients from what this repository builds:
//! no Markdown file tells a reader to install `ratelimitd-client` (or
//! `ratelimitd_client`) by name from a package registry, where this project
//! has published nothing and whoever registers the name would be installed.
//! Install commands must name the tarball, the wheel or the folder instead.
//! Commands are read from fenced code blocks and inline code spans.

use crate::common;

use std::path::Path;

use common::markdown::{code, markdown_files};

/// The repository's root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Whether `token` (a word of a shell command, quotes removed) names our
/// package on a registry: the name (`-`, `_` and `.` alike, any case),
/// maybe with extras and a version, and nothing that makes it a file.
fn names_our_package(token: &str) -> bool {
    let lower = token.to_lowercase();
    let Some(rest) = [
        "ratelimitd-client",
        "ratelimitd_client",
        "ratelimitd.client",
    ]
    .iter()
    .find_map(|name| lower.strip_prefix(name)) else {
        return false;
    };
    let rest = match rest.strip_prefix('[') {
        Some(extras) => match extras.split_once(']') {
            Some((_, after)) => after,
            None => return false,
        },
        None => rest,
    };
    // Nothing, or a version requirement (`@0.1.0`, `==0.1.0`, `>=0.1`).
    rest.is_empty() || rest.starts_with(['@', '=', '<', '>', '~', '!'])
}

/// The commands of `code` that install our package from a registry.
fn registry_installs(code: &str) -> Vec<String> {
    let mut bad = Vec::new();
    let code = code.split('#').next().unwrap_or_default();
    for command in code.split([';', '|', '&', '(', ')']) {
        let words: Vec<String> = command
            .split_whitespace()
            .map(|w| w.trim_matches(['"', '\'']).to_string())
            .collect();
        let verb = words.iter().enumerate().position(|(i, word)| {
            let next = words.get(i + 1).map(String::as_str);
            match word.as_str() {
                "npm" | "pnpm" | "yarn" => matches!(next, Some("install" | "i" | "add")),
                "pip" | "pip3" | "pipx" | "uv" => {
                    matches!(next, Some("install" | "add" | "download"))
                }
                _ => false,
            }
        });
        let Some(verb) = verb else { continue };
        let arguments = words.iter().skip(verb + 2).filter(|w| !w.starts_with('-'));
        if arguments.into_iter().any(|w| names_our_package(w)) {
            bad.push(command.trim().to_string());
        }
    }
    bad
}

#[test]
fn the_detector_knows_a_registry_install_from_a_built_artifact() {
    for bad in [
        "npm install ratelimitd-client",
        "npm i ratelimitd-client express",
        "npm install express ratelimitd-client@0.1.0",
        "pip install ratelimitd-client",
        "pip install \"ratelimitd-client[asgi]\" uvicorn",
        "pip install ratelimitd_client==0.1.0",
        "python -m pip install --upgrade 'Ratelimitd_Client[asgi]'",
        "cd app && pip3 install ratelimitd-client",
    ] {
        assert!(!registry_installs(bad).is_empty(), "not flagged: {bad}");
    }
    for good in [
        "npm install /path/to/ratelimitd/clients/node/ratelimitd-client-0.1.0.tgz express",
        "npm install ratelimitd-client-0.1.0.tgz",
        "pip install \"ratelimitd_client-0.1.0-py3-none-any.whl[asgi]\"",
        "pip install \"./clients/python[asgi]\"",
        "pip install \"$(ls dist/ratelimitd_client-*.whl)[asgi]\"",
        "pip install -e \"./clients/python[test]\"",
        "npm pack # writes ratelimitd-client-0.1.0.tgz; npm install ratelimitd-client",
        "require('ratelimitd-client')",
    ] {
        assert!(registry_installs(good).is_empty(), "flagged: {good}");
    }
    let spans = code(
        "Run `npm install\n  ratelimitd-client` in your app.\n\n```sh\npip install \\\n  ratelimitd_client\n```\n",
    );
    assert_eq!(spans.len(), 2, "{spans:?}");
    assert_eq!(spans[0].0, 1);
    assert_eq!(spans[1].0, 5);
    assert!(
        spans
            .iter()
            .all(|(_, text)| !registry_installs(text).is_empty()),
        "{spans:?}"
    );
}

#[test]
fn no_markdown_file_installs_our_packages_from_a_registry() {
    let mut files = Vec::new();
    markdown_files(root(), &mut files);
    files.sort();
    for expected in [
        "README.md",
        "CONTRIBUTING.md",
        "deploy/README.md",
        "clients/node/README.md",
        "clients/python/README.md",
        "docs/api.md",
    ] {
        assert!(
            files.contains(&root().join(expected)),
            "{expected} is not among the files checked"
        );
    }
    let mut problems = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file)
            .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let shown = file
            .strip_prefix(root())
            .unwrap_or(file)
            .display()
            .to_string();
        for (line, piece) in code(&text) {
            for command in registry_installs(&piece) {
                problems.push(format!("{shown}:{line}: `{command}`"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "these commands install ratelimitd-client by name from a registry, where this project has \
         published nothing; name the artifact built from this repository instead (the .tgz from \
         `npm pack`, the .whl from `pip wheel`, or the folder):\n{}",
        problems.join("\n")
    );
}
