"""Bad input: a TypeError or ValueError naming the argument and the rule, before any work, on every rank."""

from __future__ import annotations

import re

import pytest
import torch
import torch.distributed as dist
from backends import BACKENDS, needs_host
from dist_utils import run_group
from test_layer import make_inputs

import mok.layer
import mok.validate
from mok import functional
from mok.experts import RoutedExperts, SharedExpert
from mok.functional import MainGrads, MoKConfig
from mok.quant import padding_offsets

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
            mok.layer.moe(*args.values(), group=dist.group.WORLD)
            raised[name] = None
        except (TypeError, ValueError) as e:
            raised[name] = (type(e), str(e))
    args = good()
    out, ctx = functional.forward(*args.values(), group=dist.group.WORLD)
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



# ----------------------------------------------------------------------------------------------------------------
# Layout: libmok reads and writes every tensor through its data pointer as a dense row-major array, so a strided
# or expanded view is an error on every backend (the same error, whichever backend the user picks).

def expanded(t):
    """t's first entry repeated along dim 0 by a stride-0 view: t's shape, a single entry of memory."""
    return t[:1].expand(t.shape)


def forms_with(routed_mx, part, form, **tensors):
    """routed_mx with one MXFP8 form's data or scales swapped (same values, other strides)."""
    pair = getattr(routed_mx, part)
    q = getattr(pair, form)
    q = type(q)(tensors.get("data", q.data), tensors.get("scales", q.scales), q.transposed)
    pair = pair._replace(**{form: q})
    return type(routed_mx)(routed_mx.master, **{p: pair if p == part else getattr(routed_mx, p)
                                                for p in ("gate", "up", "down")})


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,spoil,rule", [
    ("gate", non_contiguous_3d, r"main_grads.gate must be contiguous \(call .contiguous\(\)\), got shape \(4, 48, 64\) "
     r"strides \(3072, 1, 48\)"),
    ("up", expanded, r"main_grads.up must be contiguous .* \(dim 0 has stride 0: an expand\(\)ed view\)"),
    ("shared_down", lambda t: t.t().contiguous().t(), "main_grads.shared_down must be contiguous"),
])
def test_main_grads_layout(seed, backend, name, spoil, rule):
    args = good()
    _, ctx = functional.forward(*args.values(), backend=backend)
    weight = getattr(args["shared"], name[7:]) if name.startswith("shared_") else getattr(args["routed"], name)
    buffer = spoil(torch.randn(weight.shape))
    before = buffer.clone()
    with pytest.raises(ValueError, match=rule):
        functional.backward(ctx, torch.randn(T, 64).to(torch.bfloat16), main_grads=MainGrads(**{name: buffer}))
    assert torch.equal(buffer, before)  # nothing written


@pytest.mark.parametrize("backend", BACKENDS)
def test_main_grads_must_not_share_memory(seed, backend):
    args = good()
    _, ctx = functional.forward(*args.values(), backend=backend)
    shared_buffer = torch.randn(args["routed"].gate.shape)
    before = shared_buffer.clone()
    with pytest.raises(ValueError, match="main_grads.up must not share memory with main_grads.gate"):
        functional.backward(ctx, torch.randn(T, 64).to(torch.bfloat16),
                            main_grads=MainGrads(gate=shared_buffer, up=shared_buffer))
    assert torch.equal(shared_buffer, before)


