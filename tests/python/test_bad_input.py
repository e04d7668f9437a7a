"""Bad input: a TypeError or ValueError naming the argument and the rule, before any work, on every rank."""

from __future__ import annotations

import re

import pytest
import torch
from dist_utils import run_group
from test_layer import make_inputs

import mok.layer
from mok import functional
from mok.experts import RoutedExperts, SharedExpert

T, E, K = 12, 4, 2


def good():
    x, ids, weights, routed, shared, dout = make_inputs(T, E, K)
    return dict(x=x, topk_ids=ids, topk_weights=weights, routed=routed, shared=shared)


def non_contiguous(t):
    return t.t().contiguous().t()  # same values and shape, column-major strides


def routed_with(routed, **parts):
    """A RoutedExperts with some weights swapped, bypassing the container's own checks (to reach the layer's)."""
    r = RoutedExperts(routed.gate, routed.up, routed.down)
    for name, value in parts.items():
        object.__setattr__(r, name, value)
    return r


# (what is wrong, how to make it wrong, expected error type, regex naming the argument and the rule)
CASES = [
    ("x dtype", lambda a: a.update(x=a["x"].float()), TypeError, "x must be bfloat16, got float32"),
    ("x not a tensor", lambda a: a.update(x=a["x"].tolist()), TypeError, "x must be a torch.Tensor"),
    ("x 3-D", lambda a: a.update(x=a["x"][None]), ValueError, "x must be 2-D"),
    ("x non-contiguous", lambda a: a.update(x=non_contiguous(a["x"])), ValueError, "x must be contiguous"),
    ("ids dtype", lambda a: a.update(topk_ids=a["topk_ids"].float()), TypeError,
     "topk_ids must be int32 or int64, got float32"),
    ("ids rows", lambda a: a.update(topk_ids=a["topk_ids"][:-1].contiguous()), ValueError,
     "topk_ids must have one row per token of x"),
    ("ids too large", lambda a: a["topk_ids"].__setitem__((0, 0), E), ValueError,
     r"topk_ids must be -1 \(no route\) or an expert id in \[0, 4\).* got 4"),
    ("ids below -1", lambda a: a["topk_ids"].__setitem__((3, 1), -2), ValueError,
     r"topk_ids must be -1 \(no route\) .* got -2"),
    ("K mismatch", lambda a: a.update(topk_weights=a["topk_weights"][:, :1].contiguous()), ValueError,
     r"topk_weights must have topk_ids' shape \(12, 2\) \(same T and K\)"),
    ("weights dtype", lambda a: a.update(topk_weights=a["topk_weights"].double()), TypeError,
     "topk_weights must be float32, got float64"),
    ("weights non-contiguous", lambda a: a.update(topk_weights=non_contiguous(a["topk_weights"])), ValueError,
     "topk_weights must be contiguous"),
    ("weights device", lambda a: a.update(topk_weights=a["topk_weights"].to("meta")), ValueError,
     "topk_weights must be on x's device cpu, got meta"),
    ("routed type", lambda a: a.update(routed=(a["routed"].gate, a["routed"].up, a["routed"].down)), TypeError,
     "routed must be a RoutedExperts or RoutedExpertsMXFP8"),
    ("routed hidden size", lambda a: a.update(x=torch.randn(T, 32).to(torch.bfloat16)), ValueError,
     r"routed experts' hidden size must equal x.shape\[1\] \(32\)"),
    ("routed non-contiguous", lambda a: a.update(routed=routed_with(a["routed"], gate=non_contiguous_3d(
        a["routed"].gate))), ValueError, "routed.gate must be contiguous"),
    ("routed device", lambda a: a.update(routed=routed_with(a["routed"], down=a["routed"].down.to("meta"))),
     ValueError, "routed.down must be on x's device cpu, got meta"),
    ("shared type", lambda a: a.update(shared="shared"), TypeError, "shared must be a SharedExpert or None"),
    ("shared hidden size", lambda a: a.update(shared=SharedExpert(*(torch.zeros(s, dtype=torch.bfloat16) for s in
                                                                   ((8, 32), (8, 32), (32, 8))))), ValueError,
     r"shared expert's hidden size must equal x.shape\[1\] \(64\)"),
    ("swiglu_limit", lambda a: a.update(swiglu_limit=-1.0), ValueError, "swiglu_limit must be None or a finite"),
    ("swiglu_limit type", lambda a: a.update(swiglu_limit="1"), TypeError, "swiglu_limit must be None or a "),
    ("backend", lambda a: a.update(backend="cuda-magic"), ValueError, "backend must be None or one of"),
    ("config", lambda a: a.update(config={"minibatch_size": 1}), TypeError, "config must be a MoKConfig"),
]


