//! The shape of `src/` that keeps it readable, checked: every file says
//! what it is for in a `//!` line, no file is over 600 lines, no function
//! over 80, and no two modules import each other (directly or round a
//! loop; a module and the modules inside it are one family, not a loop).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 600;
const MAX_FUNCTION_LINES: usize = 80;

/// Every `.rs` file under `src/`, with its text.
fn sources() -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, files: &mut Vec<(PathBuf, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("read src/")
            .map(|entry| entry.expect("entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, files);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                let text = std::fs::read_to_string(&path).expect("read a source file");
                files.push((path, text));
            }
        }
    }
    let mut files = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    files
}

fn relative(path: &Path) -> String {
    path.strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn every_file_says_what_it_is_for_and_stays_small() {
    let mut faults = Vec::new();
    for (path, text) in sources() {
        if !text.trim_start().starts_with("//!") {
            faults.push(format!("{}: no `//!` line at the top", relative(&path)));
        }
        let lines = text.lines().count();
        if lines > MAX_FILE_LINES {
            faults.push(format!("{}: {lines} lines", relative(&path)));
        }
    }
    assert!(faults.is_empty(), "{}", faults.join("\n"));
}

/// A line without its `//` comment and with its string and character
/// literals emptied, so that braces in them do not count.
fn code_of(line: &str) -> String {
    let mut code = String::new();
    let mut chars = line.chars().peekable();
    while let Some(ch) = chars.next() {
        match ch {
            '/' if chars.peek() == Some(&'/') => break,
            '"' => {
                while let Some(inner) = chars.next() {
                    match inner {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
                code.push_str("\"\"");
            }
            '\'' => {
                // A character literal ('x', '\n', '{'), not a lifetime.
                let rest: String = chars.clone().take(3).collect();
                let literal = rest.starts_with('\\') || rest.chars().nth(1) == Some('\'');
                if literal {
                    for inner in chars.by_ref() {
                        if inner == '\'' {
                            break;
                        }
                    }
                    code.push_str("''");
                } else {
                    code.push(ch);
                }
            }
            _ => code.push(ch),
        }
    }
    code
}

/// `fn name` at the start of a line, with its visibility and qualifiers.
fn function_name(line: &str) -> Option<&str> {
    let mut words = line.split_whitespace().peekable();
    while let Some(word) = words.next() {
        match word {
            "fn" => {
                return words
                    .next()
                    .map(|name| name.split(['(', '<']).next().unwrap_or(name));
            }
            "pub" | "async" | "const" | "unsafe" | "extern" => {}
            word if word.starts_with("pub(") => {}
            _ => return None,
        }
    }
    None
}

#[test]
fn no_function_is_over_80_lines() {
    let mut faults = Vec::new();
    for (path, text) in sources() {
        let lines: Vec<String> = text.lines().map(code_of).collect();
        for (start, line) in lines.iter().enumerate() {
            let Some(name) = function_name(line) else {
                continue;
            };
            let mut depth = 0i32;
            let mut opened = false;
            for (end, body) in lines.iter().enumerate().skip(start) {
                for ch in body.chars() {
                    match ch {
                        '{' => {
                            depth += 1;
                            opened = true;
                        }
                        '}' => depth -= 1,
                        _ => {}
                    }
                }
                if !opened && body.contains(';') {
                    break; // a declaration without a body
                }
                if opened && depth == 0 {
                    let length = end - start + 1;
                    if length > MAX_FUNCTION_LINES {
                        faults.push(format!(
                            "{}:{}: fn {name} is {length} lines",
                            relative(&path),
                            start + 1
                        ));
                    }
                    break;
                }
            }
        }
    }
    assert!(faults.is_empty(), "{}", faults.join("\n"));
}

/// A file's module path (`["api", "envoy", "rules"]`); `lib.rs`, `main.rs`
/// and a binary's `main.rs` are roots of their own crates.
fn module_of(path: &Path) -> Option<Vec<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let relative = path.strip_prefix(&src).ok()?;
    let mut parts: Vec<String> = relative
        .iter()
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    if parts.first().is_some_and(|first| first == "bin") {
        return None; // the load generator is a crate of its own
    }
    let file = parts.pop()?;
    match file.as_str() {
        "lib.rs" | "main.rs" => return None,
        "mod.rs" => {}
        other => parts.push(other.trim_end_matches(".rs").to_owned()),
    }
    Some(parts)
}

/// The paths a use tree names: `a::{b, c::{d, e}}` is `a::b`, `a::c::d`
/// and `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.split(" as ").next().unwrap_or(tree).trim().to_owned()];
    };
    let prefix = &tree[..open];
    let inner = tree[open + 1..].trim_end().trim_end_matches('}');
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (at, ch) in inner.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items
        .into_iter()
        .filter(|item| !item.trim().is_empty())
        .flat_map(|item| {
            expand(item)
                .into_iter()
                .map(|path| format!("{prefix}{path}"))
        })
        .collect()
}

