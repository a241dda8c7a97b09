//! gRPC server reflection, so that grpcurl and other tools can list and
//! call the services without their `.proto` files.

use tracing::info;

use super::ServeError;

/// Both versions of reflection, unless it is off: v1 for current tools,
/// v1alpha for those still widely installed (grpcurl 1.8, Python's
/// grpcio-reflection). The services are named: the descriptors also hold
/// the xDS service the configuration source is a client of, which is not
/// served.
#[allow(clippy::type_complexity)]
pub(super) fn services(
    on: bool,
) -> Result<
    (
        Option<
            tonic_reflection::server::v1::ServerReflectionServer<
                impl tonic_reflection::server::v1::ServerReflection,
            >,
        >,
        Option<
            tonic_reflection::server::v1alpha::ServerReflectionServer<
                impl tonic_reflection::server::v1alpha::ServerReflection,
            >,
        >,
    ),
    ServeError,
> {
    if !on {
        info!("reflection off (--reflection=false)");
        return Ok((None, None));
    }
    let builder = |itself: &'static str| {
        [
            "ratelimitd.v1.RateLimiter",
            "ratelimitd.v1.Leases",
            "envoy.service.ratelimit.v3.RateLimitService",
            "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
            "grpc.health.v1.Health",
            itself,
        ]
        .into_iter()
        .fold(
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(crate::pb::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET),
            |builder, service| builder.with_service_name(service),
        )
    };
    Ok((
        Some(builder("grpc.reflection.v1.ServerReflection").build_v1()?),
        Some(builder("grpc.reflection.v1alpha.ServerReflection").build_v1alpha()?),
    ))
}
