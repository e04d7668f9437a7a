#!/usr/bin/env bash
# Builds the C++ example in $1 against the libmok installed in $PREFIX, through CMake's
# find_package(mok) and through pkg-config, and runs both builds. Shared by the conda package test of
# libmok-dev, the Nix flake's consumer check and tests/packaging.
set -euxo pipefail
example=$1
out=$PWD/build-consumer

cmake -S "$example" -B "$out" -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX"
cmake --build "$out"
"$out/mok_consumer"

PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig" make -C "$example" O="$out"
"$out/mok_consumer_pc"
