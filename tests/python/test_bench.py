"""python -m mok.bench: the "tiny" preset, run as the user runs it, prints and writes every figure; the composed
baseline it times computes the layer. Never asserts a speed (the machine is shared)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys

import pytest
import torch
from dist_utils import ep_group, run_group

from mok import bench, functional

FIGURES = ("median_ms", "min_ms", "max_ms", "gflops", "x_reference", "x_matmul")


def test_tiny_preset_prints_and_writes_every_figure(tmp_path):
    path = tmp_path / "bench.json"
    # As a command (python -m), so the module's __main__ path runs as a user's does, not only main().
    png = tmp_path / "bench.png"
    plots = ["--plot", str(png)] if importlib.util.find_spec("matplotlib") else []  # CI's tests session has it
    proc = subprocess.run([sys.executable, "-m", "mok.bench", "--preset", "tiny", "--iters", "2", "--warmup", "1",
                           "--world", "1", "--world", "2", "--json", str(path), *plots],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    if plots:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
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


def test_cuda_without_a_gpu_says_so_and_times_nothing(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the refusal is for machines without one")
    path = tmp_path / "never.json"
    assert bench.main(["--device", "cuda", "--preset", "mok", "--json", str(path)]) == 2
    printed = capsys.readouterr().out
    assert "mok bench --device cuda: no CUDA device here (torch.cuda.is_available() is False" in printed
    assert "Nothing was timed: no GPU figure is printed without a GPU" in printed
    assert "median" not in printed and not path.exists()


def test_gpu_summary_takes_the_slowest_rank_per_iteration_then_the_median():
    # rank 0 is slow in iteration 0, rank 1 in iterations 1 and 2: per iteration max (3, 5, 7), median 5 ms.
    problem = bench.Problem(tokens=8, hidden=16, intermediate=32, experts=4, topk=2, shared=0)
    ranks = [{name: {"forward": [3e-3, 1e-3, 1e-3], "backward": [6e-3, 2e-3, 2e-3]}
              for name in ("mok:reference", bench.GPU_COMPOSED)} for _ in range(2)]
    for name in ranks[1]:
        ranks[1][name] = {"forward": [1e-3, 5e-3, 7e-3], "backward": [2e-3, 10e-3, 14e-3]}
    ranks[1][bench.GPU_COMPOSED]["forward"] = [1e-3, 10e-3, 14e-3]  # the baseline twice as slow forward
    lines = {(line["pass"], line["case"]): line for line in bench.gpu_summary(ranks, problem)}
    ref = lines["forward", "mok:reference"]
    assert (ref["median_ms"], ref["min_ms"], ref["max_ms"]) == pytest.approx((5.0, 3.0, 7.0))
    assert ref["x_baseline"] == pytest.approx(10 / 5)
    assert lines["backward", "mok:reference"]["median_ms"] == pytest.approx(10.0)
    # MoK's TFLOP/s: 6 (T + T K) H I / t, twice the work backward
    work = 6 * (8 + 8 * 2) * 16 * 32
    assert ref["tflops"] == pytest.approx(work / 5e-3 / 1e12)
    assert lines["backward", "mok:reference"]["tflops"] == pytest.approx(2 * work / 10e-3 / 1e12)


def _grouped_against_reference(rank, world, problem, seed):
    x, ids, weights, routed, shared, dout, _ = bench.rank_share(problem, world, rank, seed)
    want, ctx = functional.forward(x, ids, weights, routed, shared, backend="reference", group=ep_group())
    grads = functional.backward(ctx, dout)
    leaves = [t.clone().requires_grad_(True) for t in (x, weights, routed.gate, routed.up, routed.down)]
    shared_leaves = [w.clone().requires_grad_(True) for w in (shared.gate, shared.up, shared.down)]
    out = bench.grouped_forward(*leaves, ids, shared_leaves, world)
    out.backward(dout)
    pairs = {"out": (out, want), "x": (leaves[0].grad, grads.x), "topk_weights": (leaves[1].grad, grads.topk_weights),
             "gate": (leaves[2].grad, grads.gate), "up": (leaves[3].grad, grads.up),
             "down": (leaves[4].grad, grads.down), "shared_up": (shared_leaves[1].grad, grads.shared_up)}
    return bench.GROUPED_PATH[0], {name: float((a.double() - b.double()).norm() / b.double().norm())
                                   for name, (a, b) in pairs.items()}


def test_grouped_gpu_baseline_computes_the_layer(seed):
    # The GPU baseline (all_to_all + grouped GEMM) run on the CPU, where this torch's _grouped_mm runs too: its
    # output and gradients match the reference executor's (2e-2: bf16 storage rounded in other places, as with the
    # composed baseline).
    problem = bench.Problem(tokens=48, hidden=64, intermediate=32, experts=4, topk=2, shared=32)
    for world in (1, 2):
        for rank, (path, errors) in enumerate(run_group(world, _grouped_against_reference, problem, seed)):
            assert path == "torch._grouped_mm", path  # the grouped GEMM itself, not the fallback
            assert max(errors.values()) < 2e-2, (world, rank, seed, path, errors)
