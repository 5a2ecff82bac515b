"""Which query tiles a backward CTA visits, and its turn in a deterministic dQ reduction.

Branch-free integer arithmetic on purpose: the same functions run inside the kernel (on
Int32 values, traced by the DSL) and on the host with Python ints, where the CPU tests check
them against a brute-force scan of the causal mask and the launch order.

A backward CTA owns key tile n (rows [n*tile_n, (n+1)*tile_n)) and visits query tiles m.
Causal masking is bottom-right aligned: query i sees key j iff j <= i + seqlen_k - seqlen_q.
"""

import cutlass


def m_block_range(n_block, tile_m: int, tile_n: int, seqlen_q, seqlen_k, causal: bool):
    """(m_start, m_masked_end, m_end): visit [m_start, m_end); [m_start, m_masked_end) need masks.

    Non-causal CTAs visit every query tile. The key tile that crosses seqlen_k masks every
    query tile: its zero-filled rows would otherwise give P = 2^(-LSE), which may overflow.
    """
    m_end = (seqlen_q + tile_m - 1) // tile_m
    m_start = 0
    m_masked_end = 0
    if causal:
        shift = seqlen_k - seqlen_q
        # First query row that sees key n*tile_n is n*tile_n - shift.
        m_start = cutlass.max(n_block * tile_n - shift, 0) // tile_m
        # Tiles whose first row is below the tile's last key by the shift still cut the diagonal.
        last_key = (n_block + 1) * tile_n - 1
        m_masked_end = (cutlass.max(last_key - shift, 0) + tile_m - 1) // tile_m
    # 1 for the partial last key tile, <= 0 for full tiles.
    residue = cutlass.max(cutlass.min(n_block - seqlen_k // tile_n + 1, 1), 0)
    m_masked_end = cutlass.max(m_masked_end, residue * m_end)
    m_start = cutlass.min(m_start, m_end)
    m_masked_end = cutlass.min(cutlass.max(m_masked_end, m_start), m_end)
    return m_start, m_masked_end, m_end


def dq_turn(m_block, n_block, tile_m: int, tile_n: int, num_n, seqlen_q, seqlen_k, causal: bool, spt):
    """Position of key tile n_block among the contributors to query tile m_block.

    The contributors are key tiles 0..n_hi(m) (all key tiles when not causal). Natural order
    (spt=0) gives turn n_block. SPT (spt=1) launches the highest key tiles first, the
    shortest ones under causal masking, so turns count down from n_hi(m). Either way a CTA
    only ever waits for CTAs launched before it.
    """
    n_hi = num_n - 1
    if causal:
        last_visible = (m_block + 1) * tile_m + seqlen_k - seqlen_q  # exclusive bound on keys seen
        n_hi = cutlass.min(n_hi, (last_visible - 1) // tile_n)
    return n_block + spt * (n_hi - 2 * n_block)
