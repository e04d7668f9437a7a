"""libmok.so as built and installed: device code, exported symbols, layout, static cudart."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from buildutil import ROOT, run


def test_cubins_for_every_target(libmok, cuda_bin):
    listing = run(cuda_bin / "cuobjdump", "--list-elf", libmok).stdout
    archs = set(re.findall(r"\.(sm_\d+a?)\.cubin", listing))
    assert {"sm_90a", "sm_100a", "sm_103a"} <= archs, listing


def resource_usage(libmok, cuda_bin) -> dict[str, dict[str, dict[str, int]]]:
    """{arch: {kernel: {"REG": n, "STACK": n, "SHARED": n, "LOCAL": n, ...}}} from cuobjdump."""
    usage, arch = {}, None
    for line in run(cuda_bin / "cuobjdump", "--dump-resource-usage", libmok).stdout.splitlines():
        if m := re.match(r"arch = (sm_\w+)", line.strip()):
            arch = m.group(1)
        elif m := re.match(r"\s*Function (\S+):", line):
            kernel = m.group(1)
        elif arch and line.strip().startswith("REG:"):
            usage.setdefault(arch, {})[kernel] = {k: int(v) for k, v in re.findall(r"(\w+):(\d+)", line)}
    return usage


def max_world() -> int:
    """core/shape.hpp's kMaxWorld: the size of run_dispatch's per-source cursor array."""
    text = (ROOT / "kernel" / "src" / "core" / "shape.hpp").read_text()
    return int(re.search(r"constexpr int kMaxWorld = (\d+);", text).group(1))


def test_device_kernels_and_their_resources(libmok, cuda_bin):
    usage = resource_usage(libmok, cuda_bin)
    assert {"sm_90a", "sm_100a", "sm_103a"} <= set(usage), usage.keys()
    assert usage["sm_100a"].keys() == usage["sm_103a"].keys(), "both Blackwell targets must carry the same kernels"
    # The fused executor's kernels (cuda/fused_pass.cu) and core/ compiled for the device (cuda/core_device.cu) are
    # built for the Blackwell targets only; the split executor's kernels for every target.
    for kernel in ("fused_pass", "prepare_fused_pass", "run_schedule_workers"):
        assert not any(kernel in k for k in usage["sm_90a"]), f"{kernel} is Blackwell's only"
        assert any(kernel in k for k in usage["sm_100a"]), f"{kernel} is not in the device code"
    for step in (
        "dispatch_window",
        "swiglu_window",
        "swiglu_backward_window",
        "combine_window",
        "shared_rows",
        "gradient_items",
        "dequantise_rows",  # MXFP8's operands for the BF16 GEMMs (core/split_dequantise.hpp)
        "dequantise_weights",
        "add_bias_rows",  # expert biases (core/split_bias.hpp)
        "bias_gradient_columns",
        "home_sums_forward",
        "home_sums_backward",
        "rank_schedule",  # the cuda executor's schedule build, slot copy, barrier and leaving (cuda/layer_steps.cu)
        "copy_slots",
        "group_barrier",
        "leave_group",
    ):
        for arch in ("sm_90a", "sm_100a", "sm_103a"):
            assert any(step in k for k in usage[arch]), f"{arch}: the split executor's {step} is not in the device code"
    for arch, kernels in usage.items():
        for kernel, r in kernels.items():
            if is_cutlass_gemm(kernel):
                continue  # its own budgets: test_grouped_gemms_for_every_target
            # Budget, not a hardware limit: the protocol and per-row math must leave the registers a fused tile
            # GEMM needs (65536 per SM = 128 per thread for a 512-thread CTA). Raise it deliberately, not silently.
            assert r["REG"] <= 128, f"{arch} {kernel}: {r['REG']} registers"
            assert r["LOCAL"] == 0, f"{arch} {kernel}: {r['LOCAL']} bytes of local memory"
            # The per-thread stack lives in local memory too. The only stacks in the device code are arrays
            # indexed by rank, which cannot be kept in registers: the comm task's int64_t cursor[kMaxWorld]
            # (core/comm_tasks.hpp pull_rows): 8 * 72 = 576 bytes in the split executor's dispatch_window
            # (cuda/split_steps.cu) and in the fused executor's fused_pass (cuda/fused_pass.cu), the same pull_rows in
            # the row jobs its serving threads run (share_rows, never called from thread 0's body, so that the two
            # frames do not add up: called from there, they took the stack to 2048 bytes with spills);
            # the schedule build's Routing, a pointer and a token count per rank (core/pass_worker.hpp
            # run_schedule_worker): 12 * 72 = 864 bytes in run_schedule_workers; and in fused_pass the tile GEMMs'
            # descriptors (core::Gemm, 352 bytes each) that core's tasks build and hand by reference to the
            # CTA's tile op: 1552 bytes in all when measured (16 of them a slot where the kernel saves a
            # convergence barrier register once, around thread 0's branch), within 576 + 1024. Nothing anywhere
            # else. More means register spills or a new per-thread array: raise this deliberately, not silently.
            if "prepare_fused_pass" in kernel:
                budget = 0
            elif "fused_pass" in kernel:
                budget = 8 * max_world() + 1024
            elif "dispatch_window" in kernel:
                budget = 8 * max_world()
            else:
                budget = 12 * max_world() if "run_schedule_workers" in kernel else 0
            assert r["STACK"] <= budget, f"{arch} {kernel}: {r['STACK']} bytes of stack, budget {budget}"


def is_cutlass_gemm(kernel: str) -> bool:
    return "GemmUniversal" in kernel


def sass_functions(binary, cuda_bin, only: tuple[str, ...] = ()) -> dict[str, dict[str, str]]:
    """{arch: {function: its SASS}} from cuobjdump --dump-sass; `only`: those functions (mangled names) alone."""
    env = {**os.environ, "NVDISASM_PATH": str(cuda_bin)}
    functions, arch = {}, None
    selected = [arg for name in only for arg in ("--function", name)]
    dump = run(cuda_bin / "cuobjdump", "--dump-sass", *selected, binary, env=env).stdout
    for part in re.split(r"\n(?=\s*(?:arch = sm_\w+|\s*Function : ))", dump):
        if m := re.match(r"\s*arch = (sm_\w+)", part):
            arch = m.group(1)
        elif arch and (m := re.match(r"\s*Function : (\S+)", part)):
            functions.setdefault(arch, {})[m.group(1)] = part
    return functions


def cubin_strings(binary, cuda_bin, tmp_path) -> str:
    """The printable strings of every cubin in the binary, extracted by cuobjdump (a fatbin may be compressed)."""
    out = tmp_path / "cubins"
    out.mkdir()
    run(cuda_bin / "cuobjdump", "--extract-elf", "all", binary, cwd=out)
    cubins = sorted(out.glob("*.cubin"))
    assert cubins, f"no cubins in {binary}"
    return "\n".join(run("strings", c).stdout for c in cubins)


# The grouped GEMMs: one CUTLASS instantiation per unit kernel/src/cuda/grouped_gemm_FAMILY*_ARCH.cu (bf16_sm100 over
# grouped_gemm_sm100.cuh, mxfp8_sm100 over grouped_gemm_mxfp8_sm100.cuh, bf16_sm90 over grouped_gemm_sm90.cuh), each
# writing one resource note into the binary and compiled for its architecture's targets only. A new unit of a known
# family is checked with no change here.
GEMM_UNITS = sorted((ROOT / "kernel" / "src" / "cuda").glob("grouped_gemm_*_sm*.cu"))
GEMM_NOTE = r"mok_gemm_(bf16|mxfp8)_(sm100|sm90) (\w+) shared=(\d+) threads=(\d+)"
# Which units a cubin of each target carries.
GEMM_ARCH = {"sm_100a": "sm100", "sm_103a": "sm100", "sm_90a": "sm90"}
# What each family's GEMM SASS must hold. UTMALDG: TMA loads of A and B (2CTA: each CTA of the pair loads its half).
# bf16 on sm100: UTCHMMA.2CTA, the tcgen05 BF16 MMA over the CTA pair. mxfp8 on sm100: UTCQMMA.2CTA, the block-scaled
# MXF8F6F4 MMA over the pair, and UTCCP.T.S.2CTA, the copy of the scale factors from shared to tensor memory that it
# reads them from. bf16 on sm90: HGMMA ... F32.BF16, the warpgroup MMA of bf16 operands into fp32.
GEMM_SASS = {
    ("bf16", "sm100"): (r"UTCHMMA\S*\.2CTA", r"UTMALDG"),
    ("mxfp8", "sm100"): (r"UTCQMMA\S*\.2CTA", r"UTCCP\S*\.2CTA", r"UTMALDG"),
    ("bf16", "sm90"): (r"HGMMA\.\S*\.F32\.BF16", r"UTMALDG"),
}
# Registers: a CTA launches only if registers x threads fit the SM's 65536. On sm100 the budget is the 128 CUTLASS 4.2
# gives these configurations (76 to 80 today). On sm90 the warp-specialized kernel launches its 384 threads with the
# most that fit, 65536 / 384 rounded down to 8: 168, and moves them between warpgroups as it runs (setmaxnreg). More
# means another configuration or a new CUTLASS, which is to be looked at (spills, occupancy) and then raised
# deliberately.
REGISTER_FILE = 65536
GEMM_REGISTERS = {"sm100": 128, "sm90": 168}
# Shared memory: an SM90 or SM100 CTA may ask for 227 KB (232448 bytes, the opt-in maximum; CUTLASS's stage count
# fills up to it), and the SM holds 228 KB: those 227 KB beside the 1 KB the system reserves per CTA. cuobjdump's
# SHARED counts that reserved KB (.nv.reservedSmem: a kernel with no __shared__ of its own shows 1024) plus any static
# shared memory; the dynamic part is not in the cubin, so each unit writes it into the binary (its resource note).
SHARED_BYTES = 227 * 1024
SM_SHARED_BYTES = 228 * 1024


def gemm_notes(binary) -> dict[tuple[str, str], tuple[str, int, int]]:
    """{(arch, instantiation): (family, dynamic shared bytes, threads)} from the units' resource notes in the binary."""
    notes = re.findall(GEMM_NOTE, run("strings", binary).stdout)
    keys = [(arch, name) for _, arch, name, _, _ in notes]
    assert len(set(keys)) == len(keys), f"two units write the same note name: {sorted(keys)}"
    return {(arch, name): (family, int(shared), int(threads)) for family, arch, name, shared, threads in notes}


