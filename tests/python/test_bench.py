"""python -m mok.bench: the "tiny" preset, run as the user runs it, prints and writes every figure; the composed
baseline it times computes the layer. Never asserts a speed (the machine is shared)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

from dist_utils import ep_group, run_group

from mok import bench, functional

FIGURES = ("median_ms", "min_ms", "max_ms", "gflops", "x_reference", "x_matmul")


def test_tiny_preset_prints_and_writes_every_figure(tmp_path):
    path = tmp_path / "bench.json"
    # As a command (python -m), so the module's __main__ path runs as a user's does, not only main().
    proc = subprocess.run([sys.executable, "-m", "mok.bench", "--preset", "tiny", "--iters", "2", "--warmup", "1",
                           "--world", "1", "--world", "2", "--json", str(path)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    printed = proc.stdout
    result = json.loads(path.read_text())
    assert [run["world"] for run in result["runs"]] == [1, 2]
    assert result["machine"]["libmok"] and result["machine"]["functional_backends"]
    for facts in ("CPU:", "libmok", "torch", "host executor workers"):
        assert facts in printed
    for run in result["runs"]:
        assert [(line["pass"], line["case"]) for line in run["lines"]] == \
            [(p, c) for p in ("forward", "backward") for c in bench.CASES]
        for line in run["lines"]:
            for name in FIGURES:
                assert math.isfinite(line[name]) and line[name] > 0, (run["world"], line)
            assert line["min_ms"] <= line["median_ms"] <= line["max_ms"]
            if line["case"] == "reference":
                assert line["x_reference"] == 1.0
            # The printed table has the same line, its figures rounded to 2 decimals.
            assert f"{line['pass']:<9}{line['case']:<13}{line['median_ms']:>10.2f}" in printed


def test_formula_counts_three_gemms_per_route_and_the_shared_expert():
    problem = bench.Problem(tokens=10, hidden=3, intermediate=5, experts=4, topk=2, shared=7)
    assert bench.flops(problem) == (6 * 10 * 2 * 3 * 5 + 6 * 10 * 3 * 7, 2 * (6 * 10 * 2 * 3 * 5 + 6 * 10 * 3 * 7))


def _composed_against_reference(rank, world, problem, seed):
    x, ids, weights, routed, shared, dout, _ = bench.rank_share(problem, world, rank, seed)
    want, ctx = functional.forward(x, ids, weights, routed, shared, backend="reference", group=ep_group())
    grads = functional.backward(ctx, dout)
    leaves = [t.clone().requires_grad_(True) for t in (x, weights, routed.gate, routed.up, routed.down)]
    shared_leaves = [w.clone().requires_grad_(True) for w in (shared.gate, shared.up, shared.down)]
    out = bench.composed_forward(*leaves, ids, shared_leaves, world)
    out.backward(dout)
    pairs = {"out": (out, want), "x": (leaves[0].grad, grads.x), "topk_weights": (leaves[1].grad, grads.topk_weights),
             "gate": (leaves[2].grad, grads.gate), "up": (leaves[3].grad, grads.up),
             "down": (leaves[4].grad, grads.down), "shared_down": (shared_leaves[2].grad, grads.shared_down)}
    return {name: float((got.double() - ref.double()).norm() / ref.double().norm())
            for name, (got, ref) in pairs.items()}


def test_composed_baseline_computes_the_layer(seed):
    # The baseline must do the layer's work, or its time says nothing: its output and gradients match the
    # reference executor's. 2e-2: both store g, u, h, y in bf16 but round in different places (a few 1e-3).
    problem = bench.Problem(tokens=48, hidden=64, intermediate=32, experts=4, topk=2, shared=32)
    for world in (1, 2):
        for rank, errors in enumerate(run_group(world, _composed_against_reference, problem, seed)):
            assert max(errors.values()) < 2e-2, (world, rank, seed, errors)
