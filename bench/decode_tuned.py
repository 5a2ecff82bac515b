"""Decode steps with the config the launch-time lookup serves from a tuned results DB vs the split
heuristic (and the reference FA4), one process.

Run after ``fa4-tune --decode ... --db URL`` (bench/device_s9_dectune.sh does both), or with
``--service URL`` after ``fa4-tune --decode ... --push URL`` (bench/device_s10_svcdecode.sh): the
configs then come from the tuning service (fleet mode, the local DB skipped). Per shape (one
token, pages of 256, GQA 32/8, hd128, bf16, every sequence at the full KV length): the lookup's
explanation (where the config came from, which split count), then fa4.flash_attn_with_kvcache
timed with no config (the lookup's answer, what a serving engine's call gets) and with the
kernel's default config (num_splits=0: the heuristic), interleaved over rounds (triton do_bench
median, L2 flushed), TB/s of K+V read. The two outputs are compared (both are checked against
fp32 by the study and the GPU tests). One "BENCH {json}" line per shape, then a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

import fa4
from fa4 import decode as fa4_decode
from fa4 import lookup
from fa4.arch import SM90
from fa4.decode_problem import DecodeProblem
from fa4.sm90.decode_config import default_config, num_splits_auto, rows_per_cta_head

PAGE, HQ, HKV, D = 256, 32, 8, 128


def bench_ms(fn) -> float:
    import triton.testing as tt

    fn()
    return tt.do_bench(fn, warmup=25, rep=100, return_mode="median")


def ensure_local_db_source() -> None:
    """The local results DB as a config source even where fa4-tune's entry point is not installed."""
    if not any(getattr(s, "name", "") == "local-db" for s in lookup._sources()):
        from store.config_source import LocalResultsDB

        lookup.register_source(LocalResultsDB())
        lookup.reset()


def main() -> None:
    ap = argparse.ArgumentParser()
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--db", help="the tuned results DB (SQLAlchemy URL)")
    src.add_argument("--service", help="the tuning service the results were pushed to (FA4_TUNING_URL)")
    ap.add_argument("--batch", default="1,4")
    ap.add_argument("--kv", default="8192,32768")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    if a.service:
        # Fleet mode: no local DB, every decode config from GET /v1/configs/best-decode.
        os.environ["FA4_TUNING_URL"] = a.service
        os.environ["FA4_LOOKUP_LOCAL_DB"] = "0"
        os.environ.setdefault("FA4_TUNING_TIMEOUT_S", "10")
        lookup.reset()
    else:
        os.environ["FA4_DB"] = a.db
        ensure_local_db_source()
    try:
        from flash_attn.cute import flash_attn_varlen_func as ref
    except Exception as e:  # noqa: BLE001
        print("reference FA4 unavailable:", e)
        ref = None
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for b in (int(x) for x in a.batch.split(",")):
        for kv in (int(x) for x in a.kv.split(",")):
            prob = DecodeProblem(batch=b, seqlen_q=1, seqlen_k=kv, heads_q=HQ, heads_kv=HKV, head_dim=D, page_size=PAGE)
            why = lookup.explain_problem(prob, SM90)
            print(f"== {prob.key()}\n{why}")
            pages = kv // PAGE
            k = torch.randn(b * pages, PAGE, HKV, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            table = torch.randperm(b * pages, device="cuda", dtype=torch.int32).view(b, pages)
            seqlens = torch.full((b,), kv, device="cuda", dtype=torch.int32)
            q = torch.randn(b, 1, HQ, D, device="cuda", dtype=torch.bfloat16)
            heur = default_config(prob)

            def served():
                return fa4.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, page_table=table)

            def heuristic():
                return fa4.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, page_table=table, config=heur)

            fns = {"served": served, "heuristic": heuristic}
            if ref is not None:
                fns["reference"] = lambda: ref(q, k, v, page_table=table, seqused_k=seqlens)
            diff = (served().float() - heuristic().float()).abs().max().item()
            plan = next(p for p in fa4_decode._plans.values() if p.problem == prob and p.config == why.config)
            ms = {n: [] for n in fns}
            for _ in range(a.rounds):
                for n, fn in fns.items():
                    ms[n].append(bench_ms(fn))
            med = {n: statistics.median(x) for n, x in ms.items()}
            tbs = {n: prob.kv_bytes / (t * 1e-3) / 1e12 for n, t in med.items()}
            ratios = [s / h for s, h in zip(ms["heuristic"], ms["served"])]
            row = {"batch": b, "kv": kv, "provenance": why.provenance, "served_splits": plan.num_splits,
                   "served_config": {k_: getattr(why.config, k_) for k_ in ("num_splits", "pack_gqa", "tile_n",
                                                                            "kv_stages")},
                   "heuristic_splits": num_splits_auto(b, HKV, rows_per_cta_head(prob, True), kv, sms, heur.tile_n),
                   "tbs": {n: round(x, 3) for n, x in tbs.items()},
                   "served_over_heuristic": round(tbs["served"] / tbs["heuristic"], 3),
                   "ratio_rounds": [round(r, 3) for r in ratios], "max_abs_diff": diff}
            if "reference" in tbs:
                row["served_over_reference"] = round(tbs["served"] / tbs["reference"], 2)
            rows.append(row)
            print("BENCH " + json.dumps(row), flush=True)
    print("\nbatch  kv      from      splits(served/heur)  served TB/s  heuristic TB/s  ratio")
    for r in rows:
        print(f"{r['batch']:<6} {r['kv']:<7} {r['provenance']:<9} {r['served_splits']:>3} / {r['heuristic_splits']:<14}"
              f" {r['tbs']['served']:>8.3f}  {r['tbs']['heuristic']:>13.3f}  {r['served_over_heuristic']:>6.3f}")
    won = [r for r in rows if r["served_over_heuristic"] >= 1.03]
    print(f"tuned beats the heuristic by >= 3% on {len(won)} of {len(rows)} shapes")


if __name__ == "__main__":
    main()
