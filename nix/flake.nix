{
  description = "libmok: a fused mixture-of-experts layer library for NVIDIA GPUs (CUDA 13.0, sm_100a and sm_103a)";

  # Pinned in flake.lock; the root flake.nix re-exports this flake and pins the same revision.
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/643809054d65fdd466a63e3155b8c498cb483c04";

  outputs =
    { self, nixpkgs }:
    let
      system = "x86_64-linux";
      pkgs = import nixpkgs {
        inherit system;
        config = import ./cuda-config.nix;
        overlays = [ self.overlays.default ];
      };
    in
    {
      overlays.default = import ./overlay.nix { src = import ./source.nix; };

      packages.${system} = {
        inherit (pkgs) libmok;
        mok = pkgs.python3Packages.mok;
        default = pkgs.libmok;
      };

      devShells.${system}.default = pkgs.callPackage ./shell.nix { };

      checks.${system} = pkgs.callPackage ./checks.nix { src = import ./source.nix; };
    };
}
