//! The documentation's links hold: every relative link in README.md,
//! CONTRIBUTING.md, CHANGELOG.md, deploy/README.md and docs/*.md names a
//! file or folder that exists, and every `#anchor` a heading of the page it
//! points to (as GitHub names a heading's anchor). Links inside code are not links, and
//! are left alone. The lists kept by hand are held to the tree too:
//! CONTRIBUTING.md's layout names every file of `src/` and `benches/` and
//! every helper module of the integration tests (the `common/` folder under
//! `tests/`), and every path a comment of Cargo.toml names exists.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The repository's root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The pages checked: the README, CONTRIBUTING.md, CHANGELOG.md, deploy/'s
/// README and every page of docs/.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![
        root().join("README.md"),
        root().join("CONTRIBUTING.md"),
        root().join("CHANGELOG.md"),
        root().join("deploy/README.md"),
    ];
    let docs = std::fs::read_dir(root().join("docs")).expect("docs/");
    let mut in_docs: Vec<PathBuf> = docs
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "md"))
        .collect();
    in_docs.sort();
    assert!(!in_docs.is_empty(), "docs/ holds pages");
    pages.extend(in_docs);
    pages
}

/// `markdown` without its code: fenced blocks and inline code spans become
/// blanks, so that what looks like a link or a heading inside them is not
/// taken for one.
fn prose(markdown: &str) -> String {
    let mut out = String::with_capacity(markdown.len());
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            out.push('\n');
            continue;
        }
        if !fenced {
            let mut in_code = false;
            for c in line.chars() {
                if c == '`' {
                    in_code = !in_code;
                } else if !in_code {
                    out.push(c);
                }
            }
        }
        out.push('\n');
    }
    out
}

/// The anchor GitHub gives a heading: lowercased, every character but
/// letters, digits, spaces, `-` and `_` dropped, spaces made `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of `markdown`'s headings (code spans kept as text, as GitHub
/// keeps their words).
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut anchors = BTreeSet::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            let text = line.trim_start_matches('#');
            if text.starts_with(' ') {
                anchors.insert(anchor(text));
            }
        }
    }
    anchors
}

/// The targets of `markdown`'s inline links, `[text](target)`, outside code.
fn link_targets(markdown: &str) -> Vec<String> {
    prose(markdown)
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split_once(')').map(|(target, _)| target.to_owned()))
        .collect()
}

/// What is wrong with the link `target` on the page `page`, if anything.
fn broken(page: &Path, target: &str) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (path, fragment) = match target.split_once('#') {
        Some((path, fragment)) => (path, Some(fragment)),
        None => (target, None),
    };
    let file = if path.is_empty() {
        page.to_path_buf()
    } else {
        page.parent().expect("a page's folder").join(path)
    };
    if !file.exists() {
        return Some(format!("{target}: no {}", file.display()));
    }
    let fragment = fragment?;
    if file.extension().is_none_or(|extension| extension != "md") {
        return Some(format!(
            "{target}: an anchor into a file that is not a page"
        ));
    }
    let text = std::fs::read_to_string(&file).expect("read the linked page");
    let known = anchors(&text);
    (!known.contains(fragment)).then(|| {
        format!(
            "{target}: no heading #{fragment} in {} (its headings: {known:?})",
            file.display()
        )
    })
}

