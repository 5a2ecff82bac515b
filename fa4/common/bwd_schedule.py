"""Which query tiles a backward CTA visits, and its turn in a deterministic dQ reduction.

Branch-free integer arithmetic on purpose: the same functions run inside the kernel (on
Int32 values, traced by the DSL) and on the host with Python ints, where the CPU tests check
them against a brute-force scan of the causal mask and the launch order.

A backward CTA owns key tile n (rows [n*tile_n, (n+1)*tile_n)) and visits query tiles m.
Causal masking is bottom-right aligned: query i sees key j iff j <= i + seqlen_k - seqlen_q.
"""

import cutlass

from fa4.common.masking_range import kv_block_range, q_block_range


def m_block_segments(n_block, tile_m: int, tile_n: int, seqlen_q, seqlen_k, causal: bool,
                     has_window_left: bool = False, has_window_right: bool = False, window_left=0, window_right=0):
    """(m_start, m_masked_end, m_unmasked_end, m_end): visit [m_start, m_end) (the query tiles
    fa4.common.masking_range.q_block_range gives); [m_start, m_masked_end) and
    [m_unmasked_end, m_end) need masks, the tiles between none.

    The first masked run is where the right bound (causal diagonal, window right) cuts the key
    tile, the second where the window's left bound does (m_unmasked_end == m_end without one).
    The key tile that crosses seqlen_k masks every query tile: its zero-filled rows would
    otherwise give P = 2^(-LSE), which may overflow.
    """
    m_start, m_end = q_block_range(n_block, tile_m, tile_n, seqlen_q, seqlen_k, causal,
                                   has_window_left, has_window_right, window_left, window_right)
    o = seqlen_k - seqlen_q
    m_masked_end = 0
    m_unmasked_end = m_end
    if causal or has_window_right:
        right = 0 if causal else window_right
        # Tiles whose first row is below the tile's last key by more than o + right still cut the bound.
        last_key = (n_block + 1) * tile_n - 1
        m_masked_end = (cutlass.max(last_key - o - right, 0) + tile_m - 1) // tile_m
    if has_window_left:
        # From the first tile whose last row no longer sees the key tile's first key.
        m_unmasked_end = cutlass.max(n_block * tile_n + 1 - o + window_left, 0) // tile_m
    # 1 for the partial last key tile, <= 0 for full tiles.
    residue = cutlass.max(cutlass.min(n_block - seqlen_k // tile_n + 1, 1), 0)
    m_masked_end = cutlass.max(m_masked_end, residue * m_end)
    m_masked_end = cutlass.min(cutlass.max(m_masked_end, m_start), m_end)
    m_unmasked_end = cutlass.min(cutlass.max(m_unmasked_end, m_masked_end), m_end)
    return m_start, m_masked_end, m_unmasked_end, m_end


def m_block_range(n_block, tile_m: int, tile_n: int, seqlen_q, seqlen_k, causal: bool):
    """(m_start, m_masked_end, m_end) without a window: visit [m_start, m_end); [m_start,
    m_masked_end) need masks. Non-causal CTAs visit every query tile."""
    m_start, m_masked_end, _, m_end = m_block_segments(n_block, tile_m, tile_n, seqlen_q, seqlen_k, causal)
    return m_start, m_masked_end, m_end


def dq_turn(m_block, n_block, tile_m: int, tile_n: int, num_n, seqlen_q, seqlen_k, causal: bool, spt,
            has_window_left: bool = False, has_window_right: bool = False, window_left=0, window_right=0):
    """Position of key tile n_block among the contributors to query tile m_block.

    The contributors are the key tiles [n_lo, n_hi] of masking_range.kv_block_range (all key
    tiles without a mask), exactly the tiles whose CTAs visit m_block. Natural order (spt=0)
    gives turn n_block - n_lo. SPT (spt=1) launches the highest key tiles first, the shortest
    ones under causal masking, so turns count down from n_hi. Either way a CTA only ever waits
    for CTAs launched before it, and a key tile the mask skips holds no turn.
    """
    n_lo, n_end = kv_block_range(m_block, tile_m, tile_n, seqlen_q, seqlen_k, causal,
                                 has_window_left, has_window_right, window_left, window_right)
    n_hi = n_end - 1
    return n_block - n_lo + spt * (n_hi + n_lo - 2 * n_block)


def dq_zero_rows(seqlen_q, seqlen_k, tile_m: int, right):
    """Query rows of a (batch or sequence, head) whose fp32 dQ sums the deterministic backward must
    zero: the first dQ turn of a query tile (dq_turn 0) stores its tile instead of adding it, so
    only the tiles no key tile reaches keep the zeros the postprocess converts. Those are the
    whole tiles of the prefix whose rows see no key, rows i < seqlen_q - seqlen_k - right under a
    bottom-right right bound (``right``: 0 causal, the window's right bound, -1 none), and every
    row where there is no key. A window's left bound never hides a row's last key."""
    bounded = cutlass.min(cutlass.max(right + 1, 0), 1)  # 1 where there is a right bound
    prefix = cutlass.max(seqlen_q - seqlen_k - right, 0) // tile_m * tile_m * bounded
    no_keys = 1 - cutlass.min(seqlen_k, 1)
    return cutlass.max(prefix, seqlen_q * no_keys)


def group_step(t, m_start, m_end):
    """(head within the group, m_block) of step t of a CTA that walks the query heads of its K/V
    head (gqa_reduce 'loop'): head-major, each head's query tiles [m_start, m_end) in order, the
    order of the producer's loads and of the consumers' loops. Only called for t < group *
    (m_end - m_start), so the division never sees an empty range."""
    steps = m_end - m_start
    head = t // steps
    return head, m_start + t - head * steps


def step_index(head, m_block, m_start, m_end):
    """The inverse of group_step: the ring position (and dQ writer parity) of (head, m_block)."""
    return head * (m_end - m_start) + m_block - m_start


def walk_tile(m, lo, hi, key_tile, starts: int, within: bool = False):
    """The query tile a CTA visits at position m of its walk with q_starts ``starts``: over the
    walk's unmasked run [lo, hi) (m_block_segments' [m_masked_end, m_unmasked_end)), key tile n
    (a cluster pair's index under cluster_exchange) begins (n mod starts) / starts of the way in
    and wraps, so CTAs whose runs coincide (every key tile without a mask, the key tiles left of
    the diagonal when seqlen_q < seqlen_k) add their dQ tiles into ``starts`` places at a step
    instead of one. The masked tiles keep their places (their masks are per position). A
    permutation of the walk for each key tile; m itself, nothing traced, at starts 1.
    ``within``: m is known to lie in the run (the consumers' unmasked loop)."""
    if starts == 1:
        return m
    count = hi - lo
    t = m + (key_tile % starts) * count // starts
    # 1 past the run's end, else 0 (t < hi + count for m in the run).
    wrap = cutlass.min(cutlass.max(t - hi + 1, 0), 1)
    if within:
        return t - wrap * count
    inside = cutlass.min(cutlass.max(m - lo + 1, 0), 1) * cutlass.min(cutlass.max(hi - m, 0), 1)
    return m + inside * (t - wrap * count - m)


def walk_down_tile(m, lo, hi):
    """The query tile a CTA visits at position m of its walk with walk_down: over the walk's tiles
    [lo, hi) (m_block_segments' [m_start, m_end)), the last first and the first (the diagonal's,
    under a causal bound) last. Every key tile of a head then reaches a query tile q at position
    hi - 1 - q, which does not depend on the key tile where hi does not (causal, and any right
    bound without a left one), and comes earlier for a lower key tile where it does (a left
    bound): with the dQ turns in launch order and the lowest key tiles launched first
    (dq_turn's spt 0), no CTA reaches a tile before the CTAs whose turns come ahead of it."""
    return lo + hi - 1 - m


def walk_runs(segments, walk_down: bool, has_window_left: bool):
    """The consumers' loops over walk positions, in walk order: (first, end, masked) each, from
    m_block_segments' (m_start, m_masked_end, m_unmasked_end, m_end).

    Up: the diagonal's masked tiles, the unmasked run, the window's left-bound masked tiles (only
    with a left bound: the kernel without one has two loops). Down: position p is tile
    walk_down_tile(p, m_start, m_end), so the same runs come mirrored and in reverse order. The
    walk's order is the producer's and the dQ writers' too (they map each position through the
    same function); the loops are separate because masked steps are compiled apart."""
    m_start, m_masked_end, m_unmasked_end, m_end = segments
    if not walk_down:
        runs = [(m_start, m_masked_end, True), (m_masked_end, m_unmasked_end, False)]
        if has_window_left:
            runs.append((m_unmasked_end, m_end, True))
        return runs
    mirror = m_start + m_end
    runs = [(m_start, mirror - m_unmasked_end, True)] if has_window_left else []
    runs.append((mirror - m_unmasked_end, mirror - m_masked_end, False))
    runs.append((mirror - m_masked_end, m_end, True))
    return runs
