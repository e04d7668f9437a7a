# The nixpkgs configuration libmok is built under: CUDA for Blackwell's architecture-specific targets
# only (tcgen05 needs sm_100a/sm_103a), and no PTX for later GPUs, which could not run it anyway.
{
  allowUnfree = true; # the CUDA toolkit's licence is unfree
  cudaSupport = true;
  cudaCapabilities = [
    "10.0a"
    "10.3a"
  ];
  cudaForwardCompat = false;
}
