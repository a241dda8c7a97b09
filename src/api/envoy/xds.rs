//! The Envoy rules from an xDS management server instead of files, as
//! envoyproxy/ratelimit's CONFIG_TYPE=GRPC_XDS_SOTW (how Envoy Gateway runs
//! it): a state-of-the-world stream on the Aggregated Discovery Service
//! (what upstream's go-control-plane client speaks) for resources of type
//! `ratelimit.config.ratelimit.v3.RateLimitConfig`, one per domain. Each
//! response is compiled exactly as files are (each resource becomes the
//! document a file would hold), and ACKed; one that does not compile is
//! NACKed with the reason, and the rules in force stay. A broken stream or
//! an unreachable server is retried with jittered exponential backoff, and
//! the rules in force stay meanwhile; the version last accepted goes with
//! each new stream.

use std::path::PathBuf;
use std::time::Duration;

use prost::Message;
use rand::Rng;
use tokio::sync::mpsc;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use tracing::{debug, error, info, warn};

use crate::metrics;
use crate::pb::convert;
use crate::pb::envoy::config::core::v3::Node;
use crate::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use crate::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use crate::pb::google::rpc::Status;
use crate::pb::ratelimit::config::ratelimit::v3 as conf;
use crate::rules::{self, Rules, RulesHandle};

/// The type of the resources asked for.
pub(crate) const RATE_LIMIT_CONFIG_TYPE: &str =
    "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// The largest xDS response read.
pub(crate) const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// google.rpc.Code INVALID_ARGUMENT, for a NACK.
const INVALID_ARGUMENT: i32 = 3;

/// Where the management server is and how to talk to it.
#[derive(Debug, Clone)]
pub struct XdsSettings {
    /// `host:port`, or a `http://` / `https://` URI.
    pub server: String,
    /// The `node.id` sent to the server.
    pub node_id: String,
    /// The node's metadata, as string values.
    pub node_metadata: Vec<(String, String)>,
    /// Headers sent with the stream.
    pub headers: Vec<(String, String)>,
    /// TLS to the server, when set.
    pub tls: Option<XdsTls>,
    /// The first wait before reconnecting; doubled up to `retry_max`.
    pub retry_interval: Duration,
    /// The longest wait between reconnections.
    pub retry_max: Duration,
}

/// TLS to the management server, as PEM.
#[derive(Clone)]
pub struct XdsTls {
    /// PEM CA to trust (unset: the system's roots).
    pub ca: Option<Vec<u8>>,
    /// PEM client certificate and key, for mutual TLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The name to verify the server's certificate against, when not the
    /// host.
    pub server_name: Option<String>,
}

impl std::fmt::Debug for XdsTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdsTls")
            .field("ca", &self.ca.is_some())
            .field("identity", &self.identity.is_some())
            .field("server_name", &self.server_name)
            .finish()
    }
}

/// Follows the management server for ever, swapping each accepted
/// configuration into `rules`. Runs as a task; the server aborts it at
/// shutdown.
pub(crate) async fn watch(settings: XdsSettings, rules: RulesHandle) {
    let mut accepted = String::new();
    let mut delay = settings.retry_interval;
    loop {
        let mut answered = false;
        let ended = session(&settings, &rules, &mut accepted, &mut answered).await;
        if answered {
            delay = settings.retry_interval;
        }
        // ±50%, so that many instances do not reconnect in step.
        let wait = delay.mul_f64(rand::rng().random_range(0.5..1.5));
        match ended {
            Err(err) => {
                warn!(server = %settings.server, %err, ?wait, "xDS stream ended; reconnecting")
            }
            Ok(()) => {
                warn!(server = %settings.server, ?wait, "xDS server closed the stream; reconnecting")
            }
        }
        tokio::time::sleep(wait).await;
        delay = (delay * 2).min(settings.retry_max);
    }
}

