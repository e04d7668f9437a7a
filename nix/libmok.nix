# libmok: the shared library ($out) and its headers, CMake package and pkg-config file ($dev), built
# with the CUDA backend stdenv (a host compiler nvcc 13.0 accepts) for the configured capabilities.
{
  lib,
  cudaPackages,
  cmake,
  ninja,
  autoAddDriverRunpath,
  fetchurl,
  src,
}:
let
  inherit (cudaPackages) backendStdenv flags;
  # CUTLASS 4.2's headers for the grouped GEMMs of the cuda executor: the nvidia-cutlass wheel on PyPI (the one
  # recipe/recipe.yaml pins), unpacked before CMake runs; only its headers are used. Without them libmok would
  # carry no cuda executor (mokExecutorCompiled says 0).
  cutlassWheel = fetchurl {
    url = "https://files.pythonhosted.org/packages/21/6b/e86fc2fd536dd4b8bd2209aa31d7002610c501b0802337787eac9c9b328c/nvidia_cutlass-4.2.0.0-py3-none-any.whl";
    hash = "sha256-+Vma2kXHvLa/U/fT8KfRVBg+U0UcAb+lnuzTfdSmk/Y=";
  };
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

  preConfigure = ''
    mkdir -p cutlass-wheel
    (cd cutlass-wheel && cmake -E tar xf ${cutlassWheel})
    cmakeFlagsArray+=("-DMOK_CUTLASS_INCLUDE_DIR=$PWD/cutlass-wheel/cutlass_library/source/include")
  '';

  # CTest: the host executor's tests; the GPU ones skip, saying so, in a sandbox without a GPU.
  doCheck = true;

  passthru = { inherit cudaPackages; };

  meta = {
    description = "A fused mixture-of-experts layer (dispatch, grouped SwiGLU GEMMs, combine) for NVIDIA GPUs";
    license = lib.licenses.asl20;
    platforms = [ "x86_64-linux" ];
  };
}
