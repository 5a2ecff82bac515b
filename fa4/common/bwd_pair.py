"""The 2-CTA dS exchange of the backward (knob cluster_exchange): who reduces which dQ terms.

A cluster of two CTAs owns the key tiles 2p and 2p+1 (tile_n 64 each, dkv_split 'head_dim') of
one (head, batch). Both walk the query tiles of the pair's 128 keys in the same order, in
lockstep: each computes S^T, dP^T, dV and dK for its own key tile as without the exchange,
copies its dS tile (tile_m x 64) into its peer's shared memory, and then CTA r computes

    dQ[m][:, cols_r] = dS_own K_own[:, cols_r] + dS_peer K_peer[:, cols_r]   (cols_r = [r d/2, (r+1) d/2))

(own key tile first; a column has one owner, so the sum's order is fixed run to run), and adds
only those columns into the fp32 accumulator:
tile_m * d/2 * 4 bytes per step instead of tile_m * d * 4. Why columns and not the query rows the
upstream (sm100) form splits: at tile_m 64 half the rows is 32, under the WGMMA's M of 64, and
tile_m 128 does not fit the consumers' registers at head_dim 192/256.

The odd tail: with an odd number of key tiles the last pair's CTA 1 owns keys at or past
seqlen_k only. It still runs (its peer needs its dS, which its mask makes all zero: every key
row >= seqlen_k) and still reduces its columns of dQ for the pair's real key tile, so every
visible (query, key) term is reduced exactly once. The pair's query range is the one of its
128 keys: m_block_segments of a 128-row tile, a superset of each half's, the rest masked.

Branch-free integer arithmetic, as fa4.common.bwd_schedule: the kernel traces these on Int32,
the CPU tests run them on ints against a brute-force scan (tests/fa4/test_bwd_pair.py).
"""

from fa4.common.bwd_schedule import m_block_segments

PAIR = 2  # CTAs per cluster, on the key-tile axis
TILE_N = 64  # keys per CTA (dkv_split 'head_dim')


def num_pairs(num_n):
    """Clusters per (head, batch) for num_n key tiles (the odd tail pairs with an empty tile)."""
    return (num_n + PAIR - 1) // PAIR


def n_block_of(pair, rank):
    """The key tile of CTA ``rank`` (its rank in the cluster) of cluster ``pair``."""
    return pair * PAIR + rank


def pair_segments(pair, tile_m: int, seqlen_q, seqlen_k, causal: bool):
    """(m_start, m_masked_end, m_unmasked_end, m_end) shared by both CTAs of the pair: those of
    the pair's 128 keys, so the two walk the same query tiles (the masks are per CTA)."""
    return m_block_segments(pair, tile_m, PAIR * TILE_N, seqlen_q, seqlen_k, causal)


def dq_columns(rank, head_dim: int):
    """[lo, hi): the dQ columns CTA ``rank`` computes and reduces (over both key tiles)."""
    half = head_dim // PAIR
    return rank * half, rank * half + half


def dq_key_tiles(pair, rank):
    """The key tiles of CTA ``rank``'s dQ reduction, in its order: its own, then its peer's."""
    return n_block_of(pair, rank), n_block_of(pair, 1 - rank)


def dq_bytes_per_step(tile_m: int, head_dim: int, cluster: bool) -> int:
    """fp32 bytes a CTA adds into the dQ accumulator per mainloop step."""
    cols = head_dim // PAIR if cluster else head_dim
    return tile_m * cols * 4