/// Why a stream to the management server ended, or could not start.
#[derive(Debug, thiserror::Error)]
enum StreamError {
    /// `--xds-server` is not an address tonic can dial.
    #[error("server address: {0}")]
    Address(#[source] tonic::transport::Error),
    /// The TLS settings do not make a client configuration.
    #[error("TLS: {0}")]
    Tls(#[source] tonic::transport::Error),
    /// The connection could not be made.
    #[error("cannot connect: {0}")]
    Connect(#[source] tonic::transport::Error),
    /// A header of `--xds-headers` cannot be sent as gRPC metadata.
    #[error("header {0:?} cannot be sent as gRPC metadata")]
    Header(String),
    /// The stream's own request queue is gone or full.
    #[error("cannot queue a request: {0}")]
    Queue(String),
    /// The server refused the stream.
    #[error("stream refused: {0}")]
    Refused(tonic::Status),
    /// The stream broke.
    #[error("stream failed: {0}")]
    Failed(tonic::Status),
}

/// One stream: connect, ask, and answer every response until the stream
/// ends (`Ok`) or fails (`Err`). `answered` is set once a response came.
async fn session(
    settings: &XdsSettings,
    rules: &RulesHandle,
    accepted: &mut String,
    answered: &mut bool,
) -> Result<(), StreamError> {
    let channel = endpoint(settings)?
        .connect()
        .await
        .map_err(StreamError::Connect)?;
    // A large deployment's configuration can pass tonic's 4 MiB default.
    let mut client = AggregatedDiscoveryServiceClient::new(channel)
        .max_decoding_message_size(MAX_RESPONSE_BYTES);
    let (requests, outgoing) = mpsc::channel::<DiscoveryRequest>(4);
    let outgoing = futures::stream::unfold(outgoing, |mut outgoing| async move {
        outgoing.recv().await.map(|request| (request, outgoing))
    });
    let node = node(settings);
    let ask = |version: &str, nonce: &str, error: Option<String>| DiscoveryRequest {
        version_info: version.to_owned(),
        node: Some(node.clone()),
        resource_names: Vec::new(),
        type_url: RATE_LIMIT_CONFIG_TYPE.to_owned(),
        response_nonce: nonce.to_owned(),
        error_detail: error.map(|message| Status {
            code: INVALID_ARGUMENT,
            message,
            details: Vec::new(),
        }),
    };
    let send = |request: DiscoveryRequest| {
        requests
            .try_send(request)
            .map_err(|err| StreamError::Queue(err.to_string()))
    };
    send(ask(accepted, "", None))?;
    let mut call = tonic::Request::new(outgoing);
    for (name, value) in &settings.headers {
        let name: tonic::metadata::MetadataKey<tonic::metadata::Ascii> = name
            .parse()
            .map_err(|_| StreamError::Header(name.clone()))?;
        let value = value
            .parse()
            .map_err(|_| StreamError::Header(name.to_string()))?;
        call.metadata_mut().insert(name, value);
    }
    let mut responses = client
        .stream_aggregated_resources(call)
        .await
        .map_err(StreamError::Refused)?
        .into_inner();
    info!(server = %settings.server, "xDS stream open");
    while let Some(response) = responses.message().await.map_err(StreamError::Failed)? {
        *answered = true;
        if response.type_url != RATE_LIMIT_CONFIG_TYPE {
            debug!(type_url = %response.type_url, "xDS response of another type, ignored");
            continue;
        }
        let nack = accept(&response, rules, accepted);
        send(ask(accepted, &response.nonce, nack))?;
    }
    Ok(())
}

/// Where the management server is, with TLS when the settings ask for it.
fn endpoint(settings: &XdsSettings) -> Result<Endpoint, StreamError> {
    let uri = if settings.server.contains("://") {
        settings.server.clone()
    } else if settings.tls.is_some() {
        format!("https://{}", settings.server)
    } else {
        format!("http://{}", settings.server)
    };
    let endpoint = Endpoint::from_shared(uri)
        .map_err(StreamError::Address)?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true);
    let Some(tls) = &settings.tls else {
        return Ok(endpoint);
    };
    let mut config = ClientTlsConfig::new().with_enabled_roots();
    if let Some(ca) = &tls.ca {
        config = config.ca_certificate(Certificate::from_pem(ca));
    }
    if let Some((cert, key)) = &tls.identity {
        config = config.identity(Identity::from_pem(cert, key));
    }
    if let Some(name) = &tls.server_name {
        config = config.domain_name(name.clone());
    }
    endpoint.tls_config(config).map_err(StreamError::Tls)
}

/// Puts a response's configuration in force if it compiles (its version
/// then `accepted`); otherwise the reason, for the NACK, and the rules in
/// force stay.
fn accept(
    response: &DiscoveryResponse,
    rules: &RulesHandle,
    accepted: &mut String,
) -> Option<String> {
    match compile(response) {
        Ok((compiled, resources)) => {
            rules.replace(compiled);
            metrics::config_reload(true);
            crate::stats::config_load(true);
            info!(
                version = %response.version_info,
                resources,
                "loaded Envoy rate limit configuration from xDS"
            );
            accepted.clone_from(&response.version_info);
            None
        }
        Err(reason) => {
            rules.rejected();
            metrics::config_reload(false);
            crate::stats::config_load(false);
            error!(
                version = %response.version_info,
                %reason,
                "xDS configuration rejected (NACK); the rules in force stay"
            );
            Some(reason)
        }
    }
}

fn node(settings: &XdsSettings) -> Node {
    Node {
        id: settings.node_id.clone(),
        cluster: String::new(),
        metadata: Some(prost_types::Struct {
            fields: settings
                .node_metadata
                .iter()
                .map(|(key, value)| {
                    let value = prost_types::Value {
                        kind: Some(prost_types::value::Kind::StringValue(value.clone())),
                    };
                    (key.clone(), value)
                })
                .collect(),
        }),
    }
}

/// The response's resources as rules, compiled as files are; the number
/// of resources with them.
fn compile(response: &DiscoveryResponse) -> Result<(Rules, usize), String> {
    let mut files = Vec::with_capacity(response.resources.len());
    for (i, resource) in response.resources.iter().enumerate() {
        if resource.type_url != RATE_LIMIT_CONFIG_TYPE {
            return Err(format!(
                "resources[{i}] is a {}, not a RateLimitConfig",
                resource.type_url
            ));
        }
        let config = conf::RateLimitConfig::decode(resource.value.as_slice())
            .map_err(|err| format!("resources[{i}] does not decode: {err}"))?;
        let name = if config.name.is_empty() {
            &config.domain
        } else {
            &config.name
        };
        let document = serde_json::to_string_pretty(&config_document(&config))
            .map_err(|err| format!("resources[{i}]: {err}"))?;
        files.push((PathBuf::from(format!("xds:{name}")), document));
    }
    let rules = rules::compile(&files).map_err(|err| err.to_string())?;
    Ok((rules, response.resources.len()))
}

/// The document a file would hold for `config` (JSON, which is YAML), as
/// upstream's ConfigXdsProtoToYaml builds it.
fn config_document(config: &conf::RateLimitConfig) -> serde_json::Value {
    serde_json::json!({
        "domain": config.domain,
        "descriptors": config.descriptors.iter().map(descriptor_document).collect::<Vec<_>>(),
    })
}

fn descriptor_document(descriptor: &conf::RateLimitDescriptor) -> serde_json::Value {
    let mut document = serde_json::Map::new();
    document.insert("key".into(), descriptor.key.clone().into());
    if !descriptor.value.is_empty() {
        document.insert("value".into(), descriptor.value.clone().into());
    }
    if let Some(policy) = &descriptor.rate_limit {
        let unit =
            conf::RateLimitUnit::try_from(policy.unit).map_or("UNKNOWN", |unit| unit.as_str_name());
        let mut limit = serde_json::Map::new();
        limit.insert("requests_per_unit".into(), policy.requests_per_unit.into());
        // An unlimited rule has no unit, as upstream writes it.
        if !(policy.unlimited && policy.unit == 0) {
            limit.insert("unit".into(), unit.into());
        }
        limit.insert("unlimited".into(), policy.unlimited.into());
        if !policy.name.is_empty() {
            limit.insert("name".into(), policy.name.clone().into());
        }
        limit.insert(
            "replaces".into(),
            policy
                .replaces
                .iter()
                .map(|replaced| serde_json::json!({ "name": replaced.name }))
                .collect::<Vec<_>>()
                .into(),
        );
        document.insert("rate_limit".into(), limit.into());
    }
    document.insert(
        "descriptors".into(),
        descriptor
            .descriptors
            .iter()
            .map(descriptor_document)
            .collect::<Vec<_>>()
            .into(),
    );
    document.insert("shadow_mode".into(), descriptor.shadow_mode.into());
    document.insert("detailed_metric".into(), descriptor.detailed_metric.into());
    document.insert("quota_mode".into(), descriptor.quota_mode.into());
    if let Some(metadata) = &descriptor.metadata {
        document.insert("metadata".into(), convert::struct_to_json(metadata));
    }
    document.into()
}
