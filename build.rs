//! Compiles `proto/` into Rust with a vendored `protoc`, so a fresh machine
//! needs no system protobuf compiler, and writes the descriptor set that
//! server reflection serves; then compiles Envoy's RLS messages and
//! ratelimitd's own a second time, on their own, with serde in proto3's
//! JSON mapping (pbjson) for the HTTP endpoints (`/json`, `/v1/...`).

use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let well_known = protoc_bin_vendored::include_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the
    // environment while we set it.
    unsafe { std::env::set_var("PROTOC", protoc) };

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let includes = [PathBuf::from("proto"), well_known];
    tonic_prost_build::configure()
        // An undecodable request is INVALID_ARGUMENT, not INTERNAL: see
        // src/codec.rs.
        .codec_path("crate::codec::StrictProstCodec")
        .file_descriptor_set_path(out_dir.join("ratelimitd_descriptor.bin"))
        .compile_protos(
            &[
                PathBuf::from("proto/ratelimitd/v1/ratelimit.proto"),
                PathBuf::from("proto/ratelimitd/v1/lease.proto"),
                PathBuf::from("proto/envoy/service/ratelimit/v3/rls.proto"),
                PathBuf::from("proto/envoy/service/rate_limit_quota/v3/rlqs.proto"),
                // The xDS configuration source is a client of these.
                PathBuf::from("proto/envoy/service/discovery/v3/ads.proto"),
                PathBuf::from("proto/ratelimit/config/ratelimit/v3/rls_conf.proto"),
            ],
            &includes,
        )?;
    json_messages(&out_dir.join("json"), &includes)?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}

/// Envoy's RLS messages and ratelimitd's into `dir`, with pbjson's
/// well-known types (which have serde) and pbjson's serde impls beside
/// them. Kept apart from the gRPC code, whose well-known types stay
/// prost's: the HTTP endpoints convert between the two through the
/// protobuf encoding.
fn json_messages(dir: &Path, includes: &[PathBuf]) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    let descriptors = dir.join("descriptor.bin");
    prost_build::Config::new()
        .out_dir(dir)
        .file_descriptor_set_path(&descriptors)
        .compile_well_known_types()
        .extern_path(".google.protobuf", "::pbjson_types")
        .compile_protos(
            &[
                "proto/envoy/service/ratelimit/v3/rls.proto",
                "proto/ratelimitd/v1/ratelimit.proto",
            ],
            includes,
        )?;
    let descriptors = std::fs::read(&descriptors)?;
    // `/json` writes as upstream's protojson does: no default values.
    pbjson_build::Builder::new()
        .out_dir(dir)
        .register_descriptors(&descriptors)?
        .build(&[".envoy"])?;
    // The `/v1` API writes every field, `"allowed": false` included, so a
    // client reads a field rather than knowing proto3's defaults.
    pbjson_build::Builder::new()
        .out_dir(dir)
        .register_descriptors(&descriptors)?
        .emit_fields()
        .build(&[".ratelimitd", ".google.rpc"])?;
    Ok(())
}
