//! A ratelimitd metrics endpoint, scraped and read: series by name and
//! labels.

use std::collections::HashMap;

use super::http::get_body;

/// The exposition text as `series → value`, a series being the metric name
/// with its labels as written (`name{a="x",b="y"}`).
pub(crate) fn parse(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// `GET /metrics` on `port`: the text and its series.
pub(crate) async fn scrape(port: u16) -> (String, HashMap<String, f64>) {
    let body = get_body(port, "/metrics").await;
    let series = parse(&body);
    (body, series)
}

/// The values of the series whose name is `name` and whose labels include
/// every `labels` pair.
pub(crate) fn matching<'a>(
    series: &'a HashMap<String, f64>,
    name: &'a str,
    labels: &'a [(&str, &str)],
) -> impl Iterator<Item = f64> + 'a {
    series
        .iter()
        .filter(move |(key, _)| key.starts_with(&format!("{name}{{")) || key.as_str() == name)
        .filter(move |(key, _)| {
            labels
                .iter()
                .all(|(label, wanted)| key.contains(&format!("{label}=\"{wanted}\"")))
        })
        .map(|(_, value)| *value)
}

/// The sum of the series whose name is `name` and whose labels include
/// every `labels` pair.
pub(crate) fn value(series: &HashMap<String, f64>, name: &str, labels: &[(&str, &str)]) -> f64 {
    matching(series, name, labels).sum()
}

/// [`value`] of a fresh scrape of `port`, as a count.
pub(crate) async fn count(port: u16, name: &str, labels: &[(&str, &str)]) -> u64 {
    let (_, series) = scrape(port).await;
    value(&series, name, labels) as u64
}
