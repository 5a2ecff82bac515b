"""Compile a CuTe DSL function for a GPU arch without a GPU, then inspect what came out.

Used by CPU tests to pin properties of the generated code: how many instructions of a kind (MUFU.EX2,
WGMMA, FFMA, ...) the PTX and SASS contain, how many registers each kernel uses, and whether anything
spills to local memory.

    from fa4.common.codegen_check import compile_and_inspect
    rep = compile_and_inspect(host_fn, fake_a, fake_b, ptx_ops=["ex2.approx"], sass_ops=["MUFU.EX2"])
    rep.ptx_counts["ex2.approx"], rep.sass_counts["MUFU.EX2"], rep.registers, rep.spills

Sources of truth:
- PTX and the cubin come from the DSL itself (`--keep-ptx --keep-cubin`): the cubin is what would run.
- SASS: nvdisasm on that cubin (PyPI wheel nvidia-cuda-nvdisasm, or a CUDA toolkit).
- Registers and stack frame per kernel: the cubin's .nv.info attributes (EIATTR_REGCOUNT,
  EIATTR_FRAME_SIZE), so no second compiler is involved.
- Spill bytes: `ptxas -v` on the same PTX (the DSL does not report them); that is a separate ptxas
  (the newest found: find_tool), so numbers can differ slightly from the DSL's embedded compiler. The
  SASS local-memory instruction count (LDL/STL) is the check that is tied to the real cubin.

Opcode counting: an op name matches an instruction whose opcode equals it or extends it by
".suffix" ("ex2.approx" matches "ex2.approx.ftz.f32"; "FFMA" matches "FFMA.FTZ" but not "FFMA2").
Counts cover the whole module (all kernels).
"""

from __future__ import annotations

import functools
import glob
import os
import re
import struct
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class KernelResources:
    registers: int | None = None
    frame_bytes: int | None = None  # stack frame (local memory per thread, spills included)
    spill_store_bytes: int | None = None  # from ptxas -v (None when ptxas is not available)
    spill_load_bytes: int | None = None


@dataclass
class CodegenReport:
    ptx: str
    sass: str
    ptx_counts: dict[str, int]
    sass_counts: dict[str, int]
    kernels: dict[str, KernelResources] = field(default_factory=dict)
    ptxas_log: str = ""

    @property
    def sass_opcodes(self) -> Counter:
        return Counter(sass_opcodes(self.sass))

    @property
    def registers(self) -> int | None:
        """Max register count over the kernels of the module."""
        regs = [k.registers for k in self.kernels.values() if k.registers is not None]
        return max(regs) if regs else None

    @property
    def local_memory_instructions(self) -> int:
        """LDL/STL in the SASS: local-memory traffic (spills, or arrays indexed at run time)."""
        c = self.sass_opcodes
        return sum(n for op, n in c.items() if _matches(op, "LDL") or _matches(op, "STL"))

    @property
    def spills(self) -> bool:
        """True if anything in the module touches local memory or ptxas reports spill bytes."""
        if self.local_memory_instructions:
            return True
        return any((k.spill_store_bytes or 0) + (k.spill_load_bytes or 0) + (k.frame_bytes or 0) > 0
                   for k in self.kernels.values())


# --------------------------------------------------------------------------------------------------
# tools


def tool_candidates(name: str) -> list[str]:
    """Every executable ``name`` that could serve, in search order without duplicates: each PATH
    entry, $CUDA_HOME / $CUDA_PATH, the toolkits under /usr/local, the nvidia-* wheels (and the
    CuTe DSL's), Triton's bundled copy."""
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    dirs += [os.path.join(os.environ[v], "bin") for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    dirs += sorted(glob.glob("/usr/local/cuda*/bin"), reverse=True)
    roots = []
    for base in {os.path.dirname(os.path.dirname(sys.executable)), sys.prefix}:
        roots += glob.glob(f"{base}/lib/python3*/site-packages")
    try:
        import nvidia  # namespace package of the CUDA wheels

        roots += [os.path.dirname(r) for r in nvidia.__path__]
    except ImportError:
        pass
    for root in roots:
        dirs += glob.glob(f"{root}/nvidia/*/bin") + glob.glob(f"{root}/nvidia_cutlass_dsl/*/bin")
        dirs += glob.glob(f"{root}/triton/backends/nvidia/bin")
    out, seen = [], set()
    for d in dirs:
        c = os.path.join(d, name) if d else ""
        if c and os.path.isfile(c) and os.access(c, os.X_OK) and os.path.realpath(c) not in seen:
            seen.add(os.path.realpath(c))
            out.append(c)
    return out


_RELEASE = re.compile(r"release (\d+)\.(\d+)|V(\d+)\.(\d+)")


@functools.lru_cache(maxsize=None)
def tool_release(path: str) -> tuple[int, int] | None:
    """(major, minor) CUDA release of a CUDA binary from its --version, or None if it says none."""
    try:
        res = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    m = _RELEASE.search(res.stdout + res.stderr)
    if not m:
        return None
    major, minor = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    return int(major), int(minor)


def find_tool(name: str) -> str | None:
    """Path of a CUDA binary: the newest release among tool_candidates (the first found where
    releases tie or cannot be read). Newest, not first on PATH: the CuTe DSL's embedded compiler
    emits the PTX ISA of its own CUDA, which an older system ptxas rejects ("Unsupported .version"),
    while pip's nvidia-cuda-nvcc or Triton's ptxas may be new enough."""
    cands = tool_candidates(name)
    if not cands:
        return None
    return max(enumerate(cands), key=lambda ic: (tool_release(ic[1]) or (-1, -1), -ic[0]))[1]


def disassemble(cubin: bytes) -> str:
    tool = find_tool("nvdisasm")
    if tool is None:
        tool = find_tool("cuobjdump")
        if tool is None:
            raise RuntimeError("need nvdisasm (pip install nvidia-cuda-nvdisasm) or cuobjdump for SASS")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as fh:
            fh.write(cubin)
        args = [tool, "-c", path] if tool.endswith("nvdisasm") else [tool, "-sass", path]
        res = subprocess.run(args, capture_output=True, text=True, check=True)
    return res.stdout


_PTXAS_FUNC = re.compile(r"Function properties for (\S+)")
_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Compiling entry function '([^']+)'|Used (\d+) registers")


