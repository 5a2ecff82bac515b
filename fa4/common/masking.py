"""Causal / sliding-window / sequence-length masking of an S = QK^T tile held in WGMMA registers,
and the KV (or Q) tile ranges those masks leave, shared by the forward and the backward.

Alignment is bottom-right (FlashAttention 2+, the reference FA4): with o = seqlen_k - seqlen_q,
query row i sees key j iff j <= i + o + right and j >= i + o - left, where causal means
right = 0 and each window side bounds only when it is on (has_window_left/right). Masked scores
become -inf so exp2 makes them exactly 0.

Coordinates: a thread's elements sit at fixed offsets from its first element, the
same offsets for every thread (the WGMMA accumulator layout is affine in the thread
index). Those offsets are taken from thread 0's partition, where they are
compile-time constants, so each bound costs one compare against an immediate per
element and holds no per-element coordinate registers (which, hoisted out of the
KV loop, would crowd out the WGMMA accumulators).

The range helpers are plain functions over ints: called while a kernel is traced they take
DSL Int32 values (and emit cutlass.min/max), called from Python (tests, host code) plain
ints. Every division has a non-negative dividend, so floor and truncation agree.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

# Bitmask masking (the knobs' mask_bits). A WGMMA accumulator gives each thread its columns in
# pairs 8 apart: offsets 0, 1, 8, 9, 16, 17, ... from its first one, the same for every thread.
# Along that order the elements a bound keeps are a prefix (j < limit) or a suffix (j >= limit)
# whose length is arithmetic on the bound (pair_count), so a row's verdicts fit in one 32-bit
# word per 32 elements, built with two shifts. Testing a constant bit of that word is what
# ptxas turns into R2P (seven predicates from one register) instead of one ISETP per element.
BITS_PER_WORD = 32
_ONES = 0xFFFFFFFF


def _min(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return cutlass.min(a, b)


def _max(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    return cutlass.max(a, b)


def _right_offset(causal, has_window_right, window_right):
    """Keys right of the diagonal a row sees, or None when unbounded (causal means 0)."""
    if causal and has_window_right:
        return _min(window_right, 0)
    if causal:
        return 0
    if has_window_right:
        return window_right
    return None


def kv_block_range(m_block, tile_m, tile_n, seqlen_q, seqlen_k, causal, has_window_left, has_window_right,
                   window_left, window_right):
    """(n_block_min, n_block_max): the KV tiles any row of query tile ``m_block`` sees, half-open.

    Empty (n_block_min >= n_block_max) when no row of the tile sees a key; the forward still
    runs one fully masked tile then, so that such rows come out as O = 0 and LSE = -inf.
    """
    o = seqlen_k - seqlen_q
    n_max = (seqlen_k + tile_n - 1) // tile_n
    right = _right_offset(causal, has_window_right, window_right)
    if right is not None:
        # Exclusive bound on the keys the tile's last row sees.
        hi = (m_block + 1) * tile_m + o + right
        n_max = _min(n_max, (_max(hi, 0) + tile_n - 1) // tile_n)
    n_min = 0
    if has_window_left:
        n_min = _max(m_block * tile_m + o - window_left, 0) // tile_n
    return n_min, n_max


def q_block_range(n_block, tile_m, tile_n, seqlen_q, seqlen_k, causal, has_window_left, has_window_right,
                  window_left, window_right):
    """(m_block_min, m_block_max): the query tiles with a row that sees a key of KV tile ``n_block``,
    half-open; empty (m_block_min >= m_block_max) when none does. A tile's rows past seqlen_q count
    (the kernels compute them and drop them at the store)."""
    o = seqlen_k - seqlen_q
    m_max = (seqlen_q + tile_m - 1) // tile_m
    m_min = 0
    right = _right_offset(causal, has_window_right, window_right)
    if right is not None:
        # Row i sees key j only if i >= j - o - right: the tile's first key bounds the first row.
        m_min = _max(n_block * tile_n - o - right, 0) // tile_m
    if has_window_left:
        # ... and only if i <= j - o + left: rows 0 .. last of them, for the tile's last real key.
        last = _min((n_block + 1) * tile_n, seqlen_k) - 1 - o + window_left
        m_max = _min(m_max, (_max(last + 1, 0) + tile_m - 1) // tile_m)
    return m_min, m_max


def kv_mask_split(m_block, tile_m, tile_n, seqlen_q, seqlen_k, causal, has_window_left, has_window_right,
                  window_left, window_right):
    """How the forward walks its KV tiles, from the highest down.

    Returns (n_block_min, n_block_max, n_masked_right, n_unmasked): after the first tile
    (n_block_max - 1, always masked), n_masked_right tiles need the mask (the causal or window
    diagonal, the seqlen_k residue), then n_unmasked need none, then the rest down to
    n_block_min need it again (the left window edge). At least one tile is walked.
    """
    n_min, n_max = kv_block_range(m_block, tile_m, tile_n, seqlen_q, seqlen_k, causal, has_window_left,
                                  has_window_right, window_left, window_right)
    n_max = _max(n_max, 1)
    n_min = _min(n_min, n_max - 1)
    o = seqlen_k - seqlen_q
    # Tiles below unm_hi are unmasked on the right for every row of the tile (its first row's bound).
    unm_hi = seqlen_k // tile_n
    right = _right_offset(causal, has_window_right, window_right)
    if right is not None:
        unm_hi = _min(unm_hi, _max(m_block * tile_m + o + right + 1, 0) // tile_n)
    # Tiles from unm_lo up are unmasked on the left for every row (its last row's bound).
    unm_lo = n_min
    if has_window_left:
        unm_lo = _max(unm_lo, (_max((m_block + 1) * tile_m - 1 + o - window_left, 0) + tile_n - 1) // tile_n)
    total = n_max - 1 - n_min
    unm_hi = _min(unm_hi, n_max - 1)
    masked_right = _min(_max(n_max - 1 - unm_hi, 0), total)
    unmasked = _min(_max(unm_hi - unm_lo, 0), total - masked_right)
    return n_min, n_max, masked_right, unmasked


def pair_layout(offsets) -> bool:
    """Whether static offsets (python ints, element order) are the accumulator's column pairs
    0, 1, 8, 9, ...: then pair_count counts the elements below a bound. Checked at trace time;
    a layout that fails keeps the per-element compares."""
    return all(isinstance(o, int) and o == 8 * (i // 2) + i % 2 for i, o in enumerate(offsets))


def pair_count(limit):
    """How many of offsets 0, 1, 8, 9, 16, 17, ... are below ``limit`` (any number of pairs):
    2 per whole block of 8 below it, plus the part block's first one or two. Int32 or int."""
    if isinstance(limit, int):
        lim = max(limit, 0)
        return (lim // 8) * 2 + min(lim % 8, 2)
    lim = cutlass.max(limit, 0)
    return (lim >> 3) * 2 + cutlass.min(lim & 7, 2)


def query_row_run(row, seq_limit, shift, causal, has_window_left, has_window_right, window_left, window_right):
    """(lo, hi): a forward row keeps its elements [lo, hi) in element order (lo None: from the
    first). ``row`` is the row's query, ``seq_limit`` and ``shift`` seqlen_k and seqlen_k -
    seqlen_q less the thread's first key column: the bounds apply_mask compares with."""
    lo = pair_count(row + shift - window_left) if has_window_left else None
    return lo, pair_count(row_limit(row, seq_limit, shift, causal, has_window_right, window_right))


def row_limit(row, seq_limit, shift, causal, has_window_right, window_right):
    """The first key column (less the thread's first) a forward row no longer sees: seqlen_k, or
    with causal / a right window the diagonal's column + 1 + right, whichever comes first."""
    right = _right_offset(causal, has_window_right, window_right)
    if right is None:
        return seq_limit
    return _min(seq_limit, row + 1 + shift + right)


def key_row_run(key, key_limit, diag_hi, diag_lo, q_base, has_diag, has_window_left, ncol: int):
    """(lo, hi): a backward S^T row (key offset ``key`` from the thread's first key) keeps its query
    elements [lo, hi) (lo None: from the first): queries q >= key - diag_hi on the diagonal side
    (``has_diag``: causal or a right window), q <= key - diag_lo with a left window, none where
    key >= key_limit (past seqlen_k). ``q_base`` is the thread's first query."""
    whole = (ncol + BITS_PER_WORD - 1) // BITS_PER_WORD * BITS_PER_WORD
    # 0 or every element, without a branch: (key < key_limit) as 0/1, times a whole word count.
    hi = _min(_max(key_limit - key, 0), 1) * whole
    if has_window_left:
        hi = _min(hi, pair_count(key - diag_lo - q_base + 1))
    lo = pair_count(key - diag_hi - q_base) if has_diag else None
    return lo, hi


def _shift_b32(op: str, x, n, loc, ip) -> Uint32:
    # PTX shifts clamp the count at the register width (0xFFFFFFFF >> 32 is 0); an LLVM shift
    # by 32 would be poison, so the word for an empty or full chunk takes inline PTX.
    return Uint32(
        llvm.inline_asm(
            T.i32(), [Uint32(x).ir_value(loc=loc, ip=ip), Uint32(n).ir_value(loc=loc, ip=ip)],
            f"{op}.b32 $0, $1, $2;", "=r,r,r",
            has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


@dsl_user_op
def shr_b32(x, n, *, loc=None, ip=None) -> Uint32:
    return _shift_b32("shr", x, n, loc, ip)


@dsl_user_op
def shl_b32(x, n, *, loc=None, ip=None) -> Uint32:
    return _shift_b32("shl", x, n, loc, ip)


def keep_word(lo_count, hi_count, word: int):
    """Bits of word ``word`` (elements 32 word .. 32 word + 31) of a row that keeps elements
    [lo_count, hi_count): None for an unbounded side. Int32 in a kernel, int on the host (the
    CPU tests check it against the per-element compares)."""
    base = word * BITS_PER_WORD
    host = all(isinstance(x, int) for x in (lo_count, hi_count) if x is not None)
    if host:
        bits = _ONES
        if hi_count is not None:
            bits >>= min(max(base + BITS_PER_WORD - hi_count, 0), BITS_PER_WORD)
        if lo_count is not None:
            bits &= (_ONES << min(max(lo_count - base, 0), BITS_PER_WORD)) & _ONES
        return bits
    bits = Uint32(_ONES)
    if hi_count is not None:
        bits = shr_b32(bits, cutlass.max(base + BITS_PER_WORD - hi_count, 0))
    if lo_count is not None:
        bits = bits & shl_b32(Uint32(_ONES), cutlass.max(lo_count - base, 0))
    return bits


def rows_in_pairs(c0_mn, nrow: int, ncol: int) -> bool:
    """Whether every row of a thread's (nrow, ncol) element view has its columns in pairs."""
    return all(pair_layout([c0_mn[r, c][1] for c in range(ncol)]) for r in range(nrow))


@cute.jit
def mask_row_bits(
    s_mn: cute.Tensor,  # ((2, MMA_M), (2, V, MMA_N)) row/col view
    r: cutlass.Constexpr,  # the row to mask
    has_lo: cutlass.Constexpr,  # whether lo_count bounds the row (else it is ignored)
    lo_count: Int32,  # keep elements [lo_count, hi_count) of the row, in element order
    hi_count: Int32,
):
    ncol = cute.size(s_mn, mode=[1])
    for w in cutlass.range_constexpr((ncol + BITS_PER_WORD - 1) // BITS_PER_WORD):
        bits = keep_word(lo_count if has_lo else None, hi_count, w)
        # Unrolled with constant bit positions, or ptxas cannot form R2P.
        for i in cutlass.range_constexpr(min(BITS_PER_WORD, ncol - w * BITS_PER_WORD)):
            if (bits & Uint32(1 << i)) == Uint32(0):
                s_mn[r, w * BITS_PER_WORD + i] = -Float32.inf


@cute.jit
def apply_mask(
    s_mn: cute.Tensor,  # ((2, MMA_M), (2, V, MMA_N)) fp32 scores of one 64 x tile_n tile, row/col view
    c0_mn: cute.Tensor,  # same view of thread 0's (row, col) coordinates: static offsets
    row_base: Int32,  # global query row of this thread's first element
    col_base: Int32,  # global key column of this thread's first element
    seqlen_q: Int32,
    seqlen_k: Int32,
    causal: cutlass.Constexpr,
    has_window_left: cutlass.Constexpr = False,
    has_window_right: cutlass.Constexpr = False,
    window_left: Int32 = 0,
    window_right: Int32 = 0,
    bits: cutlass.Constexpr = False,
):
    """-inf at key >= seqlen_k and outside the causal / window band of each row.

    ``bits`` (the knob mask_bits): where a bound moves from row to row (causal, a window), each
    row's verdicts as bit words (pair_count, keep_word) instead of a compare per element. The
    seqlen_k residue alone is one bound for all rows, whose compares ptxas shares between them.
    """
    nrow = cute.size(s_mn, mode=[0])
    ncol = cute.size(s_mn, mode=[1])
    seq_limit = seqlen_k - col_base
    shift = seqlen_k - seqlen_q - col_base
    use_bits = cutlass.const_expr(bits and (causal or has_window_right or has_window_left)
                                  and rows_in_pairs(c0_mn, nrow, ncol))
    for r in cutlass.range_constexpr(nrow):
        row = row_base + c0_mn[r, 0][0]
        if cutlass.const_expr(use_bits):
            # The row's run of kept elements from the same bounds (row_limit), as bit words.
            lo, hi = query_row_run(row, seq_limit, shift, causal, has_window_left, has_window_right, window_left,
                                   window_right)
            mask_row_bits(s_mn, r, has_window_left, lo if has_window_left else hi, hi)
        else:
            limit = row_limit(row, seq_limit, shift, causal, has_window_right, window_right)
            if cutlass.const_expr(has_window_left):
                lo = row + shift - window_left
                for c in cutlass.range_constexpr(ncol):
                    col = c0_mn[r, c][1]
                    if (col >= limit) | (col < lo):
                        s_mn[r, c] = -Float32.inf
            else:
                for c in cutlass.range_constexpr(ncol):
                    if c0_mn[r, c][1] >= limit:
                        s_mn[r, c] = -Float32.inf


@cute.jit
def apply_key_limits(
    s_mn: cute.Tensor,  # ((2, MMA_M), (2, V, MMA_N)) fp32 scores, row/col view
    c0_mn: cute.Tensor,  # same view of thread 0's (row, col) coordinates: static offsets
    key_limit: cute.Tensor,  # (rows,) Int32: keys [0, limit) visible to each of the thread's rows
    col_base: Int32,  # global key column of this thread's first element
):
    """Mask by a per-row key count, for rows whose query position is not affine in the row index
    (the decode kernel's packed (head, token) rows)."""
    for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
        limit = key_limit[r] - col_base
        for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
            if c0_mn[r, c][1] >= limit:
                s_mn[r, c] = -Float32.inf


@cute.jit
def apply_mask_t(
    s_mn: cute.Tensor,  # ((2, MMA_M), (2, V, MMA_N)) fp32 S^T of the backward: rows keys, columns queries
    c0_mn: cute.Tensor,  # same view of thread 0's (key, query) coordinates: static offsets
    key_limit: Int32,  # seqlen_k less the thread's first key
    diag_hi: Int32,  # key row r of query q is visible iff diag_lo + q <= r <= diag_hi + q
    diag_lo: Int32,
    q_base: Int32,  # the thread's first query
    causal: cutlass.Constexpr,
    has_window_left: cutlass.Constexpr,
    has_window_right: cutlass.Constexpr,
    bits: cutlass.Constexpr = False,
):
    """-inf where key >= seqlen_k, (causal / window right) key > query + seqlen_k - seqlen_q
    + right, or (window left) key < query + seqlen_k - seqlen_q - left.

    The transpose of apply_mask (a column is one query, its bounds one register each, and a row
    offset is an immediate): one compare per element and bound; with ``bits`` (mask_bits) a key
    row keeps a run of its query columns (key_row_run) as bit words."""
    nrow = cute.size(s_mn, mode=[0])
    ncol = cute.size(s_mn, mode=[1])
    if cutlass.const_expr(bits and (causal or has_window_right or has_window_left)
                          and rows_in_pairs(c0_mn, nrow, ncol)):
        has_diag = causal or has_window_right
        for r in cutlass.range_constexpr(nrow):
            lo, hi = key_row_run(c0_mn[r, 0][0], key_limit, diag_hi, diag_lo, q_base, has_diag, has_window_left, ncol)
            mask_row_bits(s_mn, r, has_diag, lo if has_diag else hi, hi)
    else:
        for c in cutlass.range_constexpr(ncol):
            limit = key_limit
            q = q_base + c0_mn[0, c][1]
            if cutlass.const_expr(causal or has_window_right):
                limit = cutlass.min(limit, q + 1 + diag_hi)
            low = q + diag_lo  # first visible key row (has_window_left)
            for r in cutlass.range_constexpr(nrow):
                if c0_mn[r, 0][0] >= limit:
                    s_mn[r, c] = -Float32.inf
                if cutlass.const_expr(has_window_left):
                    if c0_mn[r, 0][0] < low:
                        s_mn[r, c] = -Float32.inf