@pytest.mark.parametrize("entry", ["moe", "functional"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("part,form,kind", [("gate", "rowwise", "data"), ("up", "colwise", "scales"),
                                            ("down", "colwise", "data"), ("down", "rowwise", "scales")])
def test_mxfp8_forms_layout(seed, entry, backend, part, form, kind):
    """A copy of a form with the same values and other strides (the issue: a different output on host)."""
    args = good()
    routed_mx = args["routed"].to_mxfp8()
    tensor = getattr(getattr(getattr(routed_mx, part), form), kind)
    strided = tensor.transpose(-1, -2).contiguous().transpose(-1, -2)  # data [E, R, C], scales [E, bytes]
    args["routed"] = forms_with(routed_mx, part, form, **{kind: strided})
    call = mok.layer.moe if entry == "moe" else functional.forward
    with pytest.raises(ValueError, match=f"routed.{part}.{form}.{kind} must be contiguous"):
        call(*args.values(), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("part,form", [("gate", "rowwise"), ("down", "colwise")])
def test_mxfp8_nan_padding_scale(seed, backend, part, form):
    """A NaN scale (255) in a padding byte of the SM100 layout: a block-scaled MMA reads padding, so it is refused."""
    args = good()
    routed_mx = args["routed"].to_mxfp8()
    q = getattr(getattr(routed_mx, part), form)
    pad = padding_offsets(*q.data.shape[-2:])
    scales = q.scales.clone()
    scales[int(torch.randint(0, scales.shape[0], ())), pad[int(torch.randint(0, len(pad), ()))]] = 255
    args["routed"] = forms_with(routed_mx, part, form, scales=scales)
    with pytest.raises(ValueError, match=f"routed.{part}.{form}.scales holds the NaN scale 255 at a padding byte"):
        functional.forward(*args.values(), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mxfp8_forms_device(seed, backend):
    args = good()
    routed_mx = args["routed"].to_mxfp8()
    args["routed"] = forms_with(routed_mx, "up", "rowwise", scales=routed_mx.up.rowwise.scales.to("meta"))
    with pytest.raises(ValueError, match="routed.up.rowwise.scales must be on x's device cpu, got meta"):
        functional.forward(*args.values(), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["x", "topk_ids", "routed.down", "shared.gate"])
def test_expanded_inputs(seed, backend, case):
    args = good()
    if case == "x":
        args["x"] = expanded(args["x"])
    elif case == "topk_ids":
        args["topk_ids"] = expanded(args["topk_ids"])
    elif case == "routed.down":
        args["routed"] = routed_with(args["routed"], down=expanded(args["routed"].down))
    else:
        # SharedExpert itself rejects it (test_dtypes.py); bypass that to reach the layer's own check.
        shared = args["shared"]
        args["shared"] = SharedExpert(shared.gate, shared.up, shared.down)
        object.__setattr__(args["shared"], "gate", expanded(shared.gate))
    with pytest.raises(ValueError, match=fr"{case} must be contiguous .*dim 0 has stride 0"):
        functional.forward(*args.values(), backend=backend)


# ----------------------------------------------------------------------------------------------------------------
# libmok's limits: checked in Python, naming the Python argument and the value the user passed (never the C field
# a value becomes, nor a value derived from it).


@pytest.mark.parametrize("value", [1e-4, 0.0009, 86401, 1e7, 1e30])
def test_wait_timeout_out_of_range(value):
    with pytest.raises(ValueError, match=fr"MoKConfig.wait_timeout_s must be a number of seconds between 0.001 "
                                         fr"\(1 ms\) and 86400 \(24 h\), got {re.escape(repr(value))}$"):
        MoKConfig(wait_timeout_s=value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_wait_timeout_of_a_day_runs(seed, backend):
    """24 h, the longest, reaches libmok as 86400000 ms and runs (1 ms, the shortest, is accepted too, but a
    layer run under it can time out on a loaded machine)."""
    assert MoKConfig(wait_timeout_s=0.001).wait_timeout_s == 0.001
    args = good()
    out, ctx = functional.forward(*args.values(), backend=backend, config=MoKConfig(wait_timeout_s=86400))
    assert out.shape == (T, 64) and functional.backward(ctx, torch.randn(T, 64).to(torch.bfloat16)).x.shape == (T, 64)


def test_macrobatch_at_most_libmok_limit():
    MoKConfig(macrobatch_size=1 << 26)
    with pytest.raises(ValueError, match=r"MoKConfig.macrobatch_size must be .*at most 2\^26, got 134217728"):
        MoKConfig(macrobatch_size=1 << 27)


def tiny_layer(tokens, hidden, topk, intermediate=1, experts=1):
    """Arguments whose one large dim is what is tested; every value is unread when the checks hold (empty)."""
    x = torch.empty(tokens, hidden, dtype=torch.bfloat16)
    ids = torch.zeros(tokens, topk, dtype=torch.int32)
    weights = torch.empty(tokens, topk)
    routed = RoutedExperts(*(torch.empty(s, dtype=torch.bfloat16) for s in ((experts, intermediate, hidden),
                                                                            (experts, intermediate, hidden),
                                                                            (experts, hidden, intermediate))))
    return x, ids, weights, routed


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case,shape,rule", [
    ("tokens", (2**24 + 1, 1, 1), r"x must have at most 2\^24 tokens \(rows\) per rank \(libmok's limit\), "
                                  r"got 16777217"),
    ("hidden", (1, 2**20 + 1, 1), r"x.shape\[1\] \(the hidden size\) must be at most 2\^20 .*got 1048577"),
    ("topk", (1, 1, 1025), r"topk_ids must have at most 1024 columns \(K <= 1024\) .*got 1025"),
])
def test_layer_shape_limits(backend, case, shape, rule):
    with pytest.raises(ValueError, match=rule):
        functional.forward(*tiny_layer(*shape), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_expert_limits(backend):
    x, ids, weights, routed = tiny_layer(1, 1, 1, intermediate=2**20 + 1)
    with pytest.raises(ValueError, match=r"routed experts' I \(gate.shape\[1\]\) must be at most 2\^20 .*got 1048577"):
        functional.forward(x, ids, weights, routed, backend=backend)


@pytest.mark.parametrize("field,value", [("max_tokens", 2**24 + 1), ("hidden", 2**20 + 1), ("topk", 1025),
                                         ("num_local_experts", 2**20 + 1), ("intermediate", 2**20 + 1),
                                         ("shared_intermediate", 2**20 + 1)])
def test_workspace_limits(field, value):
    args = dict(max_tokens=64, hidden=64, topk=2, num_local_experts=4, intermediate=48, shared_intermediate=40)
    with pytest.raises(ValueError, match=fr"^{field} must be an int in \[\d, \d+\] \(libmok's limit\), got {value}$"):
        functional.create_workspace(**{**args, field: value})


@pytest.mark.parametrize("backend", BACKENDS)
def test_mxfp8_needs_padding_of_32(seed, backend):
    args = good()
    args["routed"] = args["routed"].to_mxfp8()
    config = MoKConfig(expert_padding=16, minibatch_size=64, macrobatch_size=128)
    rule = "MoKConfig.expert_padding must be a multiple of 32 with MXFP8 experts .*got 16"
    with pytest.raises(ValueError, match=rule):
        functional.forward(*args.values(), backend=backend, config=config)
    with pytest.raises(ValueError, match=rule):
        functional.create_workspace(max_tokens=16, hidden=64, topk=2, num_local_experts=4, intermediate=48,
                                    mxfp8=True, config=config, backend=backend)


@needs_host
def test_binding_names_a_config_int_that_does_not_fit():
    """mok._mok's config dict: an int beyond 32 bits is a ValueError naming the key (was: std::bad_cast)."""
    from mok import _mok

    with pytest.raises(ValueError, match=r"config: 'timeout_ms' \(10000000000\) must fit a 32-bit int"):
        _mok.layer_sizes({"timeout_ms": 10**10})
    with pytest.raises(ValueError, match="config: 'hidden' must be an int"):
        _mok.layer_sizes({"hidden": 1.5})


@needs_host
def test_libmok_messages_name_the_python_argument():
    """What libmok still rejects on its own is reported under the Python name (the backstop behind validate)."""
    from mok import _libmok_executor, _mok

    config = dict(world=1, rank=0, experts_per_rank=1, hidden=2**21, intermediate=1, top_k=1, max_tokens=1)
    with pytest.raises(ValueError, match=r"argument 'x.shape\[1\] \(hidden\)' \(2097152\) must be in \[1, 1048576\]"):
        with _libmok_executor._python_names():
            _mok.layer_sizes(config)


@pytest.mark.parametrize("backend", BACKENDS)
def test_build_schedule_limits(backend):
    with pytest.raises(ValueError, match=r"topk_ids must have at most 1024 columns \(K <= 1024\) .*got 1025"):
        functional.build_schedule(torch.zeros(1, 1025, dtype=torch.int64), 4, backend=backend)
    with pytest.raises(ValueError, match=r"num_local_experts must be an int in \[1, 1048576\] .*got 1048577"):
        functional.build_schedule(torch.zeros(1, 2, dtype=torch.int64), 2**20 + 1, backend=backend)


def test_implicit_workspace_never_rounds_past_libmok_limits():
    """An implicit workspace rounds the most tokens on a rank up to a power of two, except where that would pass
    libmok's routed-rows limit (which the tokens themselves meet): there it stops at the limit."""
    shape = mok.validate.LayerShape(64, 1024, 4, 48, 0, False, None, 256)
    tokens = 1_500_000  # x 1024 routes: 1.54e9 rows, under 2^31 - 1; its power of two, 2^21, would be 2^31
    got = functional._workspace_tokens(tokens, 1, shape, 256)
    assert tokens <= got < 2**21 and got * 1024 + 4 * 256 <= mok.validate.MAX_ROWS
    assert functional._workspace_tokens(1000, 2, shape, 256) == 1024  # far from the limit: the power of two
    assert functional._workspace_tokens(2**24, 1, shape._replace(topk=1), 256) == 2**24


@pytest.mark.parametrize("backend", BACKENDS)
def test_recompute_checks_y_slots(seed, backend):
    args = good()
    _, ctx = functional.forward(*args.values(), backend=backend)
    for bad, error, rule in [(ctx.y_slots.float(), TypeError, "y_slots must be bfloat16, got float32"),
                             (ctx.y_slots[:, :1].contiguous(), ValueError,
                              r"y_slots must be the forward's \[T, K, H\] = \(12, 2, 64\), got \(12, 1, 64\)"),
                             (expanded(ctx.y_slots), ValueError, "y_slots must be contiguous .*stride 0")]:
        with pytest.raises(error, match=rule):
            functional.recompute_forward_context(*args.values(), backend=backend, y_slots=bad)


@pytest.mark.parametrize("entry", ["moe", "functional"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("limit", [1e-50, 1e39])
def test_swiglu_limit_must_be_a_normal_float32(seed, entry, backend, limit):
    """libmok takes the clamp as a C float, where 1e-50 becomes 0 ("no clamp") while "reference" would clamp."""
    call = mok.layer.moe if entry == "moe" else functional.forward
    rule = fr"swiglu_limit must be None or a normal float32 > 0 .*got {re.escape(str(limit))}"
    with pytest.raises(ValueError, match=rule):
        call(*good().values(), backend=backend, swiglu_limit=limit)
