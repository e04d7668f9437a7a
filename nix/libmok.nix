# libmok: the shared library ($out) and its headers, CMake package and pkg-config file ($dev), built
# with the CUDA backend stdenv (a host compiler nvcc 13.0 accepts) for the configured capabilities.
{
  lib,
  cudaPackages,
  cmake,
  ninja,
  autoAddDriverRunpath,
  src,
}:
let
  inherit (cudaPackages) backendStdenv flags;
in
backendStdenv.mkDerivation {
  pname = "libmok";
  version = "0.5.0";
  inherit src;

  outputs = [
    "out"
    "dev"
  ];

  nativeBuildInputs = [
    cmake
    ninja
    cudaPackages.cuda_nvcc
    # cudart (static in libmok) finds libcuda.so through the runpath: add the driver's directory.
    autoAddDriverRunpath
  ];

  buildInputs = [
    cudaPackages.cuda_cccl
    cudaPackages.cuda_cudart
    (lib.getOutput "static" cudaPackages.cuda_cudart)
  ];

  cmakeFlags = [
    (lib.cmakeBool "MOK_ENABLE_CUDA" true)
    (lib.cmakeFeature "MOK_CUDA_ARCHITECTURES" flags.cmakeCudaArchitecturesString)
    (lib.cmakeFeature "CMAKE_CUDA_ARCHITECTURES" flags.cmakeCudaArchitecturesString)
    (lib.cmakeBool "MOK_BUILD_TESTS" true)
  ];

  # CTest: the host executor's tests; the GPU ones skip, saying so, in a sandbox without a GPU.
  doCheck = true;

  passthru = { inherit cudaPackages; };

  meta = {
    description = "A fused mixture-of-experts layer (dispatch, grouped SwiGLU GEMMs, combine) for NVIDIA GPUs";
    license = lib.licenses.asl20;
    platforms = [ "x86_64-linux" ];
  };
}