_PTX_VERSION = re.compile(r"^\s*\.version\s+(\d+)\.(\d+)", re.M)


def ptxas_failure(ptx: str, tool: str, log: str) -> str:
    """The error for a failed ``ptxas -v``; where the PTX's ISA is newer than the ptxas (an
    environment problem, not the kernel's), it says so, with every ptxas found and its release."""
    m = _PTX_VERSION.search(ptx)
    if m and "Unsupported .version" in log:
        found = ", ".join(f"{c} (CUDA {'.'.join(map(str, tool_release(c) or ('?',)))})"
                          for c in tool_candidates("ptxas"))
        return (f"environment: the CuTe DSL emitted PTX ISA {m.group(1)}.{m.group(2)}, newer than every ptxas "
                f"found (used {tool}; found: {found}). Install a ptxas of that CUDA release or newer "
                f"(pip install nvidia-cuda-nvcc for the DSL's CUDA major, or a CUDA toolkit) or put one first "
                f"on PATH; the kernel itself compiled (the DSL's own compiler made its cubin).\n{log}")
    return f"ptxas failed ({tool}):\n{log}"


def ptxas_verbose(ptx: str, arch: str = "sm_90a") -> tuple[dict[str, KernelResources], str]:
    """Run `ptxas -v` on a PTX module; per-kernel registers and spill bytes, plus the raw log."""
    tool = find_tool("ptxas")
    if tool is None:
        return {}, "ptxas not found"
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        Path(src).write_text(ptx)
        res = subprocess.run([tool, f"-arch={arch}", "-v", src, "-o", os.path.join(d, "k.cubin")],
                             capture_output=True, text=True)
    log = res.stdout + res.stderr
    if res.returncode != 0:
        raise RuntimeError(ptxas_failure(ptx, tool, log))
    out: dict[str, KernelResources] = {}
    current = None
    for line in log.splitlines():
        m = _PTXAS_FUNC.search(line)
        if m:
            current = out.setdefault(m.group(1), KernelResources())
            continue
        m = _PTXAS_SPILL.search(line)
        if m and current is not None:
            current.frame_bytes = int(m.group(1))
            current.spill_store_bytes, current.spill_load_bytes = int(m.group(2)), int(m.group(3))
            continue
        m = _PTXAS_REGS.search(line)
        if m and m.group(2) and current is not None:
            current.registers = int(m.group(2))
    return out, log


# --------------------------------------------------------------------------------------------------
# cubin metadata (ELF64, little endian)

_EIATTR_FRAME_SIZE = 0x11
_EIATTR_REGCOUNT = 0x2F
_EIFMT_SVAL = 0x04


