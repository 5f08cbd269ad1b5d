//! The integration test binary: one binary, one submodule per area (ripgrep's layout).

mod kubelet_vectors;
