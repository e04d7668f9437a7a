"""mok: the Python face of libmok, a fused mixture-of-experts layer library.

`mok.moe(...)` is the one call most users need; `mok.functional` exposes the pieces (config, workspace, schedule,
forward, backward), `mok.nn.MoE` is a drop-in module, `mok.ops` holds the torch custom ops.
"""

import os as _os

if _os.environ.get("MOK_NO_EXTENSION") != "1":
    # libmok's C ABI; MOK_NO_EXTENSION=1 lets the pure-PyTorch parts run from a source tree without a build.
    from mok._lib import __version__, backends, libmok_version  # noqa: F401
else:  # pragma: no cover - development only
    __version__ = "0+source"

# --- layer API (re-exported from the pure-PyTorch modules) ---
# --- end layer API ---
