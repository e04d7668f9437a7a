# The test stand-in for nixpkgs (see default.nix): `--override-input nixpkgs path:<this dir>`.
{
  outputs = { self }: { };
}