#[test]
fn every_relative_link_and_anchor_in_the_documentation_resolves() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("read a page");
        for target in link_targets(&text) {
            checked += 1;
            if let Some(problem) = broken(&page, &target) {
                problems.push(format!(
                    "{}: {problem}",
                    page.strip_prefix(root()).unwrap_or(&page).display()
                ));
            }
        }
    }
    assert!(checked > 50, "the pages' links were found ({checked})");
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn anchors_are_named_as_github_names_them() {
    for (heading, expected) in [
        (" Ask it something", "ask-it-something"),
        (
            " Migrating from envoyproxy/ratelimit",
            "migrating-from-envoyproxyratelimit",
        ),
        (" `ratelimitd --help`", "ratelimitd---help"),
        (
            " What Envoy 1.40's quota filter does",
            "what-envoy-140s-quota-filter-does",
        ),
    ] {
        assert_eq!(anchor(heading), expected, "{heading}");
    }
    assert_eq!(
        anchors("# A\n```\n# not a heading\n```\n## Costs, looks and retry_after\n#nope\n"),
        BTreeSet::from(["a".to_owned(), "costs-looks-and-retry_after".to_owned()])
    );
    assert_eq!(
        link_targets("[a](x.md) `[b](y.md)`\n```\n[c](z.md)\n```\n[d\ne](#f)"),
        ["x.md", "#f"]
    );
}

