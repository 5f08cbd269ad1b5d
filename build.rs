//! Compiles kubelet's PodResources v1 API (`proto/podresources/v1/api.proto`) into the server
//! `cpusetd run` serves and the client that asks kubelet (and the tests ask cpusetd). Needs
//! `protoc` (Debian's `protobuf-compiler`, which `scripts/ci-deps.sh` installs).

fn main() {
    println!("cargo:rerun-if-changed=proto/podresources/v1/api.proto");
    if let Err(e) = tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .build_transport(false)
        // `cpusetd pod-resources` prints the answers as JSON, fields named as in the proto.
        .type_attribute(".v1", "#[derive(serde::Serialize)]")
        .field_attribute(".v1.NUMANode.ID", "#[serde(rename = \"ID\")]")
        .compile_protos(
            &["proto/podresources/v1/api.proto"],
            &["proto/podresources"],
        )
    {
        eprintln!(
            "cannot compile proto/podresources/v1/api.proto: {e}\n\
             (it needs protoc: apt-get install protobuf-compiler, or set PROTOC)"
        );
        std::process::exit(1);
    }
}
