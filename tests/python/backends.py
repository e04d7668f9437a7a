"""The executors a test runs on: "reference" always, "host" where libmok's extension is built (MOK_NO_EXTENSION=1
runs the pure-PyTorch parts from a source tree without it)."""

import pytest

from mok import functional

HAS_HOST = "host" in functional.backends()
needs_host = pytest.mark.skipif(not HAS_HOST, reason="libmok's extension is not built (MOK_NO_EXTENSION=1)")
BACKENDS = ["reference", pytest.param("host", marks=needs_host)]
