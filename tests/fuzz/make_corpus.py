"""Write the seed corpus of fuzz_layer (tests/fuzz/corpus/seed-*): python tests/fuzz/make_corpus.py.

fuzz_layer.cpp reads its input one decision per byte, in the order this encoder writes them (decode_group, then
decode_ops, then call_quantize); any byte string is a valid input, so a stale seed only explores less. The seeds
are the plain cases the fuzzer mutates from: 1-3 ranks, bf16 and MXFP8, shared expert, clamp, shared memory, one
bad value, one mismatched field, one bad memory argument, each call with each of its faults, quantisation shapes.
Files named regress-* are inputs that once found a defect; this script leaves them alone.
"""

from __future__ import annotations

import random
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus"

FIELDS = ["size", "world", "rank", "experts_per_rank", "hidden", "intermediate", "top_k", "max_tokens",
          "shared_intermediate", "precision", "swiglu_limit", "expert_padding", "minibatch", "macrobatch",
          "comm_workers", "compute_workers", "timeout_ms", "executor", "routing_scale"]
WILD = 25  # entries of Bytes::wild's table; WILD itself means "the next 4 bytes, as an int32"
MEMORY_FAULTS = ["none", "null_base", "misaligned_base", "no_peers", "both_peers", "null_workspace",
                 "misaligned_workspace", "short_workspace", "small_memory", "bad_shm_name"]
KINDS = ["schedule", "forward", "backward", "recompute", "slots", "error", "abort"]


def group(ranks=2, experts=2, hidden=16, inter=8, top_k=2, tokens=6, shared=0, mxfp8=False, limit=0, padding=0,
          mini=1, macro=2, comm=1, compute=2, bad=None, mismatch=None, shm=False, memory=None) -> bytes:
    """The bytes decode_group reads. bad/mismatch: (field, wild index) / (rank, field, wild index or None for +1)."""
    b = [ranks - 1, experts - 1, hidden - 1, inter - 1, top_k - 1, tokens - 1]
    b += [2, shared - 1] if shared else [0]
    b += [2 if mxfp8 else 0, limit]
    if not mxfp8:
        b.append(padding)  # index into {8, 1, 2, 4, 16, 32}
    b += [mini - 1, macro - 1, comm - 1, compute - 1]
    if bad:
        b += [3, FIELDS.index(bad[0]), bad[1]]
        if bad[0] == "swiglu_limit":
            b.append(bad[1] % 8)
    else:
        b.append(0)
    if ranks > 1:
        if mismatch:
            rank, field, wild = mismatch
            b += [2, rank, FIELDS.index(field)] + ([0, 0] if wild is None else [1, wild])
            if field == "swiglu_limit":
                b.append(1)
        else:
            b.append(0)
    b.append(4 if shm else 0)
    b += [3, memory[0], MEMORY_FAULTS.index(memory[1]) - 1] if memory else [0]
    return bytes(b)


def ops(*steps, extra=0) -> bytes:
    """decode_ops' bytes: each step is None (the next step of an iteration) or (kind, victim, fault); extra adds
    that many more iteration steps than the 4 every input makes."""
    steps = list(steps) + [None] * max(0, 4 + extra - len(steps))
    out = [len(steps) - 4]
    rng = random.Random(len(steps))
    for step in steps:
        kind, victim, fault = step if step else (None, None, 0)
        out.append(0 if kind is None else 9 + KINDS.index(kind))
        out += [3, victim] if victim is not None else [0]
        out.append(fault)
        out += [rng.randrange(256) for _ in range(4)]  # seed
        out.append(rng.randrange(2))  # NaN / Inf in the data
        for _ in range(3):
            out += [rng.randrange(8), rng.randrange(2)]  # tokens (from max_tokens down), int64 ids
    return bytes(out)


