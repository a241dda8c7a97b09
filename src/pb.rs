//! Code generated from `proto/` by `build.rs`, fenced here with its lint
//! allowances so the rest of the crate stays strict; and, in [`convert`],
//! the conversions between generated types and ours that more than one
//! place needs.

#[allow(clippy::all, clippy::pedantic, missing_docs, unreachable_pub)]
pub mod ratelimitd {
    pub mod v1 {
        tonic::include_proto!("ratelimitd.v1");
    }
}

/// Envoy's rate limit (RLS) and rate limit quota (RLQS) service APIs, from the trimmed wire-compatible copies in
/// `proto/envoy/`. The module tree mirrors the proto packages because the
/// generated code refers to its neighbours by relative paths.
#[allow(clippy::all, clippy::pedantic, missing_docs, unreachable_pub)]
pub mod envoy {
    pub mod service {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
        pub mod rate_limit_quota {
            pub mod v3 {
                tonic::include_proto!("envoy.service.rate_limit_quota.v3");
            }
        }
        pub mod discovery {
            pub mod v3 {
                tonic::include_proto!("envoy.service.discovery.v3");
            }
        }
    }
    pub mod extensions {
        pub mod common {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    pub mod r#type {
        pub mod v3 {
            tonic::include_proto!("envoy.r#type.v3");
        }
    }
    pub mod config {
        pub mod core {
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
}

/// `google.rpc.Status`, for xDS NACKs and the errors of `CheckLimits` items.
#[allow(clippy::all, clippy::pedantic, missing_docs, unreachable_pub)]
pub mod google {
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }
}

/// envoyproxy/ratelimit's configuration as xDS serves it.
#[allow(clippy::all, clippy::pedantic, missing_docs, unreachable_pub)]
pub mod ratelimit {
    pub mod config {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("ratelimit.config.ratelimit.v3");
            }
        }
    }
}

/// The encoded descriptors of every proto file we compile, for server
/// reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("ratelimitd_descriptor");

pub mod convert;
