"""Which tiles of S = Q K^T a causal / sliding-window mask leaves any visible pair in.

Query row i sees key j iff  j <= i + o + right  (when the right bound exists: causal is
right = 0)  and  j >= i + o - left  (when the left bound exists), o = seqlen_k - seqlen_q
(bottom-right alignment, as the reference FA4). A tile pair (query tile m, key tile n) is
visited iff its rectangle of rows [m tile_m, (m+1) tile_m) x keys [n tile_n, (n+1) tile_n)
meets that band: both functions below test the same inequality on the same tile extents, so
the key tiles kv_block_range gives query tile m are exactly those whose q_block_range holds m
(the deterministic backward's turns count on it; a CPU test checks it against a scan).

Branch-free integer arithmetic with cutlass.min/max, and no division of a negative number
(C truncation in the kernel, floor on the host): the same code runs inside a cute.jit kernel on
Int32 values and on the host with Python ints. Ranges are half-open; an empty range has
min == max. The bounds only clamp to whole tiles (seqlen_q, seqlen_k themselves are the
masks' business); window_right is ignored under causal (the host folds it into causal).
"""

import cutlass


def kv_block_range(m_block, tile_m: int, tile_n: int, seqlen_q, seqlen_k, causal: bool,
                   has_window_left: bool, has_window_right: bool, window_left, window_right):
    """(n_block_min, n_block_max): the key tiles with a pair visible from query tile m_block."""
    n_max = (seqlen_k + tile_n - 1) // tile_n
    n_min = 0
    o = seqlen_k - seqlen_q
    if causal or has_window_right:
        right = 0 if causal else window_right
        # Last key seen by the tile's last row, as an exclusive tile bound.
        n_max = cutlass.min(n_max, cutlass.max((m_block + 1) * tile_m - 1 + o + right + tile_n, 0) // tile_n)
    if has_window_left:
        # First key seen by the tile's first row.
        n_min = cutlass.max(m_block * tile_m + o - window_left, 0) // tile_n
    n_min = cutlass.min(n_min, n_max)
    return n_min, n_max


def q_block_range(n_block, tile_m: int, tile_n: int, seqlen_q, seqlen_k, causal: bool,
                  has_window_left: bool, has_window_right: bool, window_left, window_right):
    """(m_block_min, m_block_max): the query tiles with a pair visible in key tile n_block."""
    m_max = (seqlen_q + tile_m - 1) // tile_m
    m_min = 0
    o = seqlen_k - seqlen_q
    if causal or has_window_right:
        right = 0 if causal else window_right
        # First row that sees the tile's first key.
        m_min = cutlass.max(n_block * tile_n - o - right, 0) // tile_m
    if has_window_left:
        # Last row that sees the tile's last key, as an exclusive tile bound.
        m_max = cutlass.min(m_max, cutlass.max((n_block + 1) * tile_n - 1 - o + window_left + tile_m, 0) // tile_m)
    m_min = cutlass.min(m_min, m_max)
    return m_min, m_max