def unit_family(unit) -> tuple[str, str]:
    """(family, arch) of a unit by its file name: grouped_gemm_bf16_dgrad_sm90.cu is ("bf16", "sm90")."""
    m = re.match(r"grouped_gemm_([a-z0-9]+?)(?:_.*)?_(sm\d+)$", unit.stem)
    return m.group(1), m.group(2)


def kernel_family(kernel: str) -> str:
    """The family of a CUTLASS kernel by its mangled name: the block-scaled mainloop is the MXFP8 one."""
    return "mxfp8" if "BlockScaled" in kernel else "bf16"


def count_families(families) -> dict:
    counts = {}
    for f in families:
        counts[f] = counts.get(f, 0) + 1
    return counts


def check_grouped_gemm(binary, cuda_bin, tmp_path, archs=("sm_90a", "sm_100a", "sm_103a")) -> None:
    """Every grouped GEMM in `binary` (one instantiation per unit in the tree) for each of `archs`: present, one per
    unit of its family and architecture, and none of another architecture's, the family's SASS, within its budgets."""
    units = count_families(unit_family(u) for u in GEMM_UNITS)
    assert set(units) <= set(GEMM_SASS), f"a unit family with no SASS expectation: {units}"
    notes = gemm_notes(binary)
    noted = count_families((f, arch) for (arch, _), (f, _, _) in notes.items())
    assert noted == units, f"resource notes {sorted(notes)} by family {noted}, GEMM units by family {units}"
    for name, (_, dynamic, _) in notes.items():
        assert dynamic <= SHARED_BYTES, f"{name}: {dynamic} bytes of dynamic shared memory, above {SHARED_BYTES}"
    sass = sass_functions(binary, cuda_bin)
    usage = resource_usage(binary, cuda_bin)
    for arch in archs:
        gemm_arch = GEMM_ARCH[arch]
        # cuobjdump names kernels, the notes name units: each kernel is held to its architecture's largest note.
        mine = [v for (a, _), v in notes.items() if a == gemm_arch]
        dynamic, threads = max(d for _, d, _ in mine), max(t for _, _, t in mine)
        gemms = [f for f in sass.get(arch, {}) if is_cutlass_gemm(f)]
        found = count_families((kernel_family(g), gemm_arch) for g in gemms)
        wanted = {k: n for k, n in units.items() if k[1] == gemm_arch}
        assert found == wanted, f"{arch}: grouped GEMM kernels by family {found}, one per unit ({wanted}) wanted"
        for gemm in gemms:
            for instruction in GEMM_SASS[(kernel_family(gemm), gemm_arch)]:
                assert re.search(instruction, sass[arch][gemm]), f"{arch} {gemm}: {instruction} missing from its SASS"
            r = usage[arch][gemm]
            # No spills, no per-thread arrays: CUTLASS keeps everything in registers, tensor and shared memory.
            assert r["LOCAL"] == 0 and r["STACK"] == 0, f"{arch} {gemm}: LOCAL {r['LOCAL']}, STACK {r['STACK']}"
            assert r["SHARED"] + dynamic <= SM_SHARED_BYTES, \
                f"{arch} {gemm}: {r['SHARED']} + {dynamic} bytes of shared memory, above {SM_SHARED_BYTES}"
            budget = GEMM_REGISTERS[gemm_arch]
            assert r["REG"] <= budget, f"{arch} {gemm}: {r['REG']} registers, budget {budget}"
            assert r["REG"] * threads <= REGISTER_FILE, f"{arch} {gemm}: {r['REG']} x {threads} threads do not launch"
    # A CuTe SM100 atom built for a target without the `a` feature compiles into a printf stub, silently.
    assert "Attempting to use" not in cubin_strings(binary, cuda_bin, tmp_path), "a CuTe feature-gate stub is built in"


