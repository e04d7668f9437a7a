# libmok's additions to nixpkgs: CUDA 13.0 as the package set for everything (torch included), libmok,
# and python3Packages.mok.
{ src }:
final: prev: {
  cudaPackages = final.cudaPackages_13_0;
  libmok = final.callPackage ./libmok.nix { inherit src; };
  pythonPackagesExtensions = prev.pythonPackagesExtensions ++ [
    (pyfinal: pyprev: { mok = pyfinal.callPackage ./mok.nix { inherit src; }; })
  ];
}
