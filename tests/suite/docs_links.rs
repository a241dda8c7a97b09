//! The documentation's links hold: every relative link in README.md,
//! CONTRIBUTING.md, deploy/README.md and docs/*.md names a file or folder
//! that exists, and every `#anchor` a heading of the page it points to (as
//! GitHub names a heading's anchor). Links inside code are not links, and
//! are left alone.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The repository's root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The pages checked: the README, CONTRIBUTING.md, deploy/'s README and
/// every page of docs/.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![
        root().join("README.md"),
        root().join("CONTRIBUTING.md"),
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