def test_grouped_gemms_for_every_target(libmok, cuda_bin, tmp_path):
    # The glob finds the units docs/gpu.md names (a renamed unit must not drop out of the check silently).
    names = {u.name for u in GEMM_UNITS}
    for arch in ("sm100", "sm90"):
        units = {f"grouped_gemm_bf16{k}_{arch}.cu" for k in ("", "_forward_f32", "_dgrad", "_dgrad_partial", "_wgrad")}
        assert units <= names, names
    assert "grouped_gemm_mxfp8_sm100.cu" in names, names
    check_grouped_gemm(libmok, cuda_bin, tmp_path)


def test_protocol_uses_system_scope_release_acquire(libmok, cuda_bin):
    """Peers' flags live in NVLink peer memory: core/'s cuda::atomic_ref<.., thread_scope_system> must become
    system-scope strong loads/stores and fences in the SASS, or remote ranks may never see them."""
    env = {**os.environ, "NVDISASM_PATH": str(cuda_bin)}
    sass = run(cuda_bin / "cuobjdump", "--dump-sass", libmok, env=env).stdout
    barrier = re.search(r"Function : \S*group_barrier\S*\n(.*?)(?=\n\s*Function :|\Z)", sass, re.S)
    assert barrier, "the group barrier kernel is missing from the SASS"
    for instruction in (r"ST\.E(\.64)?\.STRONG\.SYS", r"LD\.E(\.64)?\.STRONG\.SYS", r"MEMBAR\.ALL\.SYS"):
        assert re.search(instruction, barrier.group(1)), f"{instruction} missing from group_barrier's SASS"


