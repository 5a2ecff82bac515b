"""The container files reference what exists: sources, console scripts, their flags, the health route."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    out, buf = [], ""
    for line in path.read_text().splitlines():
        s = line.strip()
        if not buf and (not s or s.startswith("#")):
            continue
        buf += (" " if buf else "") + s.rstrip("\\").strip()
        if not s.endswith("\\"):
            op, _, rest = buf.partition(" ")
            out.append((op.upper(), rest.strip()))
            buf = ""
    return out


def exec_form(args: str) -> list[str]:
    return json.loads(args) if args.startswith("[") else shlex.split(args)


def scripts() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def parser_for(script: str):
    import importlib

    module = scripts()[script].partition(":")[0]
    return importlib.import_module(module).build_parser()


def ci_torch_pin() -> str:
    (pin,) = set(re.findall(r"torch==[\w.]+", (ROOT / ".ci" / "run").read_text()))
    return pin


@pytest.mark.parametrize("name, script", [("service.Dockerfile", "fa4-serve"), ("tuner.Dockerfile", "fa4-tune")])
def test_dockerfile_references_existing_files_and_entry_points(name, script):
    ins = instructions(DOCKER / name)
    ops = [op for op, _ in ins]
    assert ops[0] == "FROM"
    for op, args in ins:
        if op == "COPY":
            *srcs, _dst = args.split()
            for src in srcs:
                assert (ROOT / src).exists(), f"{name}: COPY {src} does not exist"
    # Everything the wheel packages is copied in (else pip install . silently drops a package).
    copied = {a.split()[0] for op, a in ins if op == "COPY"}
    for pkg in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]:
        assert pkg.rstrip("*") in copied, f"{name} does not copy package {pkg}"
    # Non-root at run time.
    users = [a for op, a in ins if op == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert ops.index("USER") > max(i for i, op in enumerate(ops) if op == "RUN")
    # The command runs the console script with flags its parser accepts.
    entry = [exec_form(a) for op, a in ins if op == "ENTRYPOINT"]
    cmd = [exec_form(a) for op, a in ins if op == "CMD"][-1]
    argv = (entry[-1] if entry else []) + cmd
    assert argv[0] == script and script in scripts()
    parser_for(script).parse_args(argv[1:])
    # torch pinned as in CI.
    assert ci_torch_pin() in " ".join(a for op, a in ins if op == "RUN")


def test_service_image_is_slim_and_checks_the_health_route():
    ins = instructions(DOCKER / "service.Dockerfile")
    assert ins[0][1].startswith("python:3.11-slim")
    (health,) = [a for op, a in ins if op == "HEALTHCHECK"]
    port = re.search(r"127\.0\.0\.1:(\d+)(/\w+)", health)
    assert port and port.group(2) == "/healthz"
    assert f"EXPOSE {port.group(1)}" in [f"{op} {a}" for op, a in ins]
    from service.app import create_app

    assert "/healthz" in {r.path for r in create_app("sqlite://").routes}


def test_tuner_image_has_cuda_and_the_reference():
    ins = instructions(DOCKER / "tuner.Dockerfile")
    assert ins[0][1].startswith("nvidia/cuda:")
    assert "cu12" in " ".join(a for op, a in ins if op == "RUN")
    assert any("'.[ref]'" in a for op, a in ins if op == "RUN")


def test_compose_wires_service_postgres_and_gpu_tuner():
    spec = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    svc = spec["services"]
    assert set(svc) == {"db", "service", "tuner"}
    assert svc["db"]["image"].startswith("postgres:")
    for name, script in (("service", "fa4-serve"), ("tuner", "fa4-tune")):
        build = svc[name]["build"]
        context = (DOCKER / build["context"]).resolve()
        assert context == ROOT
        dockerfile = context / build["dockerfile"]
        assert dockerfile.is_file()
        # The URL uses a driver the package depends on.
        assert svc[name]["environment"]["FA4_DB"].startswith("postgresql+psycopg://")
        assert svc[name]["depends_on"]["db"]["condition"] == "service_healthy"
        cmd = svc[name]["command"]
        entry = [exec_form(a) for op, a in instructions(dockerfile) if op == "ENTRYPOINT"]
        argv = (entry[-1] if entry else []) + cmd
        assert argv[0] == script
        parser_for(script).parse_args(argv[1:])
    # The PostgreSQL driver comes with the extras the images install (the kernels install light).
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name, extra in (("service.Dockerfile", "serve"), ("tuner.Dockerfile", "tune")):
        assert any("psycopg" in d for d in extras[extra])
        installs = [a for op, a in instructions(DOCKER / name) if op == "RUN" and "pip install" in a and "torch" not in a]
        assert any(f"[{extra}]" in a or "[ref]" in a for a in installs), (name, installs)
    assert "FA4_API_TOKEN" in svc["service"]["environment"]
    assert svc["service"]["ports"] == ["127.0.0.1:8000:8000"]
    (gpu,) = svc["tuner"]["deploy"]["resources"]["reservations"]["devices"]
    assert gpu["capabilities"] == ["gpu"] and gpu["driver"] == "nvidia"
    assert set(spec["volumes"]) == {"pgdata", "optuna"}
