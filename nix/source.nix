# libmok's source as the Nix builds see it: the repository without build outputs and local state, so
# that an unrelated file in the checkout does not change the derivations.
let
  root = ../.;
  ignored = [
    ".git"
    ".nox"
    ".toolchain"
    ".venv"
    "build"
    "dist"
    "result"
    "_skbuild"
  ];
in
builtins.path {
  path = root;
  name = "libmok-source";
  filter = path: type: !(builtins.elem (baseNameOf path) ignored);
}