def non_contiguous_3d(t):
    return t.transpose(1, 2).contiguous().transpose(1, 2)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("entry", ["moe", "functional"])
def test_single_process(seed, case, entry):
    _, spoil, error, pattern = case
    args = good()
    spoil(args)
    call = mok.layer.moe if entry == "moe" else functional.forward
    with pytest.raises(error, match=pattern):
        call(args.pop("x"), args.pop("topk_ids"), args.pop("topk_weights"), args.pop("routed"), args.pop("shared"),
             **args)


def test_bad_dout(seed):
    args = good()
    _, ctx = functional.forward(*args.values())
    with pytest.raises(TypeError, match="dout must be bfloat16, got float32"):
        functional.backward(ctx, torch.randn(T, 64))
    with pytest.raises(ValueError, match=r"dout must have the output's shape \(12, 64\)"):
        functional.backward(ctx, torch.randn(T + 1, 64).to(torch.bfloat16))
    with pytest.raises(ValueError, match="dout must be contiguous"):
        functional.backward(ctx, non_contiguous(torch.randn(T, 64).to(torch.bfloat16)))


# In a group, one rank's bad argument (or ranks that disagree) must make every rank raise the same error.
GROUP_CASES = {
    "rank 1 x dtype": (1, lambda a: a.update(x=a["x"].float()), TypeError, "rank 1: x must be bfloat16"),
    "rank 1 id range": (1, lambda a: a["topk_ids"].__setitem__((0, 0), 2 * E), ValueError,
                        r"rank 1: topk_ids must be -1 \(no route\) or an expert id in \[0, 8\)"),
    "rank 0 routed type": (0, lambda a: a.update(routed=None), TypeError, "rank 0: routed must be"),
    "ranks disagree on H": (1, lambda a: a.update(x=torch.randn(T, 32).to(torch.bfloat16),
                                                  routed=RoutedExperts(*(torch.zeros(s, dtype=torch.bfloat16)
                                                                         for s in ((E, 8, 32), (E, 8, 32),
                                                                                   (E, 32, 8)))),
                                                  shared=None), ValueError,
                            r"every rank of the group must have the same hidden \(x.shape\[1\]\), got rank 0: 64, "
                            "rank 1: 32"),
    "ranks disagree on K": (0, lambda a: a.update(topk_ids=a["topk_ids"][:, :1].contiguous(),
                                                  topk_weights=a["topk_weights"][:, :1].contiguous()), ValueError,
                            "every rank of the group must have the same topk"),
    "ranks disagree on mxfp8": (1, lambda a: a.update(routed=a["routed"].to_mxfp8()), ValueError,
                                "every rank of the group must have the same mxfp8"),
}


def group_worker(rank, world, seed):
    """Every case on every rank; record what each rank raised. Then a good call must still work (the group is
    not left inconsistent by the failed ones)."""
    torch.manual_seed(seed + rank)
    raised = {}
    for name, (bad_rank, spoil, _, _) in GROUP_CASES.items():
        args = good()
        if rank == bad_rank:
            spoil(args)
        try:
            mok.layer.moe(*args.values())
            raised[name] = None
        except (TypeError, ValueError) as e:
            raised[name] = (type(e), str(e))
    args = good()
    out, ctx = functional.forward(*args.values())
    bad_dout = torch.randn(T, 64) if rank == 1 else torch.randn(T, 64).to(torch.bfloat16)
    try:
        functional.backward(ctx, bad_dout)
        raised["rank 1 dout"] = None
    except (TypeError, ValueError) as e:
        raised["rank 1 dout"] = (type(e), str(e))
    return raised, out.shape


def test_every_rank_raises_the_same_error(seed):
    results = run_group(2, group_worker, seed)
    for name, (_, _, error, pattern) in {**GROUP_CASES, "rank 1 dout": (1, None, TypeError,
                                                                        "rank 1: dout must be bfloat16")}.items():
        seen = [raised[name] for raised, _ in results]
        assert seen[0] is not None and seen[0] == seen[1], f"{name}: ranks raised {seen}"
        assert seen[0][0] is error, f"{name}: {seen[0]}"
        assert re.search(pattern, seen[0][1]), f"{name}: {seen[0][1]!r} does not match {pattern!r}"
    assert all(shape == (T, 64) for _, shape in results)

