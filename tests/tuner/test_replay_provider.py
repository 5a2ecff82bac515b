"""The replay provider serves exactly what was recorded, and says why when it cannot."""

import json

import pytest

from fa4.arch import SM90
from fa4.knobs import config_to_dict
from fa4.problem import Problem
from tests.tuner.synthetic import COMPILE_ERROR_CFG, synthetic_recording, write_synthetic
from providers.harness import Settings
from providers import ProviderError, get_provider
from providers.flash_attn4 import RefFa4FwdKnobs
from providers.replay import ReplayProvider

PROBLEM = Problem.standard(8192, 128)


def test_serves_recorded_measurements(tmp_path):
    path = write_synthetic(tmp_path / "r.json", [PROBLEM])
    p = get_provider(f"replay:{path}")
    assert p.available() is None and p.needs_gpu is False
    assert p.knob_cls_for(PROBLEM) is RefFa4FwdKnobs
    assert p.knob_cls_for(Problem.standard(8192, 128, pass_="bwd")) is None
    recorded = {json.dumps(r["config"], sort_keys=True): r for r in synthetic_recording(PROBLEM)["results"]}
    for cfg in (RefFa4FwdKnobs(128, 160, True, True), COMPILE_ERROR_CFG):
        m = p.measure(PROBLEM, cfg, Settings())
        r = recorded[json.dumps(config_to_dict(cfg), sort_keys=True)]
        assert (m.status, m.reason, m.samples_ms, m.median_ms, m.tflops) == (
            r["status"], r["reason"], r["samples_ms"], r["median_ms"], r["tflops"])
    assert p.default_config(PROBLEM, SM90) == RefFa4FwdKnobs(128, 128, True, True)
    assert p.device_info()["name"].startswith("replay of ")
    assert p.arch() == SM90
    assert p.versions()["replay"] == "r.json"
    # The fingerprint is the recording's content: the same file, the same one; another file, another.
    fp = p.source_fingerprint()
    assert fp == ReplayProvider(path).source_fingerprint() and len(fp) == 16
    other = write_synthetic(tmp_path / "r2.json", [PROBLEM, Problem.standard(1024, 64)])
    assert ReplayProvider(other).source_fingerprint() != fp


def test_missing_config_is_a_runtime_error_not_a_guess(tmp_path):
    data = synthetic_recording(PROBLEM)
    data["results"] = [r for r in data["results"] if r["config"]["tile_n"] != 144]
    path = tmp_path / "partial.json"
    from providers.replay import recording_dict
    from tests.tuner.synthetic import SYNTHETIC_DEVICE

    path.write_text(json.dumps(recording_dict("flash-attn-4", SYNTHETIC_DEVICE, {}, {}, [data], date="x")))
    m = ReplayProvider(path).measure(PROBLEM, RefFa4FwdKnobs(128, 144, True, True), Settings())
    assert m.status == "runtime_error" and "no recorded measurement" in m.reason


def test_unavailable_recording_says_why(tmp_path):
    p = ReplayProvider(tmp_path / "absent.json")
    assert "no recording at" in p.available()
    assert p.problem_errors(PROBLEM) == [p.available()]
    with pytest.raises(ProviderError):
        p.recording
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something else"}))
    assert "not a recording" in ReplayProvider(bad).available()


def test_no_config_means_the_providers_default_not_the_field_defaults(tmp_path):
    # bench_fwd.py asks the worker for "no config" (None): that must be the config a user gets
    # (the provider's default), never the knob dataclass built from an empty dict. The fa4 forward's
    # heuristic default at hd64 (192x128) differs from its field defaults (128x128): the bug that
    # made bench_fwd.py time a 20%-slower kernel than check_fwd.py.
    from tuner.worker import InProcessRunner

    fa4p = get_provider("fa4")
    hd64 = Problem.standard(8192, 64)
    assert fa4p.config_from_dict(hd64, None) is None
    assert fa4p.default_config(hd64, SM90) != fa4p.config_from_dict(hd64, {})
    path = write_synthetic(tmp_path / "r.json", [PROBLEM])
    p = get_provider(f"replay:{path}")
    m_none = InProcessRunner().run(f"replay:{path}", PROBLEM, None, Settings())
    m_default = p.measure(PROBLEM, p.default_config(PROBLEM, SM90), Settings())
    assert m_none.status == "ok" and (m_none.median_ms, m_none.tflops) == (m_default.median_ms, m_default.tflops)