def test_error_record_is_published_at_system_scope(libmok, cuda_bin):
    """A device pass's error record lives in host-mapped memory (kernel/src/cuda/mapped_record.hpp), read by the host
    while the kernel runs: core's record_failure must publish it with a system-scope fence and store (the self-test's
    record probe runs it), or the host may never see the failure."""
    env = {**os.environ, "NVDISASM_PATH": str(cuda_bin)}
    sass = run(cuda_bin / "cuobjdump", "--dump-sass", libmok, env=env).stdout
    probe = re.search(r"Function : \S*record_probe\S*\n(.*?)(?=\n\s*Function :|\Z)", sass, re.S)
    assert probe, "the self-test's record probe kernel is missing from the SASS"
    for instruction in (r"MEMBAR\.ALL\.SYS", r"ST\.E\.STRONG\.SYS"):
        assert re.search(instruction, probe.group(1)), f"{instruction} missing from record_probe's SASS"


def fused_pass_sass(libmok, cuda_bin) -> dict[str, str]:
    """{arch: SASS} of the fused executor's pass kernel (kernel/src/cuda/fused_pass.cu), with the device functions it
    calls, on each Blackwell target; none on sm_90a."""
    usage = resource_usage(libmok, cuda_bin)
    assert not any(re.search(r"\dfused_pass", k) for k in usage["sm_90a"]), "the fused pass is Blackwell's only"
    names = {k for arch in ("sm_100a", "sm_103a") for k in usage[arch] if re.search(r"\dfused_pass", k)}
    assert len(names) == 1, names
    sass = sass_functions(libmok, cuda_bin, tuple(names))
    for arch in ("sm_100a", "sm_103a"):
        assert len(sass.get(arch, {})) == 1, f"{arch}: {len(sass.get(arch, {}))} fused pass kernels"
    return {arch: next(iter(sass[arch].values())) for arch in ("sm_100a", "sm_103a")}


def pieces_in_flight() -> int:
    """The 16-byte pieces a row move's part reads before it writes any (core/tile.hpp kPiecesInFlight)."""
    text = (ROOT / "kernel" / "src" / "core" / "tile.hpp").read_text()
    return int(re.search(r"constexpr int kPiecesInFlight = (\d+);", text).group(1))


