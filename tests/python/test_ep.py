"""Expert parallelism over gloo: W ranks give bitwise the single-process result (forward and every gradient).

One process group per world size runs every scenario; the parent recomputes each scenario in one process on the
concatenated tokens and compares bit for bit (docs/python.md, "Row order": the canonical order makes the result
independent of how tokens are spread over ranks). Inputs are drawn fresh from a seed chosen per run.

Every CPU backend runs explicitly: "host" (libmok's executor, which lays out rows itself) and "reference" (mok.ep's
all_to_all row order with reference.py's math); the default alone would leave one of them untested. The "wide"
scenarios make row order observable: tokens scaled by 2^[-16, 16] and channels by 2^[-4, 4], router weights of
both signs over 2^+-12, and a third of the tokens routed twice to one expert with weights w and -w (|w| up to
2^20), so weight-gradient sums cancel and MXFP8 token blocks mix magnitudes; rows in another order give other bits.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import pytest
import torch
from dist_utils import ep_group, run_group

import mok.layer
from mok import functional
from mok.experts import RoutedExperts, SharedExpert


def cpu_backends() -> list[str]:
    """Every registered backend that runs on CPU tensors."""
    found = []
    for name in functional.backends():
        try:
            functional.select_backend(name, torch.device("cpu"))
        except ValueError:
            continue
        found.append(name)
    return found


BACKENDS = cpu_backends()

H, INTER, I_SHARED, E_LOCAL = 64, 32, 48, 2
GRAD_NAMES = ("x", "topk_weights", "gate", "up", "down", "shared_gate", "shared_up", "shared_down")


@dataclass(frozen=True)
class Scenario:
    name: str
    seed: int
    topk: int = 3
    routing: str = "random"  # random | one_expert | unrouted_tokens
    mxfp8: bool = False
    shared: bool = True
    swiglu_limit: float | None = None
    wide: bool = False  # the dynamic range and cancelling routes that make row order observable


def scenarios(seed: int) -> list[Scenario]:
    return [
        Scenario("ragged", seed, swiglu_limit=0.75),
        Scenario("mxfp8", seed + 1, mxfp8=True),
        Scenario("one_expert", seed + 2, routing="one_expert"),
        Scenario("unrouted_tokens", seed + 3, routing="unrouted_tokens", shared=False),
        Scenario("k1", seed + 4, topk=1),
        Scenario("k8", seed + 5, topk=8, mxfp8=True, swiglu_limit=1.5),
        Scenario("wide", seed + 6, wide=True),
        Scenario("wide_mxfp8", seed + 7, mxfp8=True, wide=True),
    ]


def token_counts(world: int, seed: int) -> list[int]:
    """Ragged counts in [1, 24]; rank 1 (rank 0 alone) has none; the last rank has more than one shared-expert
    chunk (ep.SHARED_CHUNK = 64 rows)."""
    rng = random.Random(seed)
    counts = [rng.randint(1, 24) for _ in range(world)]
    counts[-1] = rng.randint(65, 90)
    counts[1 % world] = 0
    return counts


def global_inputs(s: Scenario, world: int):
    """Every rank draws the same global problem from the scenario's seed and takes its part."""
    g = torch.Generator().manual_seed(s.seed)
    T, E = sum(token_counts(world, s.seed)), world * E_LOCAL

    def bf16(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)

    x = bf16(T, H)
    ids = torch.randint(0, E, (T, s.topk), generator=g)
    ids = torch.where(torch.rand(T, s.topk, generator=g) < 0.15, -1, ids)  # some single routes unused
    if s.routing == "one_expert":
        ids = torch.full_like(ids, E - 1)  # every other expert gets no rows
    if s.routing == "unrouted_tokens":
        ids[::3] = -1  # tokens with no route at all
    weights = torch.rand(T, s.topk, generator=g)
    dout = bf16(T, H)
    if s.wide:
        x, dout, ids, weights = widened(g, x, dout, ids, weights)
    routed = RoutedExperts(bf16(E, INTER, H, scale=H ** -0.5), bf16(E, INTER, H, scale=H ** -0.5),
                           bf16(E, H, INTER, scale=INTER ** -0.5))
    shared = SharedExpert(bf16(I_SHARED, H, scale=H ** -0.5), bf16(I_SHARED, H, scale=H ** -0.5),
                          bf16(H, I_SHARED, scale=I_SHARED ** -0.5)) if s.shared else None
    return x, ids.to(torch.int32), weights, routed, shared, dout


