"""Packed variable-length sequences (varlen): per-tile sequence info and the ragged O store.

A varlen launch packs B sequences along one row axis: sequence b's query rows are
cu_seqlens_q[b] .. cu_seqlens_q[b+1] (its keys likewise in k/v), of which the first seqused_q[b]
are used when seqused_q is given (the reference FA4's meaning). The kernels view the packed
tensors as a batch of one and index sequences by the tile's batch coordinate.

Plain functions called while a kernel is traced (their ``vl`` is the kernel's varlen tuple; the
seqused entries may be None, a trace-time choice).
"""

import cutlass
import cutlass.cute as cute


def seq_info(vl, batch, seqlen_q, seqlen_k):
    """(offset_q, offset_k, seqlen_q, seqlen_k) of sequence ``batch``; with ``vl`` None (dense) the
    offsets are 0 and the lengths the given ones."""
    if vl is None:
        return 0, 0, seqlen_q, seqlen_k
    off_q, len_q = seq_rows(vl[0], vl[2], batch)
    off_k, len_k = seq_rows(vl[1], vl[3], batch)
    return off_q, off_k, len_q, len_k


def seq_rows(cu, used, batch):
    """(offset, length) of sequence ``batch`` along one packed axis: cu_seqlens and seqused (or None)."""
    off = cu[batch]
    return off, (used[batch] if used is not None else cu[batch + 1] - off)


def tile_start(cu, b, tile: int):
    """First grid tile of sequence ``b`` along the key axis of a compact varlen grid: monotone in
    ``b``, and sequence b owns ceil(len_b / tile) tiles from it and at most one spare (kernel and
    host alike)."""
    return (cu[b] + b * tile) // tile


def compact_tiles(total, nseq, tile: int):
    """Grid tiles a head of a compact varlen grid: tile_start(nseq) for a packed axis of ``total``
    rows, bounded from the host-known sizes alone (every sequence's region fits below it)."""
    return total // tile + nseq


@cute.jit
def tile_sequence(cu: cute.Tensor, nseq, t, tile: cutlass.Constexpr):
    """The sequence whose compact-grid region holds tile ``t``: the last b in [0, nseq) with
    tile_start(b) <= t (a binary search over cu_seqlens, log2 nseq dependent loads; tile_start(0)
    is 0). Tiles past the last sequence's keys come out as its spare tiles, which exit."""
    lo = cutlass.Int32(0)
    hi = cutlass.Int32(nseq)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tile_start(cu, mid, tile) <= t:
            lo = mid
        else:
            hi = mid
    return lo


@cute.jit
def store_rows(
    rO: cute.Tensor,  # the thread's O accumulator partition, converted to the output dtype
    pv_thr,  # the PV WGMMA's thread slice (rO's partition)
    mO: cute.Tensor,  # (total_q, dv, heads, 1) the packed output, kernel view
    row0,  # packed row of the tile's first row
    rows_left,  # rows of the tile inside its sequence (< the tile's height)
    head,
    tile: cutlass.Constexpr,  # (rows, dv)
):
    """Predicated stores of a tile's rows [0, rows_left): a sequence's last, partial tile, whose
    TMA box would run into the next sequence's rows."""
    gO = cute.local_tile(cute.domain_offset((row0, 0), mO[None, None, head, 0]), tile, (0, 0))
    tOgO = pv_thr.partition_C(gO)
    tOcO = pv_thr.partition_C(cute.make_identity_tensor(tile))
    for i in cutlass.range_constexpr(cute.size(rO)):
        if tOcO[i][0] < rows_left:
            tOgO[i] = rO[i]


# The backward's fp32 side buffers (LSE * log2 e, D, the dQ and GQA dK/dV accumulators) give each
# sequence a region of whole PAD-row tiles: the main kernel loads and reduces whole tiles there
# (a dQ tile is one linear run in fragment order, which cannot start mid-tile), and a tile of one
# sequence never overlaps the next one's.
def padded_offset(offset, batch, pad: int):
    """First row of sequence ``batch``'s region in a padded side buffer: its packed offset plus
    ``pad`` rows per earlier sequence, rounded down to a tile. Regions do not overlap: the next
    one starts at least ceil(len / pad) tiles later (kernel and host alike: Int32 or int)."""
    return (offset + batch * pad) // pad * pad


def padded_total(total: int, batch: int, pad: int) -> int:
    """Rows of a padded side buffer for ``batch`` sequences of ``total`` packed rows: the end of
    the last region is at most padded_offset(total, batch, pad)."""
    return (total + batch * pad) // pad * pad
