//! The documentation's code, read from its Markdown as a reader sees it:
//! the repository's Markdown files, a section by its heading, the fenced
//! blocks in it, each command of a shell block (lines ending in `\` joined
//! to the next), and every piece of code, inline spans included.

use std::path::{Path, PathBuf};

/// The part of `document` from the heading `heading` (written whole, such
/// as `## Ask it something`) to the next heading of the same level.
pub(crate) fn section<'a>(document: &'a str, heading: &str) -> &'a str {
    let level = heading.split(' ').next().unwrap_or("##");
    document
        .split(&format!("\n{heading}\n"))
        .nth(1)
        .and_then(|rest| rest.split(&format!("\n{level} ")).next())
        .unwrap_or_else(|| panic!("no section {heading:?}"))
}

/// The contents of every block of `section` fenced as ```` ```fence ````.
pub(crate) fn blocks<'a>(section: &'a str, fence: &str) -> Vec<&'a str> {
    section
        .split(&format!("```{fence}\n"))
        .skip(1)
        .filter_map(|rest| rest.split("\n```").next())
        .collect()
}

/// The commands of a shell block: one a line, a line ending in `\` joined
/// to the next as the shell joins them.
pub(crate) fn commands(block: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut current = String::new();
    for line in block.lines() {
        match line.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(line);
                if !current.trim().is_empty() {
                    commands.push(std::mem::take(&mut current));
                }
                current.clear();
            }
        }
    }
    commands
}

/// The one block of `text` (a document or a section of it) fenced as
/// `fence` whose text contains `containing`.
pub(crate) fn block_with<'a>(text: &'a str, fence: &str, containing: &str) -> &'a str {
    let found: Vec<&str> = blocks(text, fence)
        .into_iter()
        .filter(|block| block.contains(containing))
        .collect();
    assert_eq!(found.len(), 1, "one ```{fence} block with {containing:?}");
    found[0]
}

/// Every Markdown file of the repository, outside build output, installed
/// dependencies and hidden folders.
pub(crate) fn markdown_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if path.is_dir() {
            let skipped = name.starts_with('.')
                || matches!(name, "target" | "node_modules" | "build" | "dist")
                || name.ends_with(".egg-info");
            if !skipped {
                markdown_files(&path, found);
            }
        } else if name.ends_with(".md") {
            found.push(path);
        }
    }
}

/// The code of `markdown`, each piece with the line it starts on: every
/// line of a fenced block (lines ending in `\` joined to the next), and
/// every inline code span (which may run over lines of a paragraph).
pub(crate) fn code(markdown: &str) -> Vec<(usize, String)> {
    let mut pieces = Vec::new();
    let mut fenced = false;
    let mut continued: Option<(usize, String)> = None;
    let mut span: Option<(usize, String)> = None;
    for (index, line) in markdown.lines().enumerate() {
        let number = index + 1;
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            let (start, mut joined) = continued.take().unwrap_or((number, String::new()));
            match line.strip_suffix('\\') {
                Some(head) => {
                    joined.push_str(head);
                    joined.push(' ');
                    continued = Some((start, joined));
                }
                None => {
                    joined.push_str(line);
                    pieces.push((start, joined));
                }
            }
            continue;
        }
        if line.trim().is_empty() {
            span = None; // an inline code span ends with its paragraph
            continue;
        }
        for c in line.chars() {
            match (&mut span, c) {
                (Some(_), '`') => pieces.extend(span.take()),
                (None, '`') => span = Some((number, String::new())),
                (Some((_, text)), c) => text.push(c),
                (None, _) => {}
            }
        }
        if let Some((_, text)) = &mut span {
            text.push(' ');
        }
    }
    pieces
}
