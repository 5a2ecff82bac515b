"""fa4.flash_attn_func shows its arguments (help(), IDEs, inspect) and importing fa4 stays light."""

import inspect
import subprocess
import sys


def test_flash_attn_func_has_its_real_signature():
    import fa4

    params = list(inspect.signature(fa4.flash_attn_func).parameters)
    assert params[:3] == ["q", "k", "v"]
    assert {"softmax_scale", "causal", "return_lse", "config", "out", "deterministic", "bwd_config"} <= set(params)
    assert "Exact attention" in inspect.getdoc(fa4.flash_attn_func)


def test_importing_fa4_loads_neither_torch_nor_the_upper_layers():
    code = ("import sys, fa4, fa4.knobs, fa4.problem, fa4.lookup; "
            "print(sorted(m for m in ('torch', 'store', 'providers', 'tuner', 'service') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
