# The mok Python package, linked against the flake's libmok rather than bundling its own copy.
{
  lib,
  buildPythonPackage,
  scikit-build-core,
  nanobind,
  cmake,
  ninja,
  libmok,
  torch,
  numpy,
  src,
}:
buildPythonPackage {
  pname = "mok";
  version = "0.5.0";
  pyproject = true;
  # The package's own directory: with MOK_USE_INSTALLED it needs nothing from the rest of the tree.
  src = "${src}/python";

  build-system = [
    scikit-build-core
    nanobind
  ];
  nativeBuildInputs = [
    cmake
    ninja
  ];
  # scikit-build-core runs CMake itself.
  dontUseCmakeConfigure = true;
  buildInputs = [ libmok ];
  dependencies = [
    torch
    numpy
  ];

  # python/pyproject.toml reads this into -DMOK_USE_INSTALLED: find_package(mok) instead of a bundled build.
  env.MOK_USE_INSTALLED = "ON";

  pythonImportsCheck = [ "mok" ];

  meta = libmok.meta // {
    description = "PyTorch bindings of libmok";
  };
}
