"""The backward's shifted query walks (knob q_starts, fa4.common.bwd_schedule.walk_tile) on the GPU
against PyTorch autograd in fp32 (bench/check_bwd.py: FlashAttention's error rule).

Every role of the kernel (the producer's loads, the consumers' steps, the dQ writer warps or the
consumers' own dQ adds) must visit the same tile at each step: a mismatch reads another tile's
Q, dO or row statistics, or adds dQ into another tile, and the gradients are wrong. Cases: each
head-dim layout (dkv_split 'keys' at 64/96/128, the queries-on-M tiling at 192 and 192/128, the
exchange of a cluster pair at 256, whose two CTAs must walk alike), odd seqlens and Sq != Sk
(partial last query tiles, ranges shorter than q_starts), causal with seqlen_q < seqlen_k (the
unmasked runs left of the diagonal shifted, the masked tiles in place), GQA 'atomic' and 'loop' (the
walk of each head of a group), the consumers' dQ reductions, fp16. Varlen:
tests/fa4/test_varlen_bwd_gpu.py.
"""

import pytest

pytestmark = pytest.mark.gpu

HDS = [64, 96, 128, 192, (192, 128), 256]
_ID = {64: "hd64", 96: "hd96", 128: "hd128", 192: "hd192", (192, 128): "hd192v128", 256: "hd256"}
SHAPES = [(2, 1000, 1000, 4, 4), (1, 333, 777, 8, 2), (1, 777, 333, 4, 1), (3, 65, 1, 2, 1), (1, 4100, 4100, 2, 2)]


def check_starts(check_bwd, shape, hd, starts, causal=False, fp16=False, **change):
    """The problem's default with q_starts ``starts`` and ``change`` (bench/check_bwd.py: with_knob)
    against fp32 autograd."""
    import torch

    cfg = check_bwd.with_knob(shape, hd, causal, False, "q_starts", starts, **change)
    ok, info = check_bwd.check_case(*shape, hd, causal, torch.float16 if fp16 else torch.bfloat16, cfg)
    assert ok, info


@pytest.mark.parametrize("hd", HDS, ids=_ID.get)
@pytest.mark.parametrize("starts", [4, 64])
@pytest.mark.parametrize("shape", SHAPES)
def test_shifted_walks_match_reference(check_bwd, hd, starts, shape):
    check_starts(check_bwd, shape, hd, starts)


LEFT_SHAPES = [(1, 333, 777, 8, 2), (2, 1000, 4100, 4, 4), (1, 65, 1000, 2, 1)]


@pytest.mark.parametrize("hd", HDS, ids=_ID.get)
@pytest.mark.parametrize("starts", [4, 64])
@pytest.mark.parametrize("shape", LEFT_SHAPES)
def test_shifted_runs_left_of_the_diagonal(check_bwd, hd, starts, shape):
    """Causal, seqlen_q < seqlen_k: the key tiles left of the diagonal walk every query tile unmasked
    (their runs shifted), the others a masked diagonal first (in place) and a shorter run."""
    check_starts(check_bwd, shape, hd, starts, causal=True)


# The other dQ paths and walks: the consumers' reductions (hd64 at tile_m 64), GQA 'loop' (each
# head of the group from its shifted start), the keys-on-M split at 192 and 256 without the pair.
CHANGES = [
    (64, dict(tile_m=64, dq_split="head_dim", stat_shuffle=False, dq_accum="red_v2")),
    (64, dict(tile_m=64, dq_split="head_dim", stat_shuffle=False, dq_accum="red")),
    (128, dict(gqa_reduce="loop")),
    (192, dict(qm_tile_n=0, do_single=False, dk_before_dq=False, stages=2, ds_stages=2)),
    (256, dict(cluster_exchange=False)),
    (256, dict(qm_tile_n=48, cluster_exchange=False, stages=2, do_single=True, ds_stages=1, dq_accum="bulk",
               ds_store="sts", dk_before_dq=False)),
]


@pytest.mark.parametrize("hd,change", CHANGES)
@pytest.mark.parametrize("starts", [4, 16])
@pytest.mark.parametrize("causal", [False, True])
def test_shifted_walks_beside_other_paths(check_bwd, hd, change, starts, causal):
    check_starts(check_bwd, (1, 1000, 1000 if not causal else 2500, 8, 2), hd, starts, causal=causal, **change)


@pytest.mark.parametrize("hd", [128, 256], ids=_ID.get)
def test_shifted_walks_fp16(check_bwd, hd):
    check_starts(check_bwd, (1, 777, 1333, 8, 2), hd, 16, fp16=True)
