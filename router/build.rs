// Compiles proto/generate.proto, the single source of the shard protocol.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "../proto/generate.proto";
    println!("cargo:rerun-if-changed={proto}");
    // Vendored protoc: a fresh machine needs no system protobuf compiler.
    std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        .build_server(false)
        .compile_protos(&[proto], &["../proto"])?;
    Ok(())
}
