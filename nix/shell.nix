# The development shell: the whole toolchain of libmok's builds, tests and packaging.
{
  mkShell,
  cudaPackages,
  cmake,
  ninja,
  pkg-config,
  python3,
  libmok,
}:
mkShell {
  inputsFrom = [ libmok ];
  packages = [
    cmake
    ninja
    pkg-config
    cudaPackages.cuda_nvcc
    (python3.withPackages (ps: [
      ps.torch
      ps.numpy
      ps.pytest
      ps.nox
      ps.scikit-build-core
      ps.nanobind
    ]))
  ];
  CUDAARCHS = cudaPackages.flags.cmakeCudaArchitecturesString;
}
