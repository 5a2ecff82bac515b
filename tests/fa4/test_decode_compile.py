"""Compile-only checks of the decode and combine kernels (no GPU: sm_90a, fake tensors).

A sample of the feasible space: every tile_n at each head dim (64, 96, 128, 192, 256), each at its deepest
feasible ring and at 2 stages, with the kernel-shaping flags (causal, paged, cache_seqlens
given, split, LSE written) rotated over the sample so that every value of each appears at both
head dims. Each kernel must contain WGMMA and the TMA loads of the K/V tiles, load Q with
16-byte vectors, not spill, and not have its WGMMAs serialized by ptxas. The combine kernel is
compiled for each (dtype, head_dim, LSE written, PDL) and must not spill either; the fused and
PDL decode variants are compiled at both head dims.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from fa4.decode_problem import DecodeProblem
from fa4.sm90.decode_compile import CombineKernelKey, compile_combine, compile_decode, compile_key
from fa4.sm90.decode_config import HEAD_DIMS, DecodeConfigSm90, default_config, violations
from tests.fa4.codegen_asserts import assert_no_spills, compile_and_read

STAGES = DecodeConfigSm90.__dataclass_fields__["kv_stages"].metadata["fa4_knob"]["choices"]
TILES = DecodeConfigSm90.__dataclass_fields__["tile_n"].metadata["fa4_knob"]["choices"]
# (causal, paged, has_seqlens, split, has_lse): rotated over the sample.
FLAGS = [
    (False, True, True, True, True),
    (True, True, True, False, True),
    (True, False, True, True, False),
    (False, False, False, False, False),
    (True, True, False, True, True),
    (False, True, True, False, False),
    (True, False, False, False, True),
    (False, True, False, True, False),
]


def partial_o_loads(hd: int) -> tuple[str, int]:
    """(opcode, count) of a combining lane's partial-O loads, 16 splits in flight: its head_dim / 32
    fp32 columns in the widest vector they fill (hd96's 12 bytes: 3 scalar loads a split)."""
    nbytes = hd // 32 * 4
    for op, width in (("LDG.E.128", 16), ("LDG.E.64", 8)):
        if nbytes % width == 0:
            return op, 16 * nbytes // width
    return "LDG.E", 16 * hd // 32


def sample():
    out = []
    flags = itertools.cycle(FLAGS)
    for hd in HEAD_DIMS:
        prob = DecodeProblem(batch=1, seqlen_q=1, seqlen_k=32768, heads_q=32, heads_kv=8, head_dim=hd,
                             page_size=256)
        for tn in TILES:
            feasible = [s for s in STAGES if not violations(DecodeConfigSm90(tile_n=tn, kv_stages=s), prob)]
            if not feasible:  # hd256 x 128 keys: O, S and P over the register budget
                continue
            for stages in sorted({feasible[0], feasible[-1]}):
                out.append((hd, DecodeConfigSm90(tile_n=tn, kv_stages=stages), next(flags)))
    return out


def test_sample_covers_every_flag_value_and_knob_value():
    s = sample()
    for i in range(len(FLAGS[0])):
        for hd in HEAD_DIMS:
            assert {f[i] for d, _, f in s if d == hd} == {False, True}, (i, hd)
    assert {c.tile_n for _, c, _ in s} == set(TILES)
    assert len({c.kv_stages for _, c, _ in s}) >= 4


@pytest.mark.parametrize(
    "hd,config,flags", sample(),
    ids=[f"hd{hd}-n{c.tile_n}-s{c.kv_stages}-" + "".join("cpsxl"[i] if f else "_" for i, f in enumerate(fl))
         for hd, c, fl in sample()],
)
def test_decode_codegen(hd, config, flags):
    causal, paged, has_seqlens, split, has_lse = flags
    key = compile_key("bf16", hd, causal, paged, has_seqlens, split, has_lse, config)
    ptx, cubin, ops = compile_and_read(compile_decode, key, ["UTMALDG.4D", "LDG.E.128"])
    assert_no_spills(ptx, cubin, ops)
    assert ops["UTMALDG.4D"] >= 2 and ops["UTMALDG.4D"] % 2 == 0, ops  # K and V boxes, in pairs
    assert ops["LDG.E.128"] == 64 * hd // 8 // 128, ops  # the Q tile in 16-byte chunks


@pytest.mark.parametrize("hd,combine,flags", [
    (128, "fused", (False, True, True, True, True)),
    (64, "fused", (True, False, False, True, False)),
    (128, "pdl", (True, True, True, True, False)),
    (64, "pdl", (False, True, False, True, True)),
    (96, "fused", (False, True, True, True, True)),
    (256, "fused", (True, True, False, True, False)),
    (192, "pdl", (False, False, True, True, True)),
])
def test_decode_codegen_combine_variants(hd, combine, flags):
    """Fused: the ticket (one acq_rel atomic add after a gpu fence) and the in-CTA combine's partial-O
    loads, 16 in flight per lane (vector loads); pdl: the decode kernel triggers its dependents."""
    causal, paged, has_seqlens, split, has_lse = flags
    prob = DecodeProblem(batch=1, seqlen_q=1, seqlen_k=32768, heads_q=32, heads_kv=8, head_dim=hd, page_size=256)
    config = dataclasses.replace(default_config(prob), combine=combine)
    key = compile_key("bf16", hd, causal, paged, has_seqlens, split, has_lse, config)
    assert key.has_lse == has_lse if combine == "fused" else not key.has_lse
    vec, n_vec = partial_o_loads(hd)
    ptx, cubin, ops = compile_and_read(compile_decode, key, ["UTMALDG.4D", "LDG.E.128", "LDG.E.64", "LDG.E", "ATOMG",
                                                            "MEMBAR.ALL.GPU", "MUFU.EX2"])
    assert_no_spills(ptx, cubin, ops)
    assert ops["UTMALDG.4D"] >= 2 and ops["UTMALDG.4D"] % 2 == 0, ops
    q_loads = 64 * hd // 8 // 128
    if combine == "fused":
        assert ops["ATOMG"] == 1 and ops["MEMBAR.ALL.GPU"] >= 1, ops
        assert "atom.global.acq_rel.add" in ptx and "fence.acq_rel.gpu" in ptx
        want = n_vec + (q_loads if vec == "LDG.E.128" else 0)
        # Scalar LDG.E also counts the LSE and ticket-side loads: at least the partials'.
        assert ops[vec] == want if vec != "LDG.E" else ops[vec] >= want, ops
    else:
        assert ops["ATOMG"] == 0 and ops["LDG.E.128"] == q_loads, ops
        assert "griddepcontrol.launch_dependents" in ptx


def test_unsplit_kernels_ignore_the_combine_knob():
    keys = {compile_key("bf16", 128, True, True, True, False, True, DecodeConfigSm90(combine=c))
            for c in ("kernel", "pdl", "fused")}
    assert len(keys) == 1
    split = {compile_key("bf16", 128, True, True, True, True, True, DecodeConfigSm90(combine=c))
             for c in ("kernel", "pdl", "fused")}
    assert len(split) == 3


def test_decode_codegen_fp16():
    key = compile_key("fp16", 128, True, True, True, True, True, DecodeConfigSm90())
    ptx, cubin, ops = compile_and_read(compile_decode, key, [])
    assert_no_spills(ptx, cubin, ops)


@pytest.mark.parametrize("dtype,hd,has_lse,pdl", [("bf16", 128, True, False), ("bf16", 64, False, True),
                                                  ("fp16", 128, False, True), ("fp16", 64, True, False),
                                                  ("bf16", 96, True, False), ("bf16", 192, False, True),
                                                  ("fp16", 256, True, False)])
def test_combine_codegen(dtype, hd, has_lse, pdl):
    from fa4.common import codegen_check as cc

    vec, n_vec = partial_o_loads(hd)
    ptx, cubin, ops = compile_and_read(compile_combine, CombineKernelKey(dtype, hd, has_lse, pdl),
                                       ["MUFU.EX2", vec, "ACQBULK"])
    assert ops["LDL"] == 0 and ops["STL"] == 0, ops
    assert ops["MUFU.EX2"] >= 1
    # A group of 16 splits' partial O in flight per lane (scalar LDG.E also counts the LSE loads).
    assert ops[vec] == n_vec if vec != "LDG.E" else ops[vec] >= n_vec, ops
    assert ops["ACQBULK"] == (1 if pdl else 0), ops  # griddepcontrol.wait
    assert all(not k.frame_bytes for k in cc.cubin_resources(cubin).values())
    per, _ = cc.ptxas_verbose(ptx)
    assert all(not k.spill_store_bytes for k in per.values())
