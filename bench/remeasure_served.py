"""A fresh re-measurement of what the tuner serves against the default, per study of a results DB.

    python3 bench/remeasure_served.py --db sqlite:///table.db [--rounds 5]

For every problem with a verdict on this GPU: the served config and the provider's default,
interleaved in one measuring process over ``--rounds`` rounds (tuner.verify.remeasure, fresh
inputs each round), printed as served/default with the spread. A served config slower than
the default here would be a tuner bug; where the default is served the line says so.
"""

from __future__ import annotations

import argparse
import json


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--provider", default="fa4")
    a = ap.parse_args()

    from fa4.arch import current_arch
    from fa4.knobs import config_to_dict
    from fa4.problem import Problem
    from providers import get_provider
    from providers.harness import Settings
    from store import ResultsStore
    from tuner.device import cuda_device_info
    from tuner.verify import judge, remeasure
    from tuner.worker import IsolatedRunner

    prov = get_provider(a.provider)
    device = cuda_device_info(prov.versions())["name"]
    arch = current_arch()
    runner = IsolatedRunner()
    worse = 0
    try:
        with ResultsStore.open(a.db) as store:
            problems = {json.dumps(r["problem"], sort_keys=True): Problem.from_dict(r["problem"])
                        for r in store.measurements(provider=a.provider, device=device, status="ok")}
            for p in problems.values():
                v = store.verdict(device, a.provider, p)
                if v is None:
                    continue
                default = config_to_dict(prov.default_config(p, arch))
                served = v["measurement"]["config"]
                if served == default:
                    print(f"{p.key()}: the default is served (verdict {v['gain'] * 100:+.1f}% ± "
                          f"{v['spread'] * 100:.1f}%)", flush=True)
                    continue
                tflops, _, failed = remeasure(runner, a.provider, p, [default, served], Settings(), a.rounds)
                j = judge(tflops, failed)
                slower = j.gains[1] < 0 and abs(j.gains[1]) > j.spreads[1]
                worse += slower
                print(f"{p.key()}: served/default {1 + j.gains[1]:.3f} ({j.describe(1)}, {a.rounds} rounds)"
                      + ("  SLOWER THAN THE DEFAULT" if slower else ""), flush=True)
    finally:
        runner.close()
    print(f"served configs slower than the default beyond the spread: {worse}")
    return 1 if worse else 0


if __name__ == "__main__":
    raise SystemExit(main())
