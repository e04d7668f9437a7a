#!/usr/bin/env bash
# Builds the C++ example in $1 against the libmok installed in $PREFIX, through CMake's
# find_package(mok) and through pkg-config, and runs both builds.
set -euxo pipefail
example=$1

cmake -S "$example" -B build-consumer -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX"
cmake --build build-consumer
./build-consumer/mok_consumer

PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig" make -C "$example" mok_consumer_pc
"$example/mok_consumer_pc"
