# `nix flake check`: libmok's CTest suite (its checkPhase), the C++ example built against the installed
# package through CMake and pkg-config, and the Python tests against python3Packages.mok.
{
  stdenv,
  cmake,
  ninja,
  pkg-config,
  python3,
  libmok,
  src,
}:
{
  inherit libmok;

  consumer = stdenv.mkDerivation {
    name = "libmok-consumer-check";
    nativeBuildInputs = [
      cmake
      ninja
      pkg-config
    ];
    # The same script as the conda package test of libmok-dev.
    buildCommand = ''
      cp -r ${src}/examples/cpp cpp
      chmod -R u+w cpp
      PREFIX=${libmok.dev} bash ${src}/recipe/test_consumer.sh cpp
      touch $out
    '';
  };

  python-tests = stdenv.mkDerivation {
    name = "mok-python-tests";
    nativeBuildInputs = [
      (python3.withPackages (ps: [
        ps.mok
        ps.pytest
      ]))
    ];
    # From a copy of the tests, so that `import mok` finds the installed package, not python/.
    buildCommand = ''
      cp -r ${src}/tests tests
      chmod -R u+w tests
      python -m pytest -q -p no:cacheprovider tests/python
      touch $out
    '';
  };
}
