"""Serve measurements recorded on a GPU, so the tuner's full logic runs on a CPU machine.

A recording (written by bench/sweep_ref_fa4.py) holds, per problem, one entry per config
of the recorded provider's search space: its status, timing samples, median, IQR, TFLOP/s
and error. The replay provider has the recorded provider's knobs and feasibility rules and
answers a measurement by looking it up; it never touches a GPU.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from fa4.arch import Arch, arch_from_capability
from fa4.decode_problem import problem_from_dict
from fa4.problem import Problem

from .base import Provider, ProviderError

DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_RECORDING = DATA_DIR / "ref_fa4_h200.json"
FORMAT = "fa4-tune recording v1"


def problem_id(problem: Problem) -> str:
    return problem.key()


def config_id(config_dict: dict | None) -> str:
    return json.dumps(config_dict or {}, sort_keys=True)


class Recording:
    def __init__(self, path: Path):
        self.path = Path(path)
        data = json.loads(self.path.read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"{self.path}: not a recording ({FORMAT!r} expected)")
        self.data = data
        self.provider_name: str = data["provider"]
        # "full" (the default): every config of the provider's space was recorded, so an absent one
        # is a failure. "recorded": a sweep of some knobs only; the recorded configs are the space.
        self.space: str = data.get("space", "full")
        self.device: dict = data["device"]
        self.entries: dict[str, dict] = {}
        for entry in data["problems"]:
            p = problem_from_dict(entry["problem"])
            results = {config_id(r["config"]): r for r in entry["results"]}
            self.entries[problem_id(p)] = {"problem": p, "default": entry.get("default"), "results": results}

    @property
    def problems(self) -> list[Problem]:
        return [e["problem"] for e in self.entries.values()]

    def arch(self) -> Arch:
        major, minor = (int(x) for x in str(self.device["compute_capability"]).split("."))
        return arch_from_capability(major, minor)

    def fingerprint(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()[:16]


class ReplayProvider(Provider):
    name = "replay"
    needs_gpu = False

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else DEFAULT_RECORDING
        self._rec: Recording | None = None
        self._error: str | None = None
        try:
            self._rec = Recording(self.path)
        except FileNotFoundError:
            self._error = f"no recording at {self.path} (record one with bench/sweep_ref_fa4.py on a GPU)"
        except Exception as e:
            self._error = f"cannot read recording {self.path}: {e}"
        if self._rec is not None:
            from . import get_provider

            self.recorded = get_provider(self._rec.provider_name)
            self.knob_cls = self.recorded.knob_cls
            self.passes = self.recorded.passes

    @property
    def recording(self) -> Recording:
        if self._rec is None:
            raise ProviderError(self._error or "no recording")
        return self._rec

    def available(self) -> str | None:
        return self._error

    def knob_cls_for(self, problem: Problem):
        return self.recorded.knob_cls_for(problem)

    def problem_errors(self, problem: Problem) -> list[str]:
        if self._rec is None:
            return [self._error]
        if problem_id(problem) not in self._rec.entries:
            known = "; ".join(p.key() for p in self._rec.problems)
            return [f"the recording {self.path.name} has no problem {problem.key()} (it has: {known})"]
        return []

    def arch(self) -> Arch:
        return self.recording.arch()

    def device_info(self) -> dict:
        """The recorded device, renamed so replayed rows never mix with real ones."""
        info = dict(self.recording.device)
        info["name"] = f"replay of {info['name']}"
        return info

    def violations(self, config, problem: Problem, arch: Arch) -> list[str]:
        return self.recorded.violations(config, problem, arch)

    def feasible_configs(self, problem: Problem, arch: Arch) -> list:
        if self.recording.space != "recorded":
            return super().feasible_configs(problem, arch)
        entry = self.recording.entries.get(problem_id(problem))
        configs = [self.config_from_dict(problem, r["config"]) for r in (entry or {}).get("results", {}).values()]
        return [c for c in configs if not self.violations(c, problem, arch)]

    def default_config(self, problem: Problem, arch: Arch):
        entry = self.recording.entries.get(problem_id(problem))
        if entry is not None and entry["default"] is not None:
            return self.config_from_dict(problem, entry["default"])
        return self.recorded.default_config(problem, arch)

    def lookup(self, problem: Problem, config) -> dict | None:
        entry = self.recording.entries.get(problem_id(problem))
        if entry is None:
            return None
        if config is None:  # no config given: the recorded provider's own default
            config = self.config_from_dict(problem, entry["default"])
        return entry["results"].get(config_id(self.config_to_dict(config)))

    def measure(self, problem: Problem, config, settings):
        from providers.harness import RUNTIME_ERROR, Measurement

        r = self.lookup(problem, config)
        if r is None:
            return Measurement(RUNTIME_ERROR, reason="no recorded measurement for this config")
        fields = ("status", "reason", "samples_ms", "median_ms", "iqr_ms", "tflops", "error", "ref_error")
        return Measurement(**{k: r.get(k) if k != "samples_ms" else list(r.get(k) or []) for k in fields})

    def source_fingerprint(self) -> str:
        return self.recording.fingerprint()

    def versions(self) -> dict:
        v = dict(self.recording.data.get("versions", {}))
        v["replay"] = self.path.name
        return v

    def describe(self, config) -> str:
        if self._rec is None:
            return super().describe(config)
        return self.recorded.describe(config)


def recording_dict(provider: str, device: dict, versions: dict, settings: dict, problems: list[dict],
                   date: str, note: str = "", space: str = "full") -> dict:
    """A recording in the format the replay provider reads.

    ``problems``: [{"problem": Problem.to_dict(), "default": config dict,
    "results": [{"config": dict, "status": ..., "reason": ..., "samples_ms": [...], "median_ms": ...,
    "iqr_ms": ..., "tflops": ..., "error": ..., "ref_error": ...}, ...]}, ...]
    """
    return {
        "format": FORMAT,
        "provider": provider,
        "device": device,
        "date": date,
        "versions": versions,
        "settings": settings,
        "note": note,
        "space": space,
        "problems": problems,
    }