def widened(g: torch.Generator, x, dout, ids, weights):
    """Per-token and per-channel power-of-two scales (exact in bf16), signed router weights over 2^+-12, and
    cancelling pairs: k = 0 and k = 1 on one expert with weights w and -w."""
    T, K = ids.shape

    def exponents(*shape, low, high):
        return 2.0 ** torch.randint(low, high + 1, shape, generator=g).float()

    x = (x.float() * exponents(T, 1, low=-16, high=16) * exponents(1, H, low=-4, high=4)).to(torch.bfloat16)
    dout = (dout.float() * exponents(T, 1, low=-12, high=12)).to(torch.bfloat16)
    sign = torch.where(torch.rand(T, K, generator=g) < 0.5, -1.0, 1.0)
    weights = sign * (weights + 0.5) * exponents(T, K, low=-12, high=12)
    pairs = torch.rand(T, generator=g) < 1 / 3
    if K >= 2:
        ids[pairs, 0] = ids[pairs, 0].clamp(min=0)
        ids[pairs, 1] = ids[pairs, 0]
        big = (torch.rand(T, generator=g) + 0.5) * exponents(T, low=8, high=20)
        weights[pairs, 0], weights[pairs, 1] = big[pairs], -big[pairs]
    return x, dout, ids, weights