/// The module a `crate::` or `super::` path (seen in module `module`)
/// names: the longest known module along it.
fn target(module: &[String], path: &str, known: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let (mut base, rest) = if let Some(rest) = path.strip_prefix("crate::") {
        (Vec::new(), rest)
    } else if path.starts_with("super::") {
        (module.to_vec(), path)
    } else {
        return None;
    };
    let mut segments = rest.split("::").map(str::trim).peekable();
    while segments.peek() == Some(&"super") {
        segments.next();
        base.pop();
    }
    let mut best = None;
    for segment in segments {
        base.push(segment.to_owned());
        if known.contains(&base) {
            best = Some(base.clone());
        }
    }
    best
}

/// The modules `text` (of the module `module`) names: in its `use` trees
/// and in `crate::` / `super::` paths written in its code.
fn imports(module: &[String], text: &str, known: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let code: String = text.lines().map(code_of).collect::<Vec<_>>().join("\n");
    let mut paths = Vec::new();
    for statement in code.split(';') {
        let statement = statement.trim();
        let tree = statement
            .strip_prefix("pub use ")
            .or_else(|| statement.strip_prefix("pub(crate) use "))
            .or_else(|| statement.strip_prefix("pub(super) use "))
            .or_else(|| statement.strip_prefix("use "));
        if let Some(tree) = tree {
            paths.extend(expand(&tree.replace('\n', " ")));
        }
    }
    for (at, _) in code
        .match_indices("crate::")
        .chain(code.match_indices("super::"))
    {
        let boundary = code[..at]
            .chars()
            .last()
            .is_none_or(|before| !(before.is_alphanumeric() || before == '_' || before == ':'));
        if boundary {
            let path: String = code[at..]
                .chars()
                .take_while(|ch| ch.is_alphanumeric() || *ch == '_' || *ch == ':')
                .collect();
            paths.push(path);
        }
    }
    paths
        .iter()
        .filter_map(|path| target(module, path, known))
        .collect()
}

#[test]
fn no_two_modules_import_each_other() {
    let files: Vec<(Vec<String>, String)> = sources()
        .into_iter()
        .filter_map(|(path, text)| module_of(&path).map(|module| (module, text)))
        .collect();
    let known: BTreeSet<Vec<String>> = files.iter().map(|(module, _)| module.clone()).collect();
    let family = |a: &[String], b: &[String]| a.starts_with(b) || b.starts_with(a);
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, text) in &files {
        let targets = imports(module, text, &known)
            .into_iter()
            .filter(|target| !family(module, target))
            .collect();
        edges.insert(module.clone(), targets);
    }
    // A loop is a strongly connected set of two or more modules: find one
    // by asking, for each edge a -> b, whether b reaches a.
    let reaches = |from: &Vec<String>, to: &Vec<String>| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(module) = stack.pop() {
            if &module == to {
                return true;
            }
            if seen.insert(module.clone()) {
                stack.extend(edges.get(&module).into_iter().flatten().cloned());
            }
        }
        false
    };
    let name = |module: &Vec<String>| module.join("::");
    let mut loops = Vec::new();
    for (module, targets) in &edges {
        for target in targets {
            if reaches(target, module) {
                loops.push(format!(
                    "{} -> {} -> ... -> {}",
                    name(module),
                    name(target),
                    name(module)
                ));
            }
        }
    }
    assert!(loops.is_empty(), "import loops:\n{}", loops.join("\n"));
}
