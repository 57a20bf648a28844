#!/usr/bin/env bash
# Idempotent set-up on Debian 12: system packages (when root or with sudo), then .venv with the
# project installed in editable mode plus its test extras. Safe to run again; fast when done.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(python3 python3-venv python3-dev gcc g++
    gcc-aarch64-linux-gnu g++-aarch64-linux-gnu binutils-aarch64-linux-gnu qemu-user openssh-server openssh-client
    gcc-arm-linux-gnueabihf g++-arm-linux-gnueabihf binutils-arm-linux-gnueabihf
    gcc-riscv64-linux-gnu g++-riscv64-linux-gnu binutils-riscv64-linux-gnu
    pocl-opencl-icd ocl-icd-opencl-dev)

missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
# npm fetches onnxruntime's C headers: the machine's own Node.js, else Debian's (which conflicts
# with a Node.js installed from elsewhere, so it is asked for only when there is no npm).
command -v npm >/dev/null 2>&1 || missing+=(npm)
if ((${#missing[@]})); then
    if [[ $(id -u) -eq 0 ]]; then SUDO=(); elif command -v sudo >/dev/null; then SUDO=(sudo); else
        echo "setup: missing Debian packages ${missing[*]} and not root (no sudo): install them first" >&2
        exit 1
    fi
    echo "setup: installing ${missing[*]}"
    "${SUDO[@]}" apt-get update -q
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

PYTHON=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
    echo "setup: creating .venv"
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.deploy-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
    echo "setup: installing the project into .venv (first time: with torch 2.13.0+cpu, a 192 MB download,"
    echo "setup: 754 MB installed, and executorch 1.5.1, 19 MB: the extra 'executorch')"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[test,executorch]'
    echo "$want" >"$stamp"
fi
# onnxruntime's C API headers (deploy build --engine onnxruntime): no PyPI or Debian package has
# them; npm's com.github.asus4.onnxruntime repackages the official 1.29.0 release. Only the
# headers are kept, in deploy's cache (the 150 MB package is deleted once they are out).
ORT_HEADERS=${DEPLOY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/deploy}/onnxruntime-headers/1.29.0
if [[ ! -f $ORT_HEADERS/onnxruntime_c_api.h ]]; then
    echo "setup: fetching onnxruntime 1.29.0's C API headers once with npm (com.github.asus4.onnxruntime@0.4.9, about 150 MB; 1 MB kept in $ORT_HEADERS)"
    fetch=$(mktemp -d)
    (cd "$fetch" && npm pack --silent com.github.asus4.onnxruntime@0.4.9 >/dev/null)
    mkdir -p "$fetch/headers"
    tar -xzf "$fetch"/com.github.asus4.onnxruntime-0.4.9.tgz -C "$fetch/headers" --strip-components=7 \
        --wildcards 'package/Plugins/iOS~/onnxruntime.xcframework/ios-arm64/onnxruntime.framework/Headers/*'
    mkdir -p "$(dirname "$ORT_HEADERS")"
    rm -rf "$ORT_HEADERS.partial" && mv "$fetch/headers" "$ORT_HEADERS.partial" && mv "$ORT_HEADERS.partial" "$ORT_HEADERS"
    rm -rf "$fetch"
fi
# ExecuTorch's aarch64 libraries (deploy build/test --engine executorch --target arm): the same
# release's manylinux_2_28_aarch64 wheel, of which only lib/ is kept, in deploy's cache.
ET_ARM=${DEPLOY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/deploy}/executorch/1.5.1/aarch64
if [[ ! -f $ET_ARM/lib/libexecutorch.so ]]; then
    echo "setup: fetching executorch 1.5.1's aarch64 wheel once (18 MB; its lib/, 12 MB, kept in $ET_ARM)"
    fetch=$(mktemp -d)
    .venv/bin/python -m pip download -q executorch==1.5.1 --platform manylinux_2_28_aarch64 \
        --only-binary=:all: --no-deps -d "$fetch"
    (cd "$fetch" && python3 -m zipfile -e executorch-1.5.1-*.whl unpacked)
    mkdir -p "$ET_ARM"
    rm -rf "$ET_ARM/lib.partial" && mv "$fetch/unpacked/executorch/lib" "$ET_ARM/lib.partial"
    mv "$ET_ARM/lib.partial" "$ET_ARM/lib"
    rm -rf "$fetch"
fi
# An onnxruntime older than deploy's plugin needs (its API 16: onnxruntime 1.16), for the test
# that the plugin refuses it in one line (tests/test_onnxruntime_versions.py): onnxruntime 1.15.1,
# the last release before 1.16, with the numpy 1.x it was built against; their cp311 x86_64
# wheels, sha256-pinned, unpacked into deploy's cache (its PyPI wheel has no libonnxruntime.so:
# the Python module is how it loads a plugin).
ORT_OLD=${DEPLOY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/deploy}/onnxruntime/1.15.1-x86_64
if [[ $(uname -m) == x86_64 && ! -d $ORT_OLD/site/onnxruntime ]]; then
    echo "setup: fetching onnxruntime 1.15.1 and numpy 1.26.4 once (cp311 x86_64 wheels, 24 MB; 81 MB unpacked in $ORT_OLD)"
    fetch=$(mktemp -d)
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_17_x86_64 \
        --python-version 3.11 --implementation cp -d "$fetch" onnxruntime==1.15.1 numpy==1.26.4
    (cd "$fetch" && sha256sum -c --quiet --strict) <<'SUMS'
2f748cce6a70ed38c19658615c55f4eedb9192765a4e9c4bd2682adfe980698d  onnxruntime-1.15.1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
666dbfb6ec68962c033a450943ded891bed2d54e6755e35e5835d63f4f6931d5  numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
SUMS
    for wheel in "$fetch"/*.whl; do python3 -m zipfile -e "$wheel" "$fetch/site"; done
    mkdir -p "$ORT_OLD"
    rm -rf "$ORT_OLD/site.partial" && mv "$fetch/site" "$ORT_OLD/site.partial" && mv "$ORT_OLD/site.partial" "$ORT_OLD/site"
    rm -rf "$fetch"
fi
echo "setup: ready ($(.venv/bin/deploy --version 2>/dev/null || echo deploy))"
