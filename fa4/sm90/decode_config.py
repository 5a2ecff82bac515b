"""The knobs of our Hopper decode kernel (paged KV cache, split-KV, packed GQA): one declaration,
one feasibility function, the split heuristic.

Everything that lists these knobs derives it from :class:`DecodeConfigSm90` through fa4.knobs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fa4.arch import SM90, Arch
from fa4.decode_problem import DecodeProblem
from fa4.knobs import RuntimeKnobNames, Violation, knob

HEAD_DIMS = (64, 96, 128, 192, 256)
# One consumer warpgroup: one WGMMA atom of 64 query rows per CTA.
ROWS_PER_CTA = 64
# Warps 0-3: the consumer warpgroup (WGMMA needs it aligned at thread 0 of a warpgroup);
# warp 4: the TMA producer. No setmaxnreg: 160 threads leave every thread 255 registers.
CONSUMER_THREADS = 128
NUM_THREADS = CONSUMER_THREADS + 32
# Live fragments of a consumer thread (O + S + P, fp32-register units) must stay below this so
# ptxas neither spills nor serializes the WGMMAs; the rest of the 255 holds the softmax state,
# the row limits and addresses.
FRAGMENT_REG_BUDGET = 200
SMEM_RESERVED = 2048
# The most splits the workspace (num_splits, B, Hq, Sq, D) and the combine take.
MAX_SPLITS = 128


@dataclass(frozen=True)
class DecodeConfigSm90:
    num_splits: int = knob(
        (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128), 0,
        "KV splits per (sequence, KV head): each CTA takes a contiguous range of KV tiles and the combine "
        "kernel merges the partial results by their LSE; 1 writes O directly (no combine), 0 = the "
        "heuristic (num_splits_auto: fill the SMs at small batch, no split once the batch fills them).",
        runtime=True,
    )
    pack_gqa: bool = knob(
        (True, False), True,
        "Put the query heads of one KV head (x the new tokens) into the 64 M rows of one tile, so each K/V "
        "byte is read once per KV head; False runs one CTA per query head (K/V re-read per head, from L2).",
        runtime=True,
    )
    tile_n: int = knob(
        (16, 32, 64, 128), 128,
        "Keys per mainloop step (one TMA box of K and one of V). Paged caches need it to divide the page "
        "size: a tile never straddles two pages, so one page-table read places each box.",
    )
    kv_stages: int = knob(
        (2, 3, 4, 6, 8), 3,
        "Depth of the K and V shared-memory rings: how many KV tiles the producer's TMA keeps in flight "
        "(decode is bound by HBM bandwidth, so bytes in flight per SM are what matters).",
    )
    combine: str = knob(
        ("kernel", "pdl", "fused"), "kernel",
        "How a split launch merges its partial (O, LSE): 'kernel' = a second kernel after the decode; 'pdl' = "
        "that kernel launched as a programmatic dependent (its launch overlaps the decode's tail); 'fused' = "
        "the last split CTA of each row block (an atomic ticket per block, reset by that CTA) combines them "
        "itself: one launch. No effect unsplit.",
    )
    page_load: str = knob(
        ("tma",), "tma",
        "How a page's KV tile is loaded: 'tma' = one bulk-tensor copy per K and V tile, its page looked up "
        "in page_table by the producer warp (coordinates: row in page, head, page).",
    )

    RUNTIME_KNOBS = RuntimeKnobNames()


def smem_bytes(config: DecodeConfigSm90, problem: DecodeProblem) -> int:
    d = problem.head_dim
    return 2 * (ROWS_PER_CTA * d + 2 * config.kv_stages * config.tile_n * d) + SMEM_RESERVED


def consumer_registers(config: DecodeConfigSm90, problem: DecodeProblem) -> int:
    """fp32-register units of O, S and P (16-bit, packed) per consumer thread."""
    per_thread = ROWS_PER_CTA / CONSUMER_THREADS
    return int(math.ceil(per_thread * (problem.head_dim + config.tile_n + config.tile_n / 2)))


def rows_per_cta_head(problem: DecodeProblem, pack_gqa: bool) -> int:
    """Query rows one (sequence, CTA head) owns: the packed group's heads x new tokens, or the tokens."""
    return problem.seqlen_q * (problem.group if pack_gqa else 1)


