"""The distribution: name, packages, data files, console scripts; and CI's command."""

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_distribution_metadata():
    proj = _pyproject()["project"]
    assert proj["name"] == "fa4-tune"  # not "fa4": flash-attn-4 reads version("fa4") for itself
    deps = proj["dependencies"]
    assert "nvidia-cutlass-dsl==4.8.1" in deps
    assert proj["optional-dependencies"]["ref"][0] == "flash-attn-4==4.0.0b36"
    # The kernels install light: the tuner's and the service's dependencies are extras.
    assert not any(d.split("[")[0].split(">")[0] in ("optuna", "fastapi", "uvicorn", "psycopg") for d in deps)
    extras = proj["optional-dependencies"]
    assert {"optuna>=4"} <= set(extras["tune"]) and {"fastapi", "uvicorn"} <= set(extras["serve"])
    assert "fa4-tune[tune,serve]" in extras["ref"] and "fa4-tune[tune,serve]" in extras["test"]
    assert proj["scripts"] == {"fa4-tune": "tuner.cli:entry", "fa4-serve": "service.cli:main"}


def test_wheel_contains_packages_data_and_entry_points(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr
    (whl,) = tmp_path.glob("fa4_tune-*.whl")
    names = set(zipfile.ZipFile(whl).namelist())
    for pkg in ("fa4", "store", "providers", "tuner", "service", "dashboards"):
        assert f"{pkg}/__init__.py" in names, pkg
    migrations = [n for n in names if n.startswith("store/migrations/versions/") and n.endswith(".py")]
    assert migrations, "alembic migrations must ship in the wheel"
    assert "store/migrations/env.py" in names
    for data in (ROOT / "providers" / "data").glob("*.json"):
        assert f"providers/data/{data.name}" in names
    assert not any(n.startswith("tests/") for n in names)
    (ep,) = [n for n in names if n.endswith("entry_points.txt")]
    text = zipfile.ZipFile(whl).read(ep).decode()
    assert "fa4-tune = tuner.cli:entry" in text and "fa4-serve" in text
    assert "[fa4.config_sources]" in text and "local-db = store.config_source:LocalResultsDB" in text


def test_ci_runs_readme_command_two():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "set -euo pipefail" in ci
    cmd = [ln.strip() for ln in ci.splitlines() if ln.strip().startswith("python3 -m pip install torch")]
    assert len(cmd) == 1
    assert cmd[0] in readme  # the very command the README gives for the test suite
