# libmok's source as the Nix builds see it: the repository without build outputs and local state, so
# that an unrelated file in the checkout does not change the derivations.
let
  root = toString ../.;
  # Paths relative to the repository root.
  ignored = [
    ".git"
    ".nox"
    ".toolchain"
    ".venv"
    "build"
    "dist"
    "python/build"
    "result"
    "_skbuild"
  ];
  relative = path: builtins.substring (builtins.stringLength root + 1) (builtins.stringLength path) path;
in
builtins.path {
  path = ../.;
  name = "libmok-source";
  filter = path: type: !(builtins.elem (relative path) ignored);
}
