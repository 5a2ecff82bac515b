"""A short first look at the backward on the GPU: default configs on two odd shapes.

    python bench/smoke_bwd.py      (the full grid and timings: bench/check_bwd.py)
"""

import importlib.util
import json
from pathlib import Path

import torch

spec = importlib.util.spec_from_file_location("check_bwd", Path(__file__).with_name("check_bwd.py"))
cb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cb)

from fa4.problem import Problem  # noqa: E402
from fa4.sm90.bwd_defaults import default_config  # noqa: E402

for D, causal, det in ((128, False, False), (64, True, False), (128, True, True)):
    cfg = default_config(Problem.standard(1024, D, causal=causal, deterministic=det, pass_="bwd"))
    try:
        ok, info = cb.check_case(1, 777, 1000, 8, 2, D, causal, torch.bfloat16, cfg)
    except Exception as e:  # noqa: BLE001
        ok, info = False, {"exception": f"{type(e).__name__}: {e}"[:400]}
    print("SMOKE", "PASS" if ok else "FAIL", json.dumps(dict(D=D, causal=causal, det=det, **info), default=str), flush=True)
