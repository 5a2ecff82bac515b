"""Tile scheduling shared by the kernels (host arithmetic and device decode).

A forward work tile is (m_block, head, batch). The launch is 1-D; each CTA decodes
its tile from the linear block index so that the order is a runtime knob:

* head swizzle: heads are walked in groups of ``swizzle``; inside a group the CTAs
  step through m_blocks with the group's heads interleaved, so the K/V of at most
  ``swizzle`` heads are being streamed at a time and stay resident in L2;
* LPT: for causal attention the last m_blocks see the most keys, so launching them
  first (reverse m order) shortens the tail where few long CTAs run alone.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32


def num_m_blocks(seqlen_q: int, tile_m: int) -> int:
    return (seqlen_q + tile_m - 1) // tile_m


def tile_grid(extent, tile: int, num_heads, batch, vl=None):
    """(tiles along the walked axis, heads x sequences) of a launch, traced inline (plain Python,
    no call in the kernel). Dense (``vl`` None): ``extent`` and ``batch``. Varlen: ``vl`` is the
    kernels' varlen tuple, cu_seqlens_q first and the walked axis' longest sequence fifth; the
    sequences are one packed batch, so the walked axis is as long as the longest sequence and a
    tile past a shorter one's end exits in the kernel. The forward's and the backward's host grids
    and device decodes all count tiles here, so a grid and its decode cannot disagree."""
    num_bh = num_heads * batch
    if cutlass.const_expr(vl is not None):
        extent = vl[4]
        num_bh = num_heads * (vl[0].shape[0] - 1)
    return num_m_blocks(extent, tile), num_bh


@cute.jit
def decode_tile(
    tile_idx: Int32,
    num_m: Int32,
    num_heads: Int32,
    num_bh: Int32,
    swizzle: Int32,
    lpt: Int32,
):
    """Linear tile index -> (m_block, head, batch)."""
    per_group = num_m * swizzle
    group = tile_idx // per_group
    rem = tile_idx - group * per_group
    heads_here = cutlass.min(swizzle, num_bh - group * swizzle)
    m_idx = rem // heads_here
    bh = group * swizzle + rem - m_idx * heads_here
    m_block = m_idx
    if lpt != 0:
        m_block = num_m - 1 - m_idx
    batch = bh // num_heads
    head = bh - batch * num_heads
    return m_block, head, batch


@cute.jit
def kv_block_range(
    m_block: Int32,
    tile_m: cutlass.Constexpr,
    tile_n: cutlass.Constexpr,
    seqlen_q: Int32,
    seqlen_k: Int32,
    causal: cutlass.Constexpr,
):
    """(n_block_max, n_block_unmasked_end) for one CTA's rows.

    KV tiles n in [n_block_unmasked_end, n_block_max) need masking (the causal
    diagonal or the seqlen_k residue); tiles below need none. n_block_max is at
    least 1 so that rows that see no key at all still run one fully masked tile
    and come out as O = 0, LSE = -inf instead of being skipped unwritten.
    """
    n_max = (seqlen_k + tile_n - 1) // tile_n
    n_unmasked = seqlen_k // tile_n
    if cutlass.const_expr(causal):
        shift = seqlen_k - seqlen_q
        last_visible = (m_block + 1) * tile_m + shift  # exclusive bound on visible keys
        n_max = cutlass.min(n_max, (cutlass.max(last_visible, 0) + tile_n - 1) // tile_n)
        first_row_visible = cutlass.max(m_block * tile_m + shift + 1, 0)
        n_unmasked = cutlass.min(n_unmasked, first_row_visible // tile_n)
    n_max = cutlass.max(n_max, 1)
    n_unmasked = cutlass.min(n_unmasked, n_max)
    return n_max, n_unmasked
