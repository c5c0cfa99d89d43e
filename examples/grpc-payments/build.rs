//! Generates the service's code with protox, a protobuf compiler in Rust:
//! building the example needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let descriptors = protox::compile(["proto/payments.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    println!("cargo:rerun-if-changed=proto/payments.proto");
    Ok(())
}