def quantize(*calls) -> bytes:
    """call_quantize's bytes: each call is (dtype, batch, rows, cols, shape byte); a dim may be ('wild', index)."""
    out = [len(calls)]
    for dtype, *dims, shape in calls:
        out += [0, dtype]
        for d in dims:
            out.append(0 if isinstance(d, tuple) else d - 1)
        for d in dims:
            out += [7, d[1]] if isinstance(d, tuple) else [0]
        out += [shape, 1, 2, 3, 4]
    return bytes(out)


def seeds() -> dict[str, bytes]:
    s = {"empty": b""}
    s["one-rank"] = group(ranks=1) + ops() + quantize()
    s["three-ranks"] = group(ranks=3, experts=3, hidden=24, inter=12, top_k=3) + ops(extra=3) + quantize()
    s["mxfp8"] = group(ranks=2, mxfp8=True, hidden=40, inter=33) + ops(extra=2) + quantize()
    s["shared-clamp"] = group(ranks=2, shared=5, limit=1) + ops(extra=2) + quantize()
    s["padding-1"] = group(ranks=3, padding=1, tokens=8, top_k=1) + ops() + quantize()
    s["shm"] = group(ranks=3, shm=True) + ops() + quantize()
    for field, wild in [("world", 0), ("rank", 8), ("hidden", 1), ("precision", 3), ("precision", 5),
                        ("swiglu_limit", 1), ("expert_padding", 1), ("minibatch", 4), ("macrobatch", 5),
                        ("timeout_ms", 1), ("executor", 2), ("executor", 0), ("size", 0), ("max_tokens", 13),
                        ("routing_scale", 3), ("routing_scale", 0), ("routing_scale", 2)]:
        s[f"bad-{field}-{wild}"] = group(ranks=2, bad=(field, wild)) + ops()
    for field in ["hidden", "top_k", "max_tokens", "precision", "swiglu_limit", "expert_padding", "minibatch",
                  "timeout_ms", "world", "rank", "routing_scale"]:
        s[f"mismatch-{field}"] = group(ranks=3, mismatch=(1, field, None)) + ops()
    for fault in MEMORY_FAULTS[1:]:
        s[f"memory-{fault}"] = group(ranks=2, shm=fault == "bad_shm_name", memory=(1, fault)) + ops()
    faults = {"schedule": 6, "forward": 9, "recompute": 9, "backward": 13, "slots": 2, "error": 3}
    steps = {"schedule": [], "forward": [None], "recompute": [None, None], "backward": [None, None, None],
             "slots": [None, None], "error": [None]}
    for kind, n in faults.items():
        for fault in range(n):
            s[f"{kind}-fault-{fault}"] = group(ranks=2, shared=3 if fault % 2 else 0) + ops(
                *steps[kind], (kind, 1, fault))
    s["abort"] = group(ranks=3) + ops(None, ("abort", 0, 0), None, None)
    s["int64-beyond-int32"] = group(ranks=2, experts=3) + ops(("schedule", 0, 5), None, None)
    s["quantize"] = group(ranks=1) + ops() + quantize((0, 2, 33, 65, 0), (1, 1, 70, 3, 0x40), (0, 1, 1, 1, 5))
    s["quantize-faults"] = group(ranks=1) + ops() + quantize((0, ("wild", 0), 4, 4, 0), (1, 1, 7, 9, 0x10),
                                                              (0, 1, 7, 9, 0x20), (0, 1, ("wild", 23), 2, 1))
    rng = random.Random(8)
    for i in range(8):  # plain random bytes: every string decodes, and these reach mixes the rest do not
        s[f"random-{i}"] = bytes(rng.randrange(256) for _ in range(rng.randrange(16, 160)))
    return s


def main() -> None:
    CORPUS.mkdir(exist_ok=True)
    for old in CORPUS.glob("seed-*"):
        old.unlink()
    for name, data in seeds().items():
        (CORPUS / f"seed-{name}").write_bytes(data)
    print(f"{len(seeds())} seeds in {CORPUS}")


if __name__ == "__main__":
    main()
