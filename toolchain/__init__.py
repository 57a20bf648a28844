"""The toolchain: targets, build and export, verification, benchmarking, the `deploy` CLI."""
