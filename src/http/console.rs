//! The web console's side of the service listener: `POST /v1/simulate`
//! (limits and a traffic pattern run by the server's own algorithms on a
//! simulated clock, [`crate::simulate`]) and their OpenAPI operations. The
//! request and answer are `ratelimitd.v1.SimulateRequest` and
//! `SimulateResponse` in proto3's JSON mapping, read and written as
//! `/v1/check`'s are (unknown fields refused, every field written).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use prost::Message;
use serde_json::json;
use tokio::sync::Semaphore;
use tonic::Code;
use tracing::warn;

use super::api::{self, JSON};
use super::body::{self, BodyBounds, BodyError};
use super::openapi;
use crate::pb::json::ratelimitd::v1 as json;
use crate::pb::ratelimitd::v1 as pb;
use crate::simulate;

/// Runs at once on one instance: each may take a few hundred thousand
/// decisions of CPU, and the listener is open to whoever can reach it.
const SIMULATIONS_AT_ONCE: usize = 2;

/// What the simulator's handler holds.
#[derive(Clone)]
pub struct Simulator {
    bounds: BodyBounds,
    running: Arc<Semaphore>,
}

impl Simulator {
    /// A simulator reading bodies within `bounds`.
    pub fn new(bounds: BodyBounds) -> Self {
        Self {
            bounds,
            running: Arc::new(Semaphore::new(SIMULATIONS_AT_ONCE)),
        }
    }
}

/// `POST /v1/simulate`.
pub async fn simulate(simulator: Simulator, headers: HeaderMap, body: Body) -> Response {
    let request = match read::<json::SimulateRequest, pb::SimulateRequest>(
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
            Code::ResourceExhausted,
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
                Code::Internal,
                format!("the simulation failed: {err}"),
            )
        }
    }
}

/// The message a JSON body holds (`Json` its pbjson twin, `name` its
/// message's name in errors), as the gRPC type; or the answer refusing
/// it: 415 for another content type, 413 over the size bound, 408 too
/// slow, 400 for anything but such a message.
async fn read<Json, Grpc>(
    bounds: BodyBounds,
    headers: &HeaderMap,
    body: Body,
    name: &str,
) -> Result<Grpc, Response>
where
    Json: Message + for<'de> serde::Deserialize<'de>,
    Grpc: Message + Default,
{
    if !api::is_json(headers) {
        return Err(api::refused(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "content-type",
            format!("must be {JSON}"),
        ));
    }
    let body = body::read(body, headers, bounds).await.map_err(|err| {
        let status = match err {
            BodyError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            BodyError::TooSlow(_) => StatusCode::REQUEST_TIMEOUT,
            BodyError::Broken(_) => StatusCode::BAD_REQUEST,
        };
        api::refused(status, "request", err.to_string())
    })?;
    let request: Json = serde_json::from_slice(&body).map_err(|err| {
        api::refused(
            StatusCode::BAD_REQUEST,
            "request",
            format!("must be a {name} in proto3's JSON mapping: {err}"),
        )
    })?;
    // Both types encode the same message: this cannot fail short of a bug.
    Grpc::decode(request.encode_to_vec().as_slice()).map_err(|err| {
        warn!(%err, "{name}: the JSON and gRPC types disagree");
        api::failure(
            StatusCode::INTERNAL_SERVER_ERROR,
            Code::Internal,
            format!("{name}: {err}"),
        )
    })
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

/// `POST /v1/simulate`'s OpenAPI operation.
pub fn simulate_operation() -> utoipa::openapi::path::Operation {
    use utoipa::openapi::path::OperationBuilder;
    use utoipa::openapi::response::ResponseBuilder;
    openapi::refusals(
        OperationBuilder::new()
            .operation_id(Some("simulate"))
            .tag("console")
            .summary(Some(
                "Run limits under a traffic pattern on a simulated clock",
            ))
            .description(Some(
                "Each limit is decided by the server's own algorithm code (the embedded store's), \
                 on its own simulated counter, on a clock that starts at zero: nothing is stored \
                 and the same request always gets the same answer. Bounded: at most 10 limits, \
                 100000 requests, 10000 steps and 1 h of traffic; more is 400 naming the field. \
                 503 when two simulations are running already.",
            ))
            .request_body(Some(
                openapi::json_body(
                    "ratelimitd.v1.SimulateRequest",
                    &[("five algorithms under bursts", simulate_example())],
                )
                .build(),
            )),
    )
    .response(
        "200",
        ResponseBuilder::new()
            .description(
                "Per step: requests sent, and each limit's admitted, denied and remaining.",
            )
            .content(
                JSON,
                openapi::json_content(openapi::schema_ref("ratelimitd.v1.SimulateResponse")),
            )
            .build(),
    )
    .build()
}