def violations(config: DecodeConfigSm90, problem: DecodeProblem, arch: Arch = SM90) -> list[str]:
    """Why this config cannot run this decode problem on this arch (empty list = feasible)."""
    out: list[str] = []
    if arch.name != "sm90":
        out.append(Violation("problem", f"DecodeConfigSm90 targets sm90, not {arch.name}"))
    if problem.head_dim not in HEAD_DIMS:
        out.append(Violation("problem", f"head_dim {problem.head_dim} not supported by the decode kernel "
                             f"(supported: {HEAD_DIMS})"))
    if problem.paged and problem.page_size % config.tile_n:
        out.append(Violation(
            "tile shape",
            f"page_size {problem.page_size} is not a multiple of tile_n {config.tile_n}: a KV tile must lie "
            "in one page (pages of any multiple of 16 keys are taken with a tile_n that divides them)"))
    need = smem_bytes(config, problem)
    if need > arch.smem_per_cta:
        out.append(Violation(
            "shared memory",
            f"shared memory {need} B (Q 64x{problem.head_dim}, K/V {config.kv_stages} stages of "
            f"{config.tile_n}x{problem.head_dim}) exceeds {arch.smem_per_cta} B per CTA"))
    regs = consumer_registers(config, problem)
    if regs > FRAGMENT_REG_BUDGET:
        out.append(Violation(
            "registers",
            f"consumer fragments need {regs} registers per thread (O, S, P) > {FRAGMENT_REG_BUDGET}"))
    return out


def num_splits_auto(batch: int, heads: int, rows: int, kv_len: int, sm_count: int, tile_n: int,
                    max_splits: int = MAX_SPLITS) -> int:
    """Splits per (sequence, CTA head) for ``num_splits=0``: a pure function of the launch shape.

    ``heads`` CTA heads (KV heads when GQA is packed) per sequence, ``rows`` query rows per CTA
    head (64 per CTA), ``kv_len`` the cache capacity (the host never reads cache_seqlens).
    Decode is bandwidth bound, so the goal is enough CTAs to keep every SM loading: once the
    unsplit grid covers 80% of the SMs a split only adds the combine. Otherwise the split count
    with the best wave efficiency (CTAs over whole waves of SMs) among those that leave each
    split at least 4 KV tiles (fewer and the split's fixed cost, Q load and epilogue, dominates):
    the fewest splits within 5% of the best (each split adds workspace traffic and combine work).
    """
    ctas = batch * heads * max(1, math.ceil(rows / ROWS_PER_CTA))
    if ctas >= 0.8 * sm_count:
        return 1
    n_tiles = max(1, math.ceil(kv_len / tile_n))
    most = max(1, min(max_splits, n_tiles // 4))

    def efficiency(s: int) -> float:
        total = ctas * s
        return total / (math.ceil(total / sm_count) * sm_count)

    best = max(efficiency(s) for s in range(1, most + 1))
    return next(s for s in range(1, most + 1) if efficiency(s) >= 0.95 * best)


# The most query rows per CTA head that the fused combine takes by default: its last CTA combines
# them with 4 warps, a row each at a time, one L2 round trip for the LSEs and one per 8 splits of
# partial O per row; past 4 rows a warp the serial tail outgrows the combine kernel's launch gap.
FUSED_COMBINE_MAX_ROWS = 16


def combine_auto(problem: DecodeProblem, pack_gqa: bool) -> str:
    """The default ``combine`` of a problem (a pure function; it only matters once split).

    Prediction (H200, split decode at batch 1-4): the combine kernel costs its launch gap plus a
    few us of dependent loads; fusing it into the last split CTA removes the launch and the gap
    (~3-5 us of the ~20 us fixed cost), so 'fused' while a CTA head has at most
    FUSED_COMBINE_MAX_ROWS rows (one token x GQA group up to 16, or a few speculative tokens);
    more rows (long appends, unpacked wide groups) keep a separate kernel, launched as a
    programmatic dependent so its launch hides under the decode.
    """
    return "fused" if rows_per_cta_head(problem, pack_gqa) <= FUSED_COMBINE_MAX_ROWS else "pdl"


def default_config(problem: DecodeProblem, arch: Arch = SM90) -> DecodeConfigSm90:
    """The widest tile the page size takes, as many stages as fit (bytes in flight), auto splits,
    the combine by :func:`combine_auto`."""
    pack = problem.group > 1
    for tn in (128, 64, 32, 16):
        for stages in (8, 6, 4, 3, 2):
            cand = DecodeConfigSm90(tile_n=tn, kv_stages=stages, pack_gqa=pack, combine=combine_auto(problem, pack))
            if not violations(cand, problem, arch):
                return cand
    return DecodeConfigSm90(pack_gqa=pack, combine=combine_auto(problem, pack))