def cubin_resources(cubin: bytes) -> dict[str, KernelResources]:
    """Per-function register count and stack frame read from the cubin's .nv.info attributes."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise ValueError("not a 64-bit ELF cubin")
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]

    def cstr(off: int) -> str:
        return cubin[off:cubin.index(b"\0", off)].decode()

    names = [cstr(secs[shstrndx][4] + s[0]) for s in secs]
    symbols: list[str] = []
    for s in secs:
        if s[1] == 2:  # SHT_SYMTAB; entries are 24 bytes, names in the linked string table
            strtab = secs[s[6]][4]
            for j in range(s[5] // 24):
                symbols.append(cstr(strtab + struct.unpack_from("<I", cubin, s[4] + 24 * j)[0]))
    out: dict[str, KernelResources] = {}
    for s, name in zip(secs, names):
        if name != ".nv.info":
            continue
        data = cubin[s[4]:s[4] + s[5]]
        i = 0
        while i + 4 <= len(data):
            fmt, attr = data[i], data[i + 1]
            size = struct.unpack_from("<H", data, i + 2)[0]
            if fmt != _EIFMT_SVAL:
                i += 4  # value formats without payload keep the 16-bit field as the value
                continue
            if attr in (_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE) and size == 8:
                sym, val = struct.unpack_from("<II", data, i + 4)
                kr = out.setdefault(symbols[sym] if sym < len(symbols) else f"sym{sym}", KernelResources())
                if attr == _EIATTR_REGCOUNT:
                    kr.registers = val
                else:
                    kr.frame_bytes = val
            i += 4 + size
    return out


# --------------------------------------------------------------------------------------------------
# counting


def _matches(opcode: str, op: str) -> bool:
    return opcode == op or opcode.startswith(op + ".")


def ptx_opcodes(ptx: str) -> list[str]:
    """Opcodes of the PTX instructions (inline-asm bodies included), predicates stripped."""
    ops = []
    for raw in ptx.splitlines():
        line = raw.split("//", 1)[0].strip()
        if not line or line[0] in ".{}" or line.endswith(":"):
            continue
        tok = line.split()
        if tok[0].startswith("@"):
            tok = tok[1:]
        if tok and re.match(r"[a-z]", tok[0]):
            ops.append(tok[0].rstrip(";"))
    return ops


_SASS_LINE = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)")


def sass_opcodes(sass: str) -> list[str]:
    return [m.group(1) for m in map(_SASS_LINE.match, sass.splitlines()) if m]


def between_first_and_last(opcodes: list[str], op: str) -> list[str]:
    """The opcodes from the first to the last one matching ``op`` (e.g. a kernel's WGMMA span:
    its mainloops, without the prologue and epilogue)."""
    at = [i for i, o in enumerate(opcodes) if _matches(o, op)]
    return opcodes[at[0]:at[-1] + 1] if at else []


def ops_between_waits(sass: str, op: str, first: int = 1, second: int = 0) -> list[int]:
    """For each WGMMA wait on ``first`` groups (WARPGROUP.DEPBAR.LE gsb0, first) directly followed by
    a wait on ``second``, how many ``op`` instructions lie between the two: the work a consumer
    does while its last GEMM group is still running (e.g. MUFU.EX2 under the backward's dP^T)."""
    counts, between = [], None
    for line in sass.splitlines():
        m = _SASS_LINE.match(line)
        if not m:
            continue
        opcode = m.group(1)
        if opcode.startswith("WARPGROUP.DEPBAR"):
            groups = int(line.split(";")[0].rsplit(",", 1)[1].strip(), 0)
            if groups == second and between is not None:
                counts.append(between)
            between = 0 if groups == first else None
        elif between is not None and _matches(opcode, op):
            between += 1
    return counts


def count_ops(opcodes: Iterable[str], ops: Iterable[str]) -> dict[str, int]:
    opcodes = list(opcodes)
    return {op: sum(_matches(o, op) for o in opcodes) for op in ops}


# --------------------------------------------------------------------------------------------------
# entry point


def compile_and_inspect(fn, *args, ptx_ops: Iterable[str] = (), sass_ops: Iterable[str] = (),
                        arch: str = "sm_90a", options: str = "", run_ptxas: bool = True,
                        **kwargs) -> CodegenReport:
    """cute.compile(fn, *args, **kwargs) for `arch` (no GPU needed; pass fake tensors from
    cutlass.cute.runtime.make_fake_compact_tensor), then count opcodes and read resources."""
    import cutlass.cute as cute

    with tempfile.TemporaryDirectory() as dump:
        opts = f"--gpu-arch={arch} --keep-ptx --keep-cubin --dump-dir={dump} {options}".strip()
        compiled = cute.compile(fn, *args, options=opts, **kwargs)
        ptx, cubin = compiled.__ptx__, compiled.__cubin__
    if not ptx or not cubin:
        raise RuntimeError("the DSL kept no PTX/cubin; check the compile options")
    if isinstance(cubin, str):
        cubin = cubin.encode("latin-1")
    sass = disassemble(cubin)
    kernels = cubin_resources(cubin)
    log = ""
    if run_ptxas:
        per, log = ptxas_verbose(ptx, arch)
        for name, kr in per.items():
            mine = kernels.setdefault(name, KernelResources())
            mine.spill_store_bytes, mine.spill_load_bytes = kr.spill_store_bytes, kr.spill_load_bytes
            if mine.registers is None:
                mine.registers = kr.registers
    return CodegenReport(
        ptx=ptx,
        sass=sass,
        ptx_counts=count_ops(ptx_opcodes(ptx), ptx_ops),
        sass_counts=count_ops(sass_opcodes(sass), sass_ops),
        kernels=kernels,
        ptxas_log=log,
    )
