//! Code generated from `proto/` by `build.rs`, fenced here with its lint
//! allowances so the rest of the crate stays strict.

#[allow(clippy::all, clippy::pedantic, missing_docs, unreachable_pub)]
pub mod ratelimitd {
    pub mod v1 {
        tonic::include_proto!("ratelimitd.v1");
    }
}

/// The encoded descriptors of every proto file we compile, for server
/// reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("ratelimitd_descriptor");
