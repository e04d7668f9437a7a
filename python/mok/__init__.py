"""mok: the Python face of libmok, a fused mixture-of-experts layer library.

`mok.moe(...)` is the one call most users need; `mok.functional` exposes the pieces (config, workspace, schedule,
forward, backward), `mok.nn.MoE` is a drop-in module, `mok.routers` holds its routers and losses, `mok.ops` the
torch custom ops, `mok.reference` the exact math every executor is checked against, `mok.quant` the MXFP8 codec.
"""

import os as _os

from mok import functional, nn, ops, quant, reference, routers  # noqa: F401
from mok.experts import RoutedExperts, RoutedExpertsMXFP8, SharedExpert  # noqa: F401
from mok.functional import LOCAL, MoKConfig, clear_workspaces  # noqa: F401
from mok.layer import moe  # noqa: F401
from mok.quant import mxfp8_dequantize, mxfp8_quantize  # noqa: F401

if _os.environ.get("MOK_NO_EXTENSION") != "1":
    # libmok's C ABI, and its CPU executor as backend="host". MOK_NO_EXTENSION=1 lets the pure-PyTorch parts run
    # from a source tree that has no built extension.
    from mok import cuda, host  # noqa: F401
    from mok._lib import __version__, backends, libmok_version  # noqa: F401
else:  # pragma: no cover - development only
    __version__ = "0+source"
