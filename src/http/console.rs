//! The web console's side of the service listener: `POST /v1/simulate`
//! (limits and a traffic pattern run by the server's own algorithms on a
//! simulated clock, [`crate::simulate`]) and their OpenAPI operations. The
//! request and answer are `ratelimitd.v1.SimulateRequest` and
//! `SimulateResponse` in proto3's JSON mapping, read and written as
//! `/v1/check`'s are (unknown fields refused, every field written); and the
//! page at `/`. Their OpenAPI operations are `openapi::console`'s.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::json;
use tokio::sync::Semaphore;
use tracing::warn;

use super::api;
use super::body::BodyBounds;
use crate::pb::json::ratelimitd::v1 as json;
use crate::pb::ratelimitd::v1 as pb;
use crate::simulate;

/// Runs at once on one instance: each may take a few hundred thousand
/// decisions of CPU, and the listener is open to whoever can reach it.
const SIMULATIONS_AT_ONCE: usize = 2;

/// What the simulator's handler holds.
#[derive(Clone)]
pub(crate) struct Simulator {
    bounds: BodyBounds,
    running: Arc<Semaphore>,
}

impl Simulator {
    /// A simulator reading bodies within `bounds`.
    pub(crate) fn new(bounds: BodyBounds) -> Self {
        Self {
            bounds,
            running: Arc::new(Semaphore::new(SIMULATIONS_AT_ONCE)),
        }
    }
}

/// `POST /v1/simulate`.
pub(crate) async fn simulate(simulator: Simulator, headers: HeaderMap, body: Body) -> Response {
    let request = match api::read_message::<json::SimulateRequest, pb::SimulateRequest>(
        simulator.bounds,
        &headers,
        body,
        "SimulateRequest",
    )
    .await
    {
        Ok(request) => request,
        Err(answer) => return answer,
    };
    let run = match simulate::simulation(request) {
        Ok(run) => run,
        Err(err) => return api::refused(StatusCode::BAD_REQUEST, &err.field, err.rule),
    };
    let Ok(permit) = simulator.running.clone().try_acquire_owned() else {
        return api::failure(
            StatusCode::SERVICE_UNAVAILABLE,
            api::FailureCode::ResourceExhausted,
            format!("{SIMULATIONS_AT_ONCE} simulations are running already: try again shortly"),
        );
    };
    let answered = tokio::task::spawn_blocking(move || {
        let _running = permit;
        run.run()
    })
    .await;
    match answered {
        Ok(response) => api::written::<_, json::SimulateResponse>(&response, HeaderMap::new()),
        Err(err) => {
            warn!(%err, "a simulation failed");
            api::failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                api::FailureCode::Internal,
                format!("the simulation failed: {err}"),
            )
        }
    }
}

/// The example body of `POST /v1/simulate`: the five algorithms at ten a
/// second under bursts. The tests send it.
pub fn simulate_example() -> serde_json::Value {
    json!({
        "limits": [
            {"name": "fixed", "fixedWindow": {"limit": "10", "window": "1s"}},
            {"name": "log", "slidingWindow": {"limit": "10", "window": "1s"}},
            {"name": "bucket", "tokenBucket": {"capacity": "10", "refillPerSecond": 10}},
            {"name": "gcra", "gcra": {"rate": "10", "period": "1s", "burst": "10"}},
            {"name": "counter", "slidingWindowCounter": {"limit": "10", "window": "1s"}}
        ],
        "traffic": {"shape": "BURSTS", "rate": 20, "duration": "5s", "period": "1s"},
        "step": "0.100s"
    })
}

/// The console's files, built into the binary: nothing is fetched from
/// anywhere else, so the page works behind a firewall.
mod assets {
    pub(super) const INDEX: &str = include_str!("../../assets/console/index.html");
    pub(super) const STYLE: &str = include_str!("../../assets/console/console.css");
    pub(super) const SCRIPT: &str = include_str!("../../assets/console/console.js");
    pub(super) const CHART_STYLE: &str = include_str!("../../assets/console/vendor/uPlot.min.css");
    pub(super) const CHART_SCRIPT: &str =
        include_str!("../../assets/console/vendor/uPlot.iife.min.js");
}

/// The page `GET /` serves, made once: `index.html` with its styles and
/// scripts inlined (one request loads all of it), and the
/// `Content-Security-Policy` that lets those scripts run and nothing else.
#[derive(Clone)]
pub(crate) struct Page {
    html: axum::body::Bytes,
    policy: axum::http::HeaderValue,
}

impl Page {
    /// The page.
    pub(crate) fn new() -> Self {
        let inline = [
            ("vendor/uPlot.min.css", assets::CHART_STYLE),
            ("console.css", assets::STYLE),
            ("vendor/uPlot.iife.min.js", assets::CHART_SCRIPT),
            ("console.js", assets::SCRIPT),
        ];
        let html = inline
            .iter()
            .fold(assets::INDEX.to_owned(), |html, (name, text)| {
                html.replace(&format!("/*! inline: {name} */"), text)
            });
        // Each inline script by its digest: an injected one would not run.
        let scripts: Vec<String> = [assets::CHART_SCRIPT, assets::SCRIPT]
            .iter()
            .map(|script| {
                let digest = ring::digest::digest(&ring::digest::SHA256, script.as_bytes());
                format!("'sha256-{}'", base64(digest.as_ref()))
            })
            .collect();
        let policy = format!(
            "default-src 'none'; script-src {}; style-src 'unsafe-inline'; img-src data:; \
             connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            scripts.join(" ")
        );
        Self {
            html: axum::body::Bytes::from(html),
            policy: axum::http::HeaderValue::try_from(policy)
                .unwrap_or_else(|_| axum::http::HeaderValue::from_static("default-src 'none'")),
        }
    }

    /// `GET /`.
    pub(crate) fn serve(&self) -> Response {
        use axum::http::header::{
            CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS,
        };
        use axum::response::IntoResponse;
        (
            [
                (
                    CONTENT_TYPE,
                    axum::http::HeaderValue::from_static("text/html; charset=utf-8"),
                ),
                (CONTENT_SECURITY_POLICY, self.policy.clone()),
                (
                    X_CONTENT_TYPE_OPTIONS,
                    axum::http::HeaderValue::from_static("nosniff"),
                ),
                (
                    CACHE_CONTROL,
                    axum::http::HeaderValue::from_static("no-cache"),
                ),
            ],
            self.html.clone(),
        )
            .into_response()
    }
}

impl Default for Page {
    fn default() -> Self {
        Self::new()
    }
}

/// Standard base64, padded (a CSP hash source's encoding).
fn base64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_pads_as_the_standard_says() {
        for (bytes, text) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foobar", "Zm9vYmFy"),
            (&[0xfb, 0xff][..], "+/8="),
        ] {
            assert_eq!(base64(bytes), text);
        }
    }

    #[test]
    fn the_page_inlines_every_asset_and_hashes_its_scripts() {
        let page = Page::new();
        let html = std::str::from_utf8(&page.html).unwrap();
        assert!(!html.contains("/*! inline:"), "every marker is replaced");
        assert!(html.contains("https://github.com/leeoniya/uPlot (v1.6.32)"));
        assert!(html.contains("ratelimitdConsole"));
        let policy = page.policy.to_str().unwrap();
        assert_eq!(policy.matches("'sha256-").count(), 2, "{policy}");
        assert!(!policy.contains("unsafe-eval") && !policy.contains("script-src 'unsafe-inline'"));
    }
}