def run_layer(s: Scenario, x, ids, weights, routed, shared, dout, group=None, *, backend: str):
    """mok.moe forward + autograd backward; returns (out, {gradient name: tensor})."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, weights, routed.gate, routed.up, routed.down)]
    x, weights, *routed_w = leaves
    routed = RoutedExperts(*routed_w)
    if shared is not None:
        shared = SharedExpert(*(w.detach().clone().requires_grad_(True) for w in (shared.gate, shared.up,
                                                                                   shared.down)))
        leaves += [shared.gate, shared.up, shared.down]
    group = ep_group() if group is None else group
    out = mok.layer.moe(x, ids, weights, routed.to_mxfp8() if s.mxfp8 else routed, shared, group=group,
                        swiglu_limit=s.swiglu_limit, backend=backend)
    out.backward(dout)
    return out.detach(), dict(zip(GRAD_NAMES, (t.grad for t in leaves), strict=False))  # 5 without shared


def local_part(rank: int, world: int, s: Scenario, inputs):
    x, ids, weights, routed, shared, dout = inputs
    counts = token_counts(world, s.seed)
    tokens = slice(sum(counts[:rank]), sum(counts[:rank + 1]))
    experts = slice(rank * E_LOCAL, (rank + 1) * E_LOCAL)
    mine = RoutedExperts(*(w[experts].contiguous() for w in (routed.gate, routed.up, routed.down)))
    return x[tokens], ids[tokens].contiguous(), weights[tokens], mine, shared, dout[tokens]


def ep_worker(rank: int, world: int, seed: int, backend: str):
    """Every scenario on this rank, twice (the two runs must agree bitwise), plus the functional API with
    main_grad buffers and an inference-mode forward followed by a context recompute."""
    results = {}
    for s in scenarios(seed):
        part = local_part(rank, world, s, global_inputs(s, world))
        first, second = run_layer(s, *part, backend=backend), run_layer(s, *part, backend=backend)
        assert_bitwise(first, second, f"rank {rank} {s.name}: run twice")
        results[s.name] = first
    first = scenarios(seed)[0]
    results["functional"] = functional_path(first, *local_part(rank, world, first, global_inputs(first, world)),
                                            backend=backend)
    return results


def functional_path(s: Scenario, x, ids, weights, routed, shared, dout, *, backend: str):
    """Inference forward, then recompute_forward_context and backward into fp32 main_grad buffers."""
    args = (x, ids, weights, routed, shared)
    group = ep_group()
    out, ctx = functional.forward(*args, swiglu_limit=s.swiglu_limit, need_context=False, backend=backend,
                                  group=group)
    assert ctx is None
    ctx = functional.recompute_forward_context(*args, swiglu_limit=s.swiglu_limit, backend=backend, group=group)
    main = functional.MainGrads(*(torch.full(w.shape, 0.5) for w in (routed.gate, routed.up, routed.down,
                                                                      shared.gate, shared.up, shared.down)))
    grads = functional.backward(ctx, dout, main_grads=main)
    assert all(getattr(grads, n) is None for n in GRAD_NAMES[2:])  # added into main_grads instead
    return out, dict(x=grads.x, topk_weights=grads.topk_weights, **{n: getattr(main, n) for n in GRAD_NAMES[2:]})


def assert_bitwise(a, b, what: str):
    out_a, grads_a = a
    out_b, grads_b = b
    if not torch.equal(out_a, out_b):
        pytest.fail(f"{what}: out differs in {int((out_a != out_b).sum())} of {out_a.numel()} elements")
    for name in sorted(set(grads_a) | set(grads_b)):
        ga, gb = grads_a.get(name), grads_b.get(name)
        assert (ga is None) == (gb is None), f"{what}: {name} present in one only"
        if ga is not None and not torch.equal(ga, gb):
            differ = int((ga != gb).sum())
            pytest.fail(f"{what}: gradient {name} differs in {differ} of {ga.numel()} elements")


def single_process_expectation(s: Scenario, world: int, backend: str):
    """Recompute in this process on all tokens. Shared-expert gradients are over each rank's own tokens (like
    any data-parallel weight's): they come from the single-process layer on that rank's tokens."""
    inputs = global_inputs(s, world)
    out, grads = run_layer(s, *inputs, backend=backend)
    counts = token_counts(world, s.seed)
    expected = []
    for rank in range(world):
        tokens = slice(sum(counts[:rank]), sum(counts[:rank + 1]))
        experts = slice(rank * E_LOCAL, (rank + 1) * E_LOCAL)
        mine = {"x": grads["x"][tokens], "topk_weights": grads["topk_weights"][tokens]}
        mine.update({n: grads[n][experts] for n in ("gate", "up", "down")})
        if s.shared:
            x, ids, weights, routed, shared, dout = inputs
            _, alone = run_layer(s, x[tokens], ids[tokens], weights[tokens], routed, shared, dout[tokens],
                                 backend=backend)
            mine.update({n: alone[n] for n in GRAD_NAMES[5:]})
        else:
            mine.update({n: None for n in GRAD_NAMES[5:]})
        expected.append((out[tokens], mine))
    return expected


def test_both_cpu_backends_are_tested():
    assert {"host", "reference"} <= set(BACKENDS), BACKENDS


# The reference path stops at 4 ranks: 8 gloo processes of it take ~45 s on CI's 2 shared cores, and row order
# across sources is observable from 3 (with 2, rank 1 has no tokens: token_counts).
WORLDS = {"host": [1, 2, 3, 4, 8], "reference": [1, 2, 3, 4]}


@pytest.mark.parametrize(("world", "backend"), [(w, b) for b in BACKENDS for w in WORLDS.get(b, [1, 2, 3])])
def test_ep_equals_single_process_bitwise(seed, world, backend):
    results = run_group(world, ep_worker, seed, backend)
    for s in scenarios(seed):
        expected = single_process_expectation(s, world, backend)
        for rank in range(world):
            assert_bitwise(results[rank][s.name], expected[rank],
                           f"backend {backend}, seed {seed}, world {world}, rank {rank}, scenario {s.name}")
    check_functional_path(seed, world, results)


def check_functional_path(seed: int, world: int, results):
    """The functional path agrees with mok.moe: same out, dx, dw; main_grads = 0.5 + fp32 gradient, whose
    bf16 rounding is what mok.moe returned."""
    s = scenarios(seed)[0]
    for rank in range(world):
        out, grads = results[rank]["functional"]
        out_ref, grads_ref = results[rank][s.name]
        assert torch.equal(out, out_ref)
        assert torch.equal(grads["x"], grads_ref["x"])
        assert torch.equal(grads["topk_weights"], grads_ref["topk_weights"])
        for name in GRAD_NAMES[2:]:
            # (0.5 + g) - 0.5 loses g's low bits where |g| << 0.5: compare in bf16 with bf16's tolerance.
            torch.testing.assert_close((grads[name] - 0.5).to(torch.bfloat16), grads_ref[name],
                                       atol=2 ** -9, rtol=2 ** -7)


def test_demo_passes_and_reports(capfd):
    """python -m mok.demo, small: it runs a group, checks against the oracle and says PASS."""
    from mok import demo

    assert demo.main(["--world", "3", "--tokens", "24", "--hidden", "64", "--intermediate", "32", "--steps", "2",
                      "--shared-intermediate", "48"]) == 0
    printed = capfd.readouterr().out
    assert "3 processes" in printed and "result: PASS" in printed and "time per step" in printed


def one_scenario_worker(rank: int, world: int, seed: int, backend: str):
    s = scenarios(seed)[0]
    return run_layer(s, *local_part(rank, world, s, global_inputs(s, world)), backend=backend)


@pytest.mark.skipif("MOK_TEST_EP_WORLD" not in os.environ,
                    reason="a large group (e.g. MOK_TEST_EP_WORLD=72) takes minutes on a small machine; opt-in")
@pytest.mark.parametrize("backend", BACKENDS)
def test_large_world_bitwise(seed, backend):
    world = int(os.environ.get("MOK_TEST_EP_WORLD", "1"))
    results = run_group(world, one_scenario_worker, seed, backend)
    expected = single_process_expectation(scenarios(seed)[0], world, backend)
    for rank in range(world):
        assert_bitwise(results[rank], expected[rank], f"seed {seed}, world {world}, rank {rank}")
