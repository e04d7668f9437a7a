#!/usr/bin/env bash
# The staged build of recipe.yaml: libmok with its CUDA backend, installed into $PREFIX; the
# libmok and libmok-dev outputs take their files from here.
set -euxo pipefail

# CUTLASS's headers from the recipe's wheel source: required with CUDA (without them libmok would carry no cuda
# executor); absent in the test-only host variant, which builds no CUDA.
CUTLASS_WHEEL="$SRC_DIR/cutlass/nvidia_cutlass-4.2.0.0-py3-none-any.whl"
if [[ "${MOK_ENABLE_CUDA:-ON}" != "OFF" && ! -f "$CUTLASS_WHEEL" ]]; then
  echo "build_libmok.sh: $CUTLASS_WHEEL is missing (the recipe's CUTLASS source)" >&2
  exit 1
fi
if [[ -f "$CUTLASS_WHEEL" ]]; then
  mkdir -p cutlass-wheel
  (cd cutlass-wheel && cmake -E tar xf "$CUTLASS_WHEEL")
  MOK_CUTLASS_INCLUDE_DIR="$PWD/cutlass-wheel/cutlass_library/source/include"
fi

# CMAKE_ARGS comes from the compiler packages' activation (it is unset without them).
# shellcheck disable=SC2086
cmake -S "$SRC_DIR" -B build-libmok -G Ninja ${CMAKE_ARGS:-} \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_INSTALL_PREFIX="$PREFIX" \
  -DCMAKE_INSTALL_LIBDIR=lib \
  -DMOK_ENABLE_CUDA="${MOK_ENABLE_CUDA:-ON}" \
  -DMOK_CUDA_ARCHITECTURES="$MOK_CUDA_ARCHITECTURES" \
  -DCMAKE_CUDA_ARCHITECTURES="$MOK_CUDA_ARCHITECTURES" \
  ${MOK_CCCL_INCLUDE_DIR:+-DMOK_CCCL_INCLUDE_DIR="$MOK_CCCL_INCLUDE_DIR"} \
  ${MOK_CUTLASS_INCLUDE_DIR:+-DMOK_CUTLASS_INCLUDE_DIR="$MOK_CUTLASS_INCLUDE_DIR"} \
  -DMOK_BUILD_PYTHON=OFF \
  -DMOK_BUILD_TESTS=OFF
cmake --build build-libmok --parallel "${CPU_COUNT:-2}"
cmake --install build-libmok