/// CONTRIBUTING.md's layout, the code block under its "Layout" heading.
fn layout() -> String {
    let contributing =
        std::fs::read_to_string(root().join("CONTRIBUTING.md")).expect("CONTRIBUTING.md");
    let section = contributing
        .split("## Layout\n")
        .nth(1)
        .expect("a Layout section");
    section
        .split("```")
        .nth(1)
        .expect("the layout's code block")
        .to_owned()
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("a source folder") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn the_layout_names_every_source_file_and_only_paths_that_exist() {
    let layout = layout();
    for word in layout.split_whitespace() {
        let path = word.trim_end_matches([',', ';', ')', ':']);
        if [
            "src/",
            "tests/",
            "proto/",
            "clients/",
            "benches/",
            "examples/",
            "deploy/",
            ".github/",
        ]
        .iter()
        .any(|prefix| path.starts_with(prefix))
        {
            assert!(
                root().join(path).exists(),
                "the layout names {path}, which is gone"
            );
        }
    }
    let mut missing = Vec::new();
    for file in files_under(&root().join("src")) {
        let name = file
            .file_name()
            .map(|name| name.to_string_lossy().into_owned());
        let stem = file
            .file_stem()
            .map(|stem| stem.to_string_lossy().into_owned());
        let (Some(name), Some(stem)) = (name, stem) else {
            continue;
        };
        if name == "mod.rs" {
            continue;
        }
        if !layout.contains(&name) && !layout.contains(&stem) {
            missing.push(
                file.strip_prefix(root())
                    .unwrap_or(&file)
                    .display()
                    .to_string(),
            );
        }
    }
    assert!(
        missing.is_empty(),
        "CONTRIBUTING.md's layout does not name: {missing:?}"
    );
}

/// The layout's entries, as (path, description): a line at the left margin
/// opens one, its first word the path it describes; the indented lines
/// under it go on with its description.
fn layout_entries(layout: &str) -> Vec<(String, String)> {
    let mut entries: Vec<(String, String)> = Vec::new();
    for line in layout.lines().filter(|line| !line.trim().is_empty()) {
        if line.starts_with(' ') {
            if let Some((_, description)) = entries.last_mut() {
                description.push(' ');
                description.push_str(line.trim());
            }
        } else {
            let (path, description) = line.split_once(' ').unwrap_or((line, ""));
            entries.push((path.to_owned(), description.trim().to_owned()));
        }
    }
    entries
}

/// The words the layout says about the folder `dir` (relative, ending in
/// `/`) and the folders in it, trimmed of the punctuation around them.
fn words_about(layout: &str, dir: &str) -> BTreeSet<String> {
    layout_entries(layout)
        .into_iter()
        .filter(|(path, _)| path.starts_with(dir))
        .flat_map(|(path, description)| {
            let words: Vec<String> = description
                .split_whitespace()
                .chain([path.as_str()])
                .map(|word| {
                    word.trim_matches(['(', ')', ',', ';', ':', '.', '`'])
                        .to_owned()
                })
                .collect();
            words
        })
        .collect()
}

/// The files under `dir` (relative to the root, ending in `/`) that the
/// layout's entries for `dir` do not name: a file by its name, a `mod.rs`
/// by its folder's (`redis/`), the folder's own `mod.rs` by the entry.
fn unnamed_in(layout: &str, dir: &str) -> Vec<String> {
    let words = words_about(layout, dir);
    let mut unnamed = Vec::new();
    for file in files_under(&root().join(dir)) {
        let relative = file.strip_prefix(root().join(dir)).expect("under dir");
        let name = relative
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        let named = match (name.as_str(), relative.parent()) {
            ("mod.rs", Some(parent)) if parent.as_os_str().is_empty() => true,
            ("mod.rs", Some(parent)) => {
                let folder = parent.file_name().unwrap_or_default().to_string_lossy();
                words.contains(&format!("{folder}/"))
            }
            _ => words.contains(&name),
        };
        if !named {
            unnamed.push(format!("{dir}{}", relative.display()));
        }
    }
    unnamed.sort();
    unnamed
}

/// The folders named `common` under `tests/`, at any depth (fixtures
/// aside): where the integration tests keep their helpers.
fn test_helper_folders() -> Vec<String> {
    fn walk(dir: &Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("a tests/ folder") {
            let path = entry.expect("an entry").path();
            let name = path.file_name().unwrap_or_default();
            if !path.is_dir() || name == "fixtures" {
                continue;
            }
            if name == "common" {
                let relative = path.strip_prefix(root()).expect("under the root");
                found.push(format!("{}/", relative.display()));
            }
            walk(&path, found);
        }
    }
    let mut found = Vec::new();
    walk(&root().join("tests"), &mut found);
    found.sort();
    found
}

#[test]
fn the_layout_names_every_bench_and_every_test_helper() {
    let layout = layout();
    let helpers = test_helper_folders();
    assert!(!helpers.is_empty(), "tests/ keeps its helpers in a common/");
    let mut unnamed = unnamed_in(&layout, "benches/");
    for folder in &helpers {
        unnamed.extend(unnamed_in(&layout, folder));
    }
    assert!(
        unnamed.is_empty(),
        "CONTRIBUTING.md's layout, in its entries for benches/ and {helpers:?}, does not name: {unnamed:?}"
    );
}

/// The repository's paths that Cargo.toml's comments name: words of a
/// comment that start with one of the repository's folders.
fn paths_in_cargo_comments() -> Vec<String> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).expect("Cargo.toml");
    let folders = [
        "src/",
        "tests/",
        "benches/",
        "examples/",
        "docs/",
        "proto/",
        "clients/",
        "deploy/",
        "assets/",
    ];
    manifest
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix('#'))
        .flat_map(str::split_whitespace)
        .map(|word| {
            word.trim_matches(['(', ')', ',', ';', ':', '.', '`'])
                .to_owned()
        })
        .filter(|word| folders.iter().any(|folder| word.starts_with(folder)))
        .collect()
}

#[test]
fn every_path_a_cargo_toml_comment_names_exists() {
    let paths = paths_in_cargo_comments();
    assert!(
        paths.len() >= 3,
        "Cargo.toml's comments name some paths ({paths:?})"
    );
    let gone: Vec<&String> = paths
        .iter()
        .filter(|path| !root().join(path).exists())
        .collect();
    assert!(
        gone.is_empty(),
        "Cargo.toml's comments name paths that are gone: {gone:?}"
    );
}

#[test]
fn a_layout_entry_runs_on_over_its_indented_lines() {
    let layout = "benches/   a.sh and\n           b.sh\nsrc/x.rs   other\n";
    assert_eq!(
        layout_entries(layout),
        [
            ("benches/".to_owned(), "a.sh and b.sh".to_owned()),
            ("src/x.rs".to_owned(), "other".to_owned()),
        ]
    );
    let words = words_about(layout, "benches/");
    assert!(words.contains("a.sh") && words.contains("b.sh") && !words.contains("other"));
}
