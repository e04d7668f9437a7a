# A stand-in for nixpkgs that provides exactly the attributes nix/*.nix use, so that libmok's flake
# evaluates offline (the real nixpkgs needs Nix >= 2.18 and the network). It computes the CUDA flags
# from the configuration the way nixpkgs does, and its derivations keep every attribute they were given,
# so tests can read them; building one fails, by design.
{
  system,
  config ? { },
  overlays ? [ ],
}:
let
  fix = f: let x = f x; in x;
  applyOverlays = base: exts: fix (self: builtins.foldl' (acc: ext: acc // ext self acc) (base self) exts);

  unbuildable = [
    "-c"
    "echo 'a nix_fixture derivation cannot be built' >&2; exit 1"
  ];
  fake = name: attrs: derivation ({ inherit name system; builder = "/bin/sh"; args = unbuildable; } // attrs);
  tool = name: fake "${name}-fixture" { };

  # mkDerivation's shape: env, passthru and meta stay out of the derivation itself. `fixtureStdenv`
  # (fixture only) names the stdenv that made the derivation.
  mkDerivationWith =
    stdenvName: args:
    let
      name = args.name or "${args.pname}-${args.version}";
      attrs = removeAttrs args [ "env" "passthru" "meta" ] // (args.env or { });
    in
    fake name attrs // (args.passthru or { }) // { meta = args.meta or { }; fixtureStdenv = stdenvName; };
  mkDerivation = mkDerivationWith "stdenv";

  lib = {
    cmakeBool = name: value: "-D${name}:BOOL=${if value then "TRUE" else "FALSE"}";
    cmakeFeature = name: value: "-D${name}:STRING=${value}";
    getOutput = output: pkg: pkg.${output} or pkg.out;
    licenses.asl20.spdxId = "Apache-2.0";
  };

  callPackageWith =
    scope: file: overrides:
    let
      f = import file;
    in
    f (builtins.intersectAttrs (builtins.functionArgs f) scope // overrides);

  dropDot = builtins.replaceStrings [ "." ] [ "" ];

  cudaPackages_13_0 = rec {
    cudaMajorMinorVersion = "13.0";
    flags = {
      cudaCapabilities = config.cudaCapabilities;
      cudaForwardCompat = config.cudaForwardCompat or true;
      cmakeCudaArchitecturesString = builtins.concatStringsSep ";" (map dropDot config.cudaCapabilities);
    };
    backendStdenv.mkDerivation = mkDerivationWith "cudaPackages.backendStdenv";
    cuda_nvcc = tool "cuda_nvcc-13.0";
    cuda_cccl = tool "cuda_cccl-13.0";
    cuda_cudart = fake "cuda_cudart-13.0-fixture" { outputs = [ "out" "dev" "static" ]; };
  };

  pythonBase = py: {
    callPackage = callPackageWith (pkgs // py);
    buildPythonPackage = mkDerivationWith "buildPythonPackage";
    scikit-build-core = tool "scikit-build-core";
    nanobind = tool "nanobind";
    torch = tool "torch";
    numpy = tool "numpy";
    pytest = tool "pytest";
    nox = tool "nox";
  };

  base = self: {
    inherit lib cudaPackages_13_0;
    config = config;
    callPackage = callPackageWith self;
    stdenv = { inherit mkDerivation; };
    mkShell = args: mkDerivation ({ name = "shell"; } // args);
    cmake = tool "cmake";
    ninja = tool "ninja";
    pkg-config = tool "pkg-config";
    autoAddDriverRunpath = tool "auto-add-driver-runpath-hook";
    fetchurl = { url, hash }: fake "fetchurl-fixture" { inherit url hash; };
    cudaPackages = throw "the fixture has no default CUDA package set: pick one (cudaPackages_13_0)";
    pythonPackagesExtensions = [ ];
    python3Packages = applyOverlays pythonBase self.pythonPackagesExtensions;
    python3 = {
      withPackages = select: fake "python3-env" { packages = select self.python3Packages; };
    };
  };

  pkgs = applyOverlays base overlays;
in
assert config.cudaSupport or false;
pkgs