def test_fused_pass_keeps_a_row_moves_reads_in_flight(libmok, cuda_bin):
    """Dispatch's pulls of a peer's row and combine's pushes (core::move_part, run by the row jobs' threads) read
    kPiecesInFlight 16-byte pieces before they write any: that many 128-bit loads (global or generic: a peer's row is
    read through a generic pointer) with no store of any kind between, then that many 128-bit stores with no load
    between. A read and then its write, piece after piece, leaves no such run."""
    want = pieces_in_flight()
    assert want > 1
    load = re.compile(r"^(@!?U?P\w+\s+)?LDG?\.E\S*\.128\b")
    store = re.compile(r"^(@!?U?P\w+\s+)?STG?\.E\S*\.128\b")
    any_load = re.compile(r"^(@!?U?P\w+\s+)?(LD|LDG|LDS|LDL|LDSM)\b")
    any_store = re.compile(r"^(@!?U?P\w+\s+)?(ST|STG|STS|STL|ATOM\w*|RED\w*)\b")
    for arch, sass in fused_pass_sass(libmok, cuda_bin).items():
        instructions = [i.strip() for i in re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", sass)]
        longest, loads, stores = 0, 0, 0  # 128-bit loads in the current run; then its 128-bit stores
        for instruction in instructions:
            if any_store.match(instruction):
                stores = stores + 1 if loads >= want and store.match(instruction) else 0
                if stores == 0:
                    loads = 0
                longest = max(longest, min(loads, stores))
            elif any_load.match(instruction):
                if stores:  # the run's stores are over
                    loads, stores = 0, 0
                loads = loads + 1 if load.match(instruction) else 0
        assert longest >= want, f"{arch}: no {want} 128-bit loads, then {want} 128-bit stores, with nothing between"


# The SASS of row_copies' steps: wait_group.read and wait_group 0 (DEPBAR.LE SB0, 0x0; the latter then invalidates L1,
# CCTL.IVALL), a load's bytes expected on the slot's barrier (an arrive of no thread with a transaction count), the
# load into the slot, the batch's arrival on the barrier and its poll, the store out of the slot, the global proxy
# fence.
BULK_WAIT, BULK_WRITTEN = r"DEPBAR\.LE SB0, 0x0$", r"CCTL\.IVALL$"
BULK_EXPECT, BULK_ARRIVE = r"SYNCS\.ARRIVE\.TRANS64\.RED\.A0TR\b", r"SYNCS\.ARRIVE\.TRANS64\.A1T0\b"
BULK_POLL = r"SYNCS\.PHASECHK\.TRANS64\.TRYWAIT"
BULK_LOAD, BULK_STORE = r"UBLKCP\.S\.G", r"UBLKCP\.G\.S"
GLOBAL_PROXY_FENCE = r"FENCE\.VIEW\.ASYNC\.G$"


def bulk_copy_faults(sass: str) -> tuple[int, list[str]]:
    """The bulk copies of rows in `sass` (core::bulk_copy on row_copies' slots, a batch at a time) and what breaks
    their order: each load into a slot (UBLKCP.S.G) has, since the copy before it, the wait for the slot's stores to
    read it and its bytes expected on the slot's barrier; each store out of the slot (UBLKCP.G.S) has, since the load
    before it, the batch's arrival on the barrier and then its poll; a global proxy fence comes before the first copy,
    and after the last, a store (the job's end flushes the last batch), the wait for the stores to be written, then
    the fence."""
    code = [i.strip() for i in re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", sass)]
    copies = [n for n, i in enumerate(code) if re.match(r"UBLKCP", i)]
    loads = [n for n in copies if re.match(BULK_LOAD, code[n])]

    def since(n: int, kind: str) -> list[str]:  # the code between the last copy of `kind` before n, and n
        earlier = [c for c in copies if c < n and re.match(kind, code[c])]
        return code[earlier[-1] + 1 if earlier else 0:n]

    faults = []
    for n in loads:
        before = since(n, r"UBLKCP")
        if not any(re.match(BULK_WAIT, i) for i in before):
            faults.append(f"load {n}: no wait for the slot's stores to read it")
        if not any(re.search(BULK_EXPECT, i) for i in before):
            faults.append(f"load {n}: its bytes not expected on the slot's barrier")
    for n in copies:
        if re.match(BULK_STORE, code[n]):
            before = since(n, BULK_LOAD)
            arrive = [k for k, i in enumerate(before) if re.search(BULK_ARRIVE, i)]
            if not arrive or not any(re.match(BULK_POLL, i) for i in before[arrive[0]:]):
                faults.append(f"store {n}: its batch not arrived on the slot's barrier and polled before it")
    if copies:
        start = max([k + 1 for k in range(copies[0]) if code[k].startswith("RET")], default=0)  # the copies' function
        if not any(re.match(GLOBAL_PROXY_FENCE, i) for i in code[start:copies[0]]):
            faults.append("no global proxy fence before the first copy")
        written = [n for n in range(copies[-1] + 1, len(code) - 2)
                   if re.match(BULK_WAIT, code[n]) and re.match(BULK_WRITTEN, code[n + 1])
                   and re.match(GLOBAL_PROXY_FENCE, code[n + 2])]
        if not written:
            faults.append("after the last copy, no wait for the stores to be written and then a global proxy fence")
        elif not re.match(BULK_STORE, code[copies[-1]]):
            faults.append("the job's end stores no last batch before its wait (its flush)")
    return len(loads), faults


def test_fused_pass_copies_unchanged_rows_in_bulk(libmok, cuda_bin):
    """The rows a row job copies unchanged (dispatch's unscaled pulls, combine's pushes: core::RowMoves) go through
    row_copies' slots of shared memory as TMA bulk copies a batch at a time (core::bulk_copy), each load into a slot
    after the slot's earlier stores have read it (else it overwrites what they have yet to store) and with its bytes
    expected on the slot's barrier, each store after its batch's arrival on that barrier and its poll (else the store
    writes the slot's old bytes); with the global proxy fence between the counters' acquire and the copies, and after
    the job's stores are written (else thread 0's release does not publish them)."""
    for arch, sass in fused_pass_sass(libmok, cuda_bin).items():
        loads, faults = bulk_copy_faults(sass)
        assert loads > 0 and not faults, f"{arch}: {loads} bulk loads; {faults[:3]}"


# The SASS of the panels' TMA loads (tensor_tile.cuh's write_maps and load_boxes): a map's fields written into its
# words in global memory (STG), the tensor-map proxy's release (MEMBAR.ALL.GPU), then each map's acquire (its
# descriptor's cache line invalidated, UTMACCTL.IV); the stage barrier's arrival with the loads' bytes
# (SYNCS.ARRIVE.TRANS64 with a transaction count), then the 2-D tensor loads (UTMALDG.2D).
TMA_LOAD, TMA_EXPECT = r"UTMALDG\.2D", r"SYNCS\.ARRIVE\.TRANS64 RZ, \["
MAP_ACQUIRE, MAP_RELEASE, MAP_WRITE = r"UTMACCTL\.IV", r"MEMBAR\.ALL\.GPU$", r"STG\b"


def tma_load_faults(sass: str) -> tuple[int, list[str]]:
    """The TMA loads of panels in `sass` and what breaks their order: each load has, earlier in its function, its bytes
    expected on the stage's barrier with the issuer's arrival; the maps' function has the global proxy fence before
    its acquires (the operands' rows, written by the generic proxy, before the loads read them); each map's acquire
    has, earlier in its function, the release, and no write of a map between the two."""
    code = [i.strip() for i in re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", sass)]

    def in_function(n: int) -> list[str]:  # the code of n's function before n (a non-inlined one ends in a RET)
        ends = [k for k in range(n) if code[k].startswith("RET")]
        return code[ends[-1] + 1 if ends else 0:n]

    loads = [n for n, i in enumerate(code) if re.search(TMA_LOAD, i)]
    acquires = [n for n, i in enumerate(code) if re.match(MAP_ACQUIRE, i)]
    faults = []
    for n in loads:
        if not any(re.match(TMA_EXPECT, i) for i in in_function(n)):
            faults.append(f"load {n}: its bytes not expected on the stage's barrier before it")
    if loads and not acquires:
        faults.append("no map acquired by the tensor-map proxy")
    if acquires and not any(re.match(GLOBAL_PROXY_FENCE, i) for i in in_function(acquires[0])):
        faults.append("no global proxy fence before the maps are acquired")
    for n in acquires:
        before = in_function(n)
        released = [k for k, i in enumerate(before) if re.match(MAP_RELEASE, i)]
        if not released or any(re.match(MAP_WRITE, i) for i in before[released[-1]:]):
            faults.append(f"acquire {n}: no tensor-map release after the maps' last write")
    return len(loads), faults


def test_fused_pass_loads_panels_by_tma(libmok, cuda_bin):
    """The panels of a bf16 operand that a tensor map takes (core/panel_boxes.hpp) are TMA's 2-D tensor loads, issued
    after their bytes are expected on the stage's barrier (else the barrier's phase completes before they land, and
    the MMAs read what is not yet there), after the global proxy fence (else they may read rows another CTA wrote
    before the counter thread 0 acquired), from maps whose fields the issuer wrote and then released and acquired for
    the tensor-map proxy (else the loads may read a map's old fields: the tile before's operands)."""
    for arch, sass in fused_pass_sass(libmok, cuda_bin).items():
        loads, faults = tma_load_faults(sass)
        assert loads > 0 and not faults, f"{arch}: {loads} TMA loads; {faults[:3]}"


def test_fused_pass_shares_its_tiles_through_a_named_barrier(libmok, cuda_bin):
    """Thread 0 of a fused pass's CTA runs core's body and enters the CTA's barrier from inside it while the other
    threads wait in their serving loop, so the barrier must be the non-aligned named one (barrier.sync 1: BAR.SYNC on
    barrier 1) and never __syncthreads' barrier 0, whose aligned form threads at different places may not share."""
    for arch, sass in fused_pass_sass(libmok, cuda_bin).items():
        assert re.search(r"BAR\.SYNC\S* 0x1\b", sass), f"{arch}: no BAR.SYNC on barrier 1 in the fused pass"
        assert not re.search(r"BAR\.SYNC\S* 0x0\b", sass), f"{arch}: barrier 0 (__syncthreads) in the fused pass"


# What the fused pass's tensor-core tile (kernel/src/cuda/tensor_tile.cuh) must hold: UTCATOMSWS.FIND_AND_SET and
# UTCATOMSWS.AND, tensor memory's allocation and release (tcgen05.alloc, dealloc); LDGSTS, a panel piece's
# asynchronous 16-byte copy (cp.async.cg), and LDGDEPBAR with DEPBAR.LE SB0, 0x1 and 0x0, the waits for a thread's
# copies but the last block's group (the next block's still in flight) and for all of them;
# FENCE.VIEW.ASYNC.S, the proxy fence between the threads' writes into the panels and the MMA's reads of them; UTCHMMA,
# the 1-CTA tcgen05 BF16 MMA (no .2CTA: the tile is one CTA's); UTCBAR, its commit to the shared-memory barrier that
# SYNCS...TRYWAIT polls; LDTM, the accumulator's load from tensor memory; BAR.RED.OR on barrier 1, the CTA's vote
# after each fill of a stage (a wait for the MMAs that ran out stops every thread alike). A scaled block's (MXFP8,
# core/scaled_block.hpp): UTCCP.T.S.4x32dp128bit, its scales' copy from shared to tensor memory (tcgen05.cp
# 32x128b.warpx4), and UTCQMMA, the block-scaled MMA (kind::mxf8f6f4.block_scale) reading them from tensor memory.
FUSED_TENSOR_SASS = (r"UTCATOMSWS\.FIND_AND_SET", r"UTCATOMSWS\.AND", r"LDGSTS\.E\.BYPASS\S*\.128", r"LDGDEPBAR",
                     r"DEPBAR\.LE SB0, 0x1", r"DEPBAR\.LE SB0, 0x0", r"FENCE\.VIEW\.ASYNC\.S", r"UTCHMMA", r"UTCBAR",
                     r"SYNCS\.PHASECHK\S*TRYWAIT",
                     r"LDTM", r"BAR\.RED\.OR\S* 0x1\b",
                     r"UTCCP\.T\.S\.4x32dp128bit",
                     r"UTCQMMA gdesc\[UR\d+\], gdesc\[UR\d+\], tmem\[UR\d+\], tmem\[UR\d+\], idesc\[UR\d+\], "
                     r"tmem\[UR\d+\]")


def umma_instruction_descriptor(a_mn_major: bool, b_mn_major: bool, m: int = 128, n: int = 128) -> int:
    """The tcgen05.mma instruction descriptor of a BF16 x BF16 -> FP32 MMA of M x N (PTX ISA, "Instruction descriptor"
    for .kind::f16): D's format F32 (1) at bit 4, A's and B's BF16 (1) at bits 7 and 10, A's and B's major at bits 15
    and 16 (1: MN-major), N / 8 at bit 17, M / 16 at bit 24."""
    return 1 << 4 | 1 << 7 | 1 << 10 | a_mn_major << 15 | b_mn_major << 16 | (n >> 3) << 17 | (m >> 4) << 24


FUSED_NOTE = r"mok_fused pass shared=(\d+) threads=(\d+)"
FUSED_SCALED_NOTE = r"mok_fused_scaled pass shared=(\d+) threads=(\d+)"
SM_TENSOR_COLUMNS = 512


def fused_dynamic_shared(libmok, note: str = FUSED_NOTE) -> int:
    """The dynamic shared memory the fused pass asks for (an MXFP8 layer's: FUSED_SCALED_NOTE), from its resource note
    (kernel/src/cuda/resource_note.hpp): cuobjdump does not count it."""
    notes = re.findall(note, run("strings", libmok).stdout)
    assert len(notes) == 1, f"{len(notes)} resource notes of the fused pass"
    dynamic, threads = (int(n) for n in notes[0])
    assert threads == 256 and 0 < dynamic <= SHARED_BYTES, notes[0]
    return dynamic


def fused_tensor_columns(scaled: bool = False) -> int:
    """The tensor-memory columns a fused CTA holds for the whole pass: its accumulators (core/tensor_tile.hpp), or, in
    an MXFP8 layer's pass, whose MMAs take scaled blocks, the SM's all (kernel/src/cuda/tensor_tile.cuh)."""
    if scaled:
        text = (ROOT / "kernel" / "src" / "cuda" / "tensor_tile.cuh").read_text()
        return int(re.search(r"constexpr int kScaledTensorColumns = (\d+);", text).group(1))
    text = (ROOT / "kernel" / "src" / "core" / "tensor_tile.hpp").read_text()
    accumulators = int(re.search(r"constexpr int kAccumulators = (\d+);", text).group(1))
    columns = int(re.search(r"constexpr int kMmaCols = (\d+);", text).group(1))
    return accumulators * columns


def test_fused_pass_runs_its_tiles_on_tensor_cores(libmok, cuda_bin):
    """The fused pass's tiles are tcgen05 MMAs of one CTA, on every Blackwell target (feature-gate stubs are refused
    for all of libmok's cubins by test_grouped_gemms_for_every_target). Every CTA holds its accumulators' tensor-memory
    columns for the whole pass, and an SM has 512: the CTAs that its registers and shared memory let share an SM must
    all hold theirs at once, or a CTA's allocation would wait for columns that the ones before it never give back. An
    MXFP8 layer's pass holds all 512 a CTA (its scales after its accumulators): its launch's shared memory keeps any
    other fused CTA off the SM, a bf16 layer's too (another stream's or rank's pass)."""
    usage = resource_usage(libmok, cuda_bin)
    plain, scaled = fused_dynamic_shared(libmok, FUSED_NOTE), fused_dynamic_shared(libmok, FUSED_SCALED_NOTE)
    for arch in ("sm_100a", "sm_103a"):
        (r,) = [r for k, r in usage[arch].items() if re.search(r"\dfused_pass", k)]
        for dynamic, columns in ((plain, fused_tensor_columns()), (scaled, fused_tensor_columns(True))):
            resident = min(REGISTER_FILE // (r["REG"] * 256), SM_SHARED_BYTES // (r["SHARED"] + dynamic))
            assert resident >= 1 and resident * columns <= SM_TENSOR_COLUMNS, \
                f"{arch}: {resident} fused CTAs an SM ({r['REG']} registers, {r['SHARED']} + {dynamic} bytes of " \
                f"shared memory) hold {resident * columns} tensor-memory columns"
        assert (r["SHARED"] + plain) + (r["SHARED"] + scaled) > SM_SHARED_BYTES, \
            f"{arch}: a bf16 pass's CTA ({plain} bytes) fits beside an MXFP8 one's ({scaled}), which holds 512 columns"
    for arch, sass in fused_pass_sass(libmok, cuda_bin).items():
        for instruction in FUSED_TENSOR_SASS:
            assert re.search(instruction, sass), f"{arch}: {instruction} missing from the fused pass's SASS"
        assert not re.search(r"UTCHMMA\S*\.2CTA", sass), f"{arch}: a 2-CTA MMA in the fused pass's 1-CTA tile"
        # A panel is laid out as its operand is stored, K- or MN-major (core::panel_major), and the MMA reads it so:
        # the four forms' instruction descriptors are immediates of the SASS (the K-major form's alone before).
        for a_mn, b_mn in ((False, False), (False, True), (True, False), (True, True)):
            descriptor = umma_instruction_descriptor(a_mn, b_mn)
            assert re.search(rf"\b0x{descriptor:x}\b", sass), \
                f"{arch}: no MMA of a {'MN' if a_mn else 'K'}-major a and {'MN' if b_mn else 'K'}-major b " \
                f"(instruction descriptor {descriptor:#x}) in the fused pass"


def min_ctas_per_sm() -> int:
    """The CTAs an SM the fused pass's launch bounds promise (kernel/src/cuda/fused_pass.cu)."""
    text = (ROOT / "kernel" / "src" / "cuda" / "fused_pass.cu").read_text()
    return int(re.search(r"constexpr int kMinCtasPerSm = (\d+);", text).group(1))


def test_fused_pass_shared_memory_lets_its_ctas_share_an_sm(libmok, cuda_bin):
    """The fused pass's panels (its stages of a's and b's) are dynamic shared memory, which cuobjdump does not count:
    the kernel writes what it asks for into the binary (kernel/src/cuda/resource_note.hpp). With its static shared
    memory, the CTAs its launch bounds promise an SM must fit the SM's 228 KB, or fewer are resident (fused_residency's
    occupancy query) and the pass has fewer workers than its registers allow."""
    dynamic = fused_dynamic_shared(libmok)
    usage = resource_usage(libmok, cuda_bin)
    ctas = min_ctas_per_sm()
    for arch in ("sm_100a", "sm_103a"):
        (r,) = [r for k, r in usage[arch].items() if re.search(r"\dfused_pass", k)]
        assert ctas * (r["SHARED"] + dynamic) <= SM_SHARED_BYTES, \
            f"{arch}: {ctas} x ({r['SHARED']} + {dynamic}) bytes of shared memory, above {SM_SHARED_BYTES}"


def test_only_mok_symbols_are_exported(libmok):
    out = run("nm", "-D", "--defined-only", libmok).stdout
    names = [line.split()[-1] for line in out.splitlines() if line.strip()]
    assert names, "libmok exports nothing"
    leaked = [n for n in names if not n.startswith("mok")]
    assert not leaked, f"symbols outside the C ABI are exported: {leaked[:20]}"
    assert "mokGetStatusString" in names and "mokGetVersion" in names


def test_soname_and_static_cudart(libmok):
    dynamic = run("readelf", "-d", libmok).stdout
    assert re.search(r"SONAME.*\[libmok\.so\.0\.\d+\]", dynamic), dynamic
    needed = re.findall(r"NEEDED.*\[(.+?)\]", dynamic)
    assert not [n for n in needed if "cudart" in n or n.startswith("libcuda.")], needed


def test_install_layout(prefix):
    for rel in ("bin/mok_selftest", "include/mok/mok.h", "include/mok/mok.hpp", "include/mok/mok_version.h",
                "lib/cmake/mok/mokConfig.cmake", "lib/cmake/mok/mokConfigVersion.cmake",
                "lib/cmake/mok/mokTargets.cmake", "lib/pkgconfig/mok.pc"):
        assert (prefix / rel).exists(), rel


def test_selftest_is_installed_and_says_why_it_cannot_run_here(prefix):
    """mok_selftest (docs/gpu.md, "On your first GPU") is in a CUDA build's bin/, finds the installed libmok through
    its rpath alone, and on a machine without a GPU stops at the probe, naming the CUDA error, with exit code 2."""
    program = prefix / "bin" / "mok_selftest"
    assert program.exists(), f"{program} missing from the install prefix"
    dynamic = run("readelf", "-d", program).stdout
    assert re.search(r"R(UN)?PATH.*\[\$ORIGIN/\.\./lib", dynamic), dynamic
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    proc = subprocess.run([program, "--timeout-ms", "10000"], capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode in (3, 5):
        pytest.skip(f"a GPU is here (tests/gpu checks the stages on it):\n{proc.stdout}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "CUDA architectures: 90a;100a;103a" in lines[0], lines[0]
    assert lines[1].startswith("[1/7] probe: NO GPU (") and re.search(r"\(cudaError\w+\)", lines[1]), lines[1]
    assert lines[-1] == "mok self-test: no usable GPU or driver (exit code 2)", proc.stdout


def test_selftest_runners_print_the_same(prefix):
    """`python -m mok.selftest` and mok_selftest over the same libmok: the same lines (times aside) and exit code."""
    times = re.compile(r"\(\d+\.\d\d s\)")
    outs = []
    seed = ["--seed", "7", "--timeout-ms", "10000"]
    for cmd in ([prefix / "bin" / "mok_selftest", *seed], [sys.executable, "-m", "mok.selftest", *seed]):
        proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300)
        outs.append((proc.returncode, times.sub("(t)", proc.stdout)))
    if outs[0][1].splitlines()[:1] != outs[1][1].splitlines()[:1]:
        pytest.skip("this Python's mok package carries another libmok than the installed one (nox -s tests installs "
                    f"it against MOK_PREFIX): {outs[0][1].splitlines()[:1]} vs {outs[1][1].splitlines()[:1]}")
    assert outs[0] == outs[1], outs
