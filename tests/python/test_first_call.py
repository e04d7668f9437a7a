"""The first mok.moe call of a process stays off torch._dynamo (importing it costs seconds)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from backends import BACKENDS

PROGRAM = """
import sys, torch, mok
from mok.experts import RoutedExperts
torch.manual_seed(0)
T, H, I, E, K = 16, 64, 32, 2, 2
x = torch.randn(T, H).bfloat16().requires_grad_()
routed = RoutedExperts(*(torch.randn(E, *s).bfloat16().requires_grad_() for s in ((I, H), (I, H), (H, I))))
out = mok.moe(x, torch.randint(0, E, (T, K)), torch.rand(T, K), routed, backend=sys.argv[1])
out.float().sum().backward()
assert x.grad is not None and routed.gate.grad is not None
print("dynamo imported:", "torch._dynamo" in sys.modules)
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_first_call_does_not_import_dynamo(backend):
    done = subprocess.run([sys.executable, "-c", PROGRAM, backend], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "dynamo imported: False" in done.stdout, done.stdout + done.stderr
