# The repository's flake is nix/flake.nix; this re-exports it so that `nix build .#libmok` works from the
# root. Flakes cannot import their inputs: the nixpkgs pin is repeated here and in flake.lock, and
# tests/packaging/test_nix.py checks that both pins agree.
{
  description = "libmok: a fused mixture-of-experts layer library for NVIDIA GPUs (CUDA 13.0, sm_100a and sm_103a)";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/643809054d65fdd466a63e3155b8c498cb483c04";

  outputs = inputs: (import ./nix/flake.nix).outputs inputs;
}
