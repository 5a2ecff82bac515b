"""The reference FlashAttention-4 (package flash-attn-4, module flash_attn.cute) as a tunable peer.

Its Hopper forward exposes four knobs through the private ``_flash_attn_fwd``: the tile
shape (tile_m x tile_n), whether P feeds the PV GEMM from registers (``mma_pv_is_rs``) and
whether a warpgroup overlaps QK of the next KV tile with PV of the current one
(``intra_wg_overlap``). Its backward is reachable only through the public function, whose one
performance-relevant switch is ``deterministic``: the problem's flag, so the backward has no knobs.

Feasibility below is our own register and shared-memory arithmetic for that kernel's
structure (one producer warpgroup, tile_m/64 MMA warpgroups, Q + 2-stage K/V ring in shared
memory, S/P/O accumulators in registers), written after reading the reference's kernel.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from fa4.arch import Arch
from fa4.knobs import Violation, knob
from fa4.problem import Problem

from .base import Provider

WARPGROUP = 128
# Registers per thread the kernel gives each MMA warpgroup with setmaxnreg, by MMA warpgroup
# count; the producer warpgroup keeps the rest of the SM's 64K registers.
MMA_REG_CEILING = {1: 256, 2: 240, 3: 160}
# Of those, what softmax row statistics, addresses, loop state and pipeline phases use; the
# rest holds the S, P and O accumulators. Larger with three MMA warpgroups because the
# ceiling leaves the compiler less room to schedule.
REG_RESERVE = {1: 24, 2: 24, 3: 32}
KV_STAGES = 2  # fixed in the reference's sm_90 forward
SMEM_ALIGN = 1024  # every shared buffer is 1 KiB aligned (TMA / swizzle atoms)
SMEM_BARRIERS = 1024  # mbarriers of the Q/K/V pipelines, rounded to the alignment


@dataclass(frozen=True)
class RefFa4FwdKnobs:
    tile_m: int = knob((64, 128, 192), 128, "query rows per CTA; tile_m/64 MMA warpgroups")
    tile_n: int = knob(
        (64, 80, 96, 112, 128, 144, 160, 176, 192), 128, "key/value rows per pipeline stage"
    )
    mma_pv_is_rs: bool = knob(
        (True, False), True, "P feeds the PV WGMMA from registers (else staged through smem)"
    )
    intra_wg_overlap: bool = knob(
        (True, False), True, "overlap QK^T of KV tile j+1 with PV of tile j inside a warpgroup"
    )


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def padded_head_dim(d: int) -> int:
    # The kernel tiles the head dimension in multiples of 16 and masks the rest.
    return _round_up(d, 16)


def holds_p_with_s(cfg: RefFa4FwdKnobs) -> bool:
    # With overlap, S of the next KV tile accumulates while P of the current one is still
    # the register operand of PV. With P staged through smem its registers die at the store.
    return cfg.intra_wg_overlap and cfg.mma_pv_is_rs


def fwd_register_use(cfg: RefFa4FwdKnobs, problem: Problem) -> tuple[int, int]:
    """(accumulator registers per MMA thread, budget) for the forward."""
    num_wg = cfg.tile_m // 64
    s_regs = 64 * cfg.tile_n // WARPGROUP  # fp32 S: each warpgroup owns 64 rows of the tile
    p_regs = s_regs // 2  # the same tile as 16-bit pairs
    o_regs = 64 * padded_head_dim(problem.head_dim_v) // WARPGROUP
    used = s_regs + o_regs + (p_regs if holds_p_with_s(cfg) else 0)
    return used, MMA_REG_CEILING[num_wg] - REG_RESERVE[num_wg]


def fwd_smem_bytes(cfg: RefFa4FwdKnobs, problem: Problem) -> int:
    elt = 2  # bf16 / fp16
    d, dv = padded_head_dim(problem.head_dim), padded_head_dim(problem.head_dim_v)
    # The epilogue writes O through Q's buffer, so the larger of the two is what stays.
    q_o = max(cfg.tile_m * d, cfg.tile_m * dv) * elt
    k = KV_STAGES * cfg.tile_n * d * elt
    v = KV_STAGES * cfg.tile_n * dv * elt
    p = 0 if cfg.mma_pv_is_rs else cfg.tile_m * cfg.tile_n * elt
    return sum(_round_up(b, SMEM_ALIGN) for b in (q_o, k, v, p)) + SMEM_BARRIERS


def head_dim_errors(problem: Problem) -> list[str]:
    bad = []
    dims = [("head_dim", problem.head_dim)]
    if problem.head_dim_v != problem.head_dim:
        dims.append(("head_dim_v", problem.head_dim_v))
    for name, d in dims:
        # TMA needs 16-byte rows: 8 elements of a 16-bit type.
        if d % 8 != 0 or not 8 <= d <= 256:
            bad.append(Violation("problem", f"{name}={d}: the reference FA4 on sm90 needs a multiple of 8 in [8, 256]"))
    return bad


def fwd_violations(cfg: RefFa4FwdKnobs, problem: Problem, arch: Arch) -> list[str]:
    v = []
    if arch.name != "sm90":
        v.append(Violation("problem", f"these knobs drive the reference's sm90 kernel, not {arch.name}"))
    v.extend(head_dim_errors(problem))
    if v:
        return v
    if cfg.tile_m % 64 != 0 or cfg.tile_m // 64 not in MMA_REG_CEILING:
        v.append(Violation("tile shape", f"tile_m={cfg.tile_m}: must be 64, 128 or 192 (one MMA warpgroup per 64 rows)"))
        return v
    # tile_n is the K extent of the PV WGMMA (16 per instruction for 16-bit inputs) and the N
    # extent of the QK WGMMA (at most 256).
    if cfg.tile_n % 16 != 0 or cfg.tile_n > 256:
        v.append(Violation("tile shape", f"tile_n={cfg.tile_n}: must be a multiple of 16 up to 256 (WGMMA K/N shape)"))
    used, budget = fwd_register_use(cfg, problem)
    if used > budget:
        parts = f"S {cfg.tile_n // 2} + O {padded_head_dim(problem.head_dim_v) // 2}"
        if holds_p_with_s(cfg):
            parts += f" + P {cfg.tile_n // 4}"
        v.append(Violation(
            "registers",
            f"registers: {used} accumulator registers per thread ({parts}) exceed the "
            f"{budget} left with {cfg.tile_m // 64} MMA warpgroup(s)",
        ))
    smem = fwd_smem_bytes(cfg, problem)
    if smem > arch.smem_per_cta:
        v.append(Violation(
            "shared memory",
            f"shared memory: {smem / 1024:.0f} KiB (Q/O, {KV_STAGES}-stage K and V"
            f"{', P' if not cfg.mma_pv_is_rs else ''}) exceeds {arch.smem_per_cta / 1024:.0f} KiB",
        ))
    return v


def fwd_default(problem: Problem) -> RefFa4FwdKnobs:
    """What the reference picks by itself on sm90 (its per-head-dim table, no sparsity, no window)."""
    d, dv = problem.head_dim, problem.head_dim_v
    if d <= 64:
        return RefFa4FwdKnobs(192, 128, True, True)
    if d <= 96:
        # 192-row tiles with P from registers run out of registers there, hence SS.
        return RefFa4FwdKnobs(192, 128 if problem.causal else 144, False, True)
    if d <= 128:
        return RefFa4FwdKnobs(128, 128, True, True)
    if d <= 192:
        return RefFa4FwdKnobs(128, 128 if dv <= 128 else 112, True, True)
    return RefFa4FwdKnobs(128, 80, True, True)


def _import_reference():
    return importlib.import_module("flash_attn.cute.interface")


class FlashAttn4Provider(Provider):
    name = "flash-attn-4"
    passes = ("fwd", "bwd")
    features = True
    # Packed problems: cu_seqlens_q/k and max_seqlen_q/k, the same keywords in its forward and
    # in its flash_attn_varlen_func (the backward).
    varlen = True
    knob_cls = RefFa4FwdKnobs

    def available(self) -> str | None:
        if not self.versions():
            return "the reference FA4 is not installed (pip install 'fa4-tune[ref]')"
        try:
            _import_reference()
        except Exception as e:  # ImportError, or a broken dependency raising anything
            # Typically triton, which only CUDA builds of torch bring along.
            return f"the reference FA4 is installed but flash_attn.cute cannot be imported: {type(e).__name__}: {e}"
        return None

    def knob_cls_for(self, problem: Problem):
        # The backward has no knob: its one switch, deterministic, is the problem's.
        return RefFa4FwdKnobs if problem.pass_ == "fwd" else None

    def problem_errors(self, problem: Problem) -> list[str]:
        return super().problem_errors(problem) + head_dim_errors(problem)

    def violations(self, config, problem: Problem, arch: Arch) -> list[str]:
        if isinstance(config, RefFa4FwdKnobs):
            return fwd_violations(config, problem, arch)
        v = [] if arch.name == "sm90" else [Violation("problem", f"tuned here for sm90 only, not {arch.name}")]
        v.extend(head_dim_errors(problem))
        return v

    def default_config(self, problem: Problem, arch: Arch):
        if problem.pass_ == "fwd":
            return fwd_default(problem)
        return None

    # ---- running -------------------------------------------------------------------
    def make_fwd(self, problem: Problem, config, q, k, v):
        from providers.harness import feature_kwargs, varlen_args

        ref = _import_reference()
        cfg = config or fwd_default(problem)
        feat = feature_kwargs(problem, q.device)
        packed = varlen_args(problem, q.device) if problem.varlen else {}

        def run():
            return ref._flash_attn_fwd(
                q,
                k,
                v,
                causal=problem.causal,
                softcap=problem.softcap or None,
                window_size_left=feat["window_size"][0],
                window_size_right=feat["window_size"][1],
                learnable_sink=feat["learnable_sink"],
                tile_mn=(cfg.tile_m, cfg.tile_n),
                mma_pv_is_rs=cfg.mma_pv_is_rs,
                intra_wg_overlap=cfg.intra_wg_overlap,
                **packed,
            )[0]

        return run

    def make_fwd_bwd(self, problem: Problem, config, q, k, v, do):
        import torch

        ref = _import_reference()
        q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
        from providers.harness import feature_kwargs, varlen_args

        kw = dict(causal=problem.causal, deterministic=problem.deterministic, **feature_kwargs(problem, q.device))
        if problem.varlen:  # by keyword: its varlen function takes qv fourth
            out = ref.flash_attn_varlen_func(q, k, v, **varlen_args(problem, q.device), **kw)
        else:
            out = ref.flash_attn_func(q, k, v, **kw)
        if isinstance(out, tuple):
            out = out[0]

        def run():
            return torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

        return run

    def supports_compile_only(self, problem: Problem) -> bool:
        # compile_only builds dense fake tensors; a packed problem is compiled by its first run.
        return problem.pass_ == "fwd" and not problem.varlen

    def compile_only(self, problem: Problem, config, arch: Arch) -> str | None:
        """Compile the forward for ``arch`` on fake tensors (no launch, no GPU needed by the DSL)."""
        if not self.supports_compile_only(problem) or self.available() is not None:
            return None
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode

        ref = _import_reference()
        dt = torch.bfloat16 if problem.dtype == "bf16" else torch.float16
        cfg = config or fwd_default(problem)
        try:
            with FakeTensorMode():
                q = torch.empty(problem.batch, problem.seqlen_q, problem.heads_q, problem.head_dim, dtype=dt, device="cuda")
                k = torch.empty(problem.batch, problem.seqlen_k, problem.heads_kv, problem.head_dim, dtype=dt, device="cuda")
                v = torch.empty(problem.batch, problem.seqlen_k, problem.heads_kv, problem.head_dim_v, dtype=dt, device="cuda")
                ref._flash_attn_fwd(
                    q, k, v, causal=problem.causal, tile_mn=(cfg.tile_m, cfg.tile_n),
                    mma_pv_is_rs=cfg.mma_pv_is_rs, intra_wg_overlap=cfg.intra_wg_overlap,
                    _arch=arch.major * 10 + arch.minor,
                )
        except Exception as e:
            return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        return None

    # ---- identity ------------------------------------------------------------------
    def source_files(self) -> list[Path]:
        files = [Path(__file__)]
        try:
            root = Path(_import_reference().__file__).parent
            files += [root / "interface.py", root / "flash_fwd_sm90.py", root / "flash_bwd_sm90.py"]
        except Exception:
            pass
        return files

    def versions(self) -> dict:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return {"flash-attn-4": version("flash-attn-4")}
        except PackageNotFoundError:
            return {}

    def describe(self, config) -> str:
        if isinstance(config, RefFa4FwdKnobs):
            return (
                f"{config.tile_m}x{config.tile_n} {'RS' if config.mma_pv_is_rs else 'SS'}"
                f"{' OL' if config.intra_wg_overlap else ''}"
            )
        return super().describe(config)

