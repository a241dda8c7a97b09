//! docs/configuration.md's reference parts are generated, and this test
//! keeps them so: `ratelimitd --help` as the binary prints it, and the
//! table of envoyproxy/ratelimit's variables as the code holds it. With
//! `RATELIMITD_BLESS=1` the test writes them into the document instead of
//! comparing (then review the diff and commit it).

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

use ratelimitd::config::Config;
use ratelimitd::config::upstream::{Accepts, Effect, Row, TABLE, When};

const DOCUMENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
const END: &str = "<!-- END GENERATED -->";

/// The two tests rewrite one file when blessing: one at a time.
static DOCUMENT_LOCK: Mutex<()> = Mutex::new(());

#[test]
fn the_help_in_the_docs_is_the_binarys() {
    let output = Command::new(env!("CARGO_BIN_EXE_ratelimitd"))
        .arg("--help")
        .env_clear()
        .output()
        .expect("run ratelimitd --help");
    assert!(output.status.success(), "--help failed");
    let help = String::from_utf8(output.stdout).expect("UTF-8 help");
    let block = format!("```text\n{}\n```", help.trim_end());
    check_block("ratelimitd --help", &block);
}

#[test]
fn the_variables_in_the_docs_are_the_tables() {
    let command = Config::annotated_command();
    let flag = |id: &str| {
        let long = command
            .get_arguments()
            .find(|arg| arg.get_id() == id)
            .and_then(|arg| arg.get_long())
            .unwrap_or_else(|| panic!("{id} is not a flag"));
        let default = command
            .get_arguments()
            .find(|arg| arg.get_id() == id)
            .map(|arg| {
                arg.get_default_values()
                    .iter()
                    .map(|value| value.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        match default.as_str() {
            "" => format!("`--{long}`"),
            default => format!("`--{long}` (`{default}`)"),
        }
    };
    let mut table = String::from(
        "| upstream variable (upstream's default) | ratelimitd (our default) | what it does here |\n\
         |---|---|---|\n",
    );
    for row in TABLE {
        let (ours, what) = describe(row, &flag);
        table.push_str(&format!("| {} | {ours} | {what} |\n", variables(row)));
    }
    check_block("envoyproxy/ratelimit's variables", table.trim_end());
}

/// The row's variables with upstream's defaults.
fn variables(row: &Row) -> String {
    row.variables
        .iter()
        .map(|variable| match variable.default {
            "" => format!("`{}`", variable.name),
            default => format!("`{}` (`{default}`)", variable.name),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the row sets here, and what it does.
fn describe(row: &Row, flag: &dyn Fn(&str) -> String) -> (String, String) {
    let conditions: Vec<String> = row
        .when
        .iter()
        .map(|when| match when {
            When::True(name) => format!("with `{name}=true`"),
            When::Is(name, value) => format!("with `{name}={value}`"),
            When::IsNot(name, value) => format!("unless `{name}={value}`"),
        })
        .collect();
    let only = match conditions.is_empty() {
        true => String::new(),
        false => format!(" ({})", conditions.join(", ")),
    };
    match row.effect {
        Effect::Sets { flags, how, .. } => (
            flags
                .iter()
                .map(|id| flag(id))
                .collect::<Vec<_>>()
                .join(", "),
            format!("{how}{only}"),
        ),
        Effect::Refuses { accepts, why } => (
            "—".into(),
            format!("**stops the start** unless {}: {why}", accepted(accepts)),
        ),
        Effect::Warns { why } => ("—".into(), format!("accepted with a warning: {why}")),
        Effect::Switches { what } => ("—".into(), format!("a Go boolean, switches on {what}")),
        Effect::Ignores { accepts, why } => {
            let values = match accepts {
                Accepts::Any => String::new(),
                other => format!(" ({})", accepted(other)),
            };
            ("—".into(), format!("accepted{values}, no effect: {why}"))
        }
    }
}

fn accepted(accepts: Accepts) -> String {
    match accepts {
        Accepts::Any => "set".into(),
        Accepts::Nothing => "unset or empty".into(),
        Accepts::Bool => "a Go boolean".into(),
        Accepts::False => "false".into(),
        Accepts::OneOf(values) => values
            .iter()
            .map(|value| format!("`{value}`"))
            .collect::<Vec<_>>()
            .join(" or "),
    }
}

/// Compares the document's block `name` with `expected`, or with
/// `RATELIMITD_BLESS=1` writes it there.
fn check_block(name: &str, expected: &str) {
    let _one_at_a_time = DOCUMENT_LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let begin = format!("<!-- BEGIN GENERATED: {name} -->");
    let document = std::fs::read_to_string(DOCUMENT).expect("docs/configuration.md");
    let start = document
        .find(&begin)
        .unwrap_or_else(|| panic!("{begin} missing"))
        + begin.len();
    let length = document[start..]
        .find(END)
        .unwrap_or_else(|| panic!("{END} missing after {begin}"));
    let found = document[start..start + length].trim();
    if std::env::var_os("RATELIMITD_BLESS").is_some() {
        let written = format!(
            "{}\n{expected}\n{}",
            &document[..start],
            &document[start + length..]
        );
        std::fs::write(Path::new(DOCUMENT), written).expect("write the document");
        return;
    }
    assert!(
        found == expected,
        "docs/configuration.md's {name} is out of date: run \
         `RATELIMITD_BLESS=1 cargo test --all-features --test suite configuration_reference::` and commit the result"
    );
}
