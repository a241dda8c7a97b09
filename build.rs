//! Compiles `proto/` into Rust with a vendored `protoc`, so a fresh machine
//! needs no system protobuf compiler, and writes the descriptor set that
//! server reflection serves.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let well_known = protoc_bin_vendored::include_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the
    // environment while we set it.
    unsafe { std::env::set_var("PROTOC", protoc) };

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        // An undecodable request is INVALID_ARGUMENT, not INTERNAL: see
        // src/codec.rs.
        .codec_path("crate::codec::StrictProstCodec")
        .file_descriptor_set_path(out_dir.join("ratelimitd_descriptor.bin"))
        .compile_protos(
            &[
                PathBuf::from("proto/ratelimitd/v1/ratelimit.proto"),
                PathBuf::from("proto/envoy/service/ratelimit/v3/rls.proto"),
                PathBuf::from("proto/envoy/service/rate_limit_quota/v3/rlqs.proto"),
                // The xDS configuration source is a client of these.
                PathBuf::from("proto/envoy/service/discovery/v3/ads.proto"),
                PathBuf::from("proto/ratelimit/config/ratelimit/v3/rls_conf.proto"),
            ],
            &[PathBuf::from("proto"), well_known],
        )?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
