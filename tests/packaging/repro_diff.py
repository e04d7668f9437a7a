"""Why two builds differ: diffoscope's report when it is installed, else a per-section diff of ELF files
(and per-member for wheels), which names the sections that differ and the strings only one side has."""

from __future__ import annotations

import hashlib
import re
import shutil
import struct
import subprocess
import zipfile
from pathlib import Path

MAX_REPORT = 20_000  # characters: enough to see the first differences, short enough for a CI log


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def explain(a: Path, b: Path) -> str:
    """A readable account of how `a` and `b` differ (empty when they are equal)."""
    if a.read_bytes() == b.read_bytes():
        return ""
    if shutil.which("diffoscope"):
        # Short blocks: the first lines of each differing section say more than all of the first one.
        cmd = ["diffoscope", "--text", "-", "--max-diff-block-lines", "16", str(a), str(b)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        return proc.stdout[:MAX_REPORT] or proc.stderr[:MAX_REPORT]
    if zipfile.is_zipfile(a) and zipfile.is_zipfile(b):
        return _zip_diff(a, b)[:MAX_REPORT]
    return _elf_diff(a.read_bytes(), b.read_bytes())[:MAX_REPORT]


def _zip_diff(a: Path, b: Path) -> str:
    za, zb = zipfile.ZipFile(a), zipfile.ZipFile(b)
    lines = ["(diffoscope not installed: member-by-member diff)"]
    ia, ib = {i.filename: i for i in za.infolist()}, {i.filename: i for i in zb.infolist()}
    for name in sorted(ia.keys() ^ ib.keys()):
        lines.append(f"only in {'first' if name in ia else 'second'}: {name}")
    for name in sorted(ia.keys() & ib.keys()):
        if ia[name].date_time != ib[name].date_time:
            lines.append(f"{name}: timestamp {ia[name].date_time} vs {ib[name].date_time}")
        da, db = za.read(name), zb.read(name)
        if da != db:
            lines.append(f"{name}: contents differ")
            if da[:4] == b"\x7fELF" and db[:4] == b"\x7fELF":
                lines.append(_elf_diff(da, db))
    return "\n".join(lines)


def _sections(elf: bytes) -> dict[str, bytes]:
    """Section name -> bytes of a little-endian ELF64 file."""
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx]
    names = elf[strtab[4] : strtab[4] + strtab[5]]
    out = {}
    for h in headers:
        name = names[h[0] : names.index(b"\0", h[0])].decode()
        out[name] = b"" if h[1] == 8 else elf[h[4] : h[4] + h[5]]  # SHT_NOBITS has no file bytes
    return out


def _strings(data: bytes) -> set[str]:
    return {s.decode() for s in re.findall(rb"[\x20-\x7e]{6,}", data)}


def _elf_diff(a: bytes, b: bytes) -> str:
    if a[:4] != b"\x7fELF" or b[:4] != b"\x7fELF":
        return f"(not ELF) sizes {len(a)} vs {len(b)}; first differing byte at {_first_diff(a, b)}"
    sa, sb = _sections(a), _sections(b)
    lines = ["(diffoscope not installed: section-by-section diff)"]
    for name in sorted(sa.keys() | sb.keys()):
        xa, xb = sa.get(name), sb.get(name)
        if xa == xb:
            continue
        if xa is None or xb is None:
            lines.append(f"section {name}: only in {'second' if xa is None else 'first'}")
            continue
        lines.append(f"section {name}: {len(xa)} vs {len(xb)} bytes, first difference at {_first_diff(xa, xb)}")
        only_a, only_b = sorted(_strings(xa) - _strings(xb))[:10], sorted(_strings(xb) - _strings(xa))[:10]
        lines += [f"  - {s}" for s in only_a] + [f"  + {s}" for s in only_b]
    return "\n".join(lines)


def _first_diff(a: bytes, b: bytes) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
