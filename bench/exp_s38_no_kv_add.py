"""Session 38, temporary (run on the device's copy only): the GQA 'postprocess' dK/dV adds skipped at
run time (a branch on a value no accumulator holds keeps the GEMMs and the code), so the main kernel's
time without them bounds what a cheaper add (bulk reductions from shared memory, as the dQ path
does) could gain. Gradients are wrong under it; kernel_split does not check them."""
from pathlib import Path

p = Path(__file__).resolve().parents[1] / "fa4/sm90/bwd_epilogue.py"
src = p.read_text()
old = """        else:
            self.red_tile(acc_as_rows_cols(acc_dK), acc_as_rows_cols(dkv_thr.partition_C(gdK)), self.kv_v2,
                          store=store)
            self.red_tile(acc_as_rows_cols(acc_dV), acc_as_rows_cols(dv_thr.partition_C(gdV)), self.kv_v2,
                          store=store)
"""
new = """        else:
            if acc_dK[0] + acc_dV[0] == cutlass.Float32(1.0e38):
                self.red_tile(acc_as_rows_cols(acc_dK), acc_as_rows_cols(dkv_thr.partition_C(gdK)), self.kv_v2,
                              store=store)
                self.red_tile(acc_as_rows_cols(acc_dV), acc_as_rows_cols(dv_thr.partition_C(gdV)), self.kv_v2,
                              store=store)
"""
assert src.count(old) == 1
p.write_text(src.replace(old, new))
print("patched", p)
