"""libmok's stream argument, the error record's pass and abort_rank, and mokLayerAbort's reason through mok._mok
(docs/c-api.md, "Streams, completion and errors"): on the host executor a stream other than 0 is a ValueError
naming 'stream', and nothing is written; the record counts the collective calls; an abort's reason reaches
error()."""

from __future__ import annotations

import os

import pytest
import torch
from backends import needs_host

pytestmark = needs_host

E, H, I, K, T = 2, 32, 16, 2, 8
NOT_A_STREAM = 0x1000  # any address but 0: the host executor must refuse it without touching it


def make_layer():
    from mok import _mok

    cfg = dict(world=1, rank=0, experts_per_rank=E, hidden=H, intermediate=I, top_k=K, max_tokens=T,
               expert_padding=8, minibatch=16, macrobatch=32, comm_workers=1, compute_workers=1, timeout_ms=20000)
    _, workspace_bytes = _mok.layer_sizes(cfg)
    memory = torch.empty(workspace_bytes + 64, dtype=torch.uint8)
    offset = -memory.data_ptr() % 64
    name = f"mok-test-streams-{os.getpid()}-{os.urandom(4).hex()}"
    return _mok.Layer(cfg, name, memory.data_ptr() + offset, workspace_bytes), memory


def test_a_stream_is_refused_and_the_record_counts_the_calls():
    layer, _memory = make_layer()
    ids = torch.randint(0, E, (T, K), dtype=torch.int32)
    x = torch.randn(T, H).bfloat16()
    weights = torch.rand(T, K) + 0.05
    experts = {n: (torch.randn(E, I, H) * 0.2).bfloat16() for n in ("gate", "up")}
    experts["down"] = (torch.randn(E, H, I) * 0.2).bfloat16()
    w = {n: t.data_ptr() for n, t in experts.items()}
    out = torch.full((T, H), 7.0, dtype=torch.bfloat16)
    assert layer.error()["pass"] == 0 and layer.error()["abort_rank"] == -1
    with pytest.raises(ValueError, match="'stream'.*must be NULL"):
        layer.build_schedule(ids.data_ptr(), False, T, NOT_A_STREAM)
    layer.build_schedule(ids.data_ptr(), False, T)  # stream 0 by default
    with pytest.raises(ValueError, match="mokLayerForward: argument 'stream'"):
        layer.forward(w, x.data_ptr(), weights.data_ptr(), out.data_ptr(), stream=NOT_A_STREAM)
    assert bool((out == 7.0).all()), "a refused forward wrote its output"
    layer.forward(w, x.data_ptr(), weights.data_ptr(), out.data_ptr(), 0)
    assert not bool((out == 7.0).all()), "the forward wrote no output"
    record = layer.error()
    assert record["status"] == 0 and record["pass"] == 4, record  # four collective calls, two of them refused
    layer.abort("the test stops here")
    record = layer.error()
    assert record["status"] == 10 and record["abort_rank"] == 0 and record["pass"] == 4, record  # mokPeerAbort
    assert record["detail"] == "rank 0 aborted the group: the test stops here", record
    layer.close()


def test_abort_without_a_reason():
    layer, _memory = make_layer()
    layer.abort()
    record = layer.error()
    assert record["detail"] == "rank 0 aborted the group: no reason given" and record["pass"] == 0, record
    layer.close()


def test_the_quantiser_refuses_a_stream():
    from mok import _mok
    from mok.quant import scale_bytes

    t = torch.randn(4, 64)
    outputs = [torch.full((n,), 0xCD, dtype=torch.uint8) for n in (4 * 64, scale_bytes(4, 64))]
    with pytest.raises(ValueError, match="mokMxfp8Quantize: argument 'stream'"):
        _mok.mxfp8_quantize(t.data_ptr(), True, 1, 4, 64, outputs[0].data_ptr(), outputs[1].data_ptr(), 0, 0,
                            NOT_A_STREAM)
    assert all(bool((o == 0xCD).all()) for o in outputs), "a refused quantisation wrote"
    _mok.mxfp8_quantize(t.data_ptr(), True, 1, 4, 64, outputs[0].data_ptr(), outputs[1].data_ptr(), 0, 0)
    assert not bool((outputs[0] == 0xCD).all())
