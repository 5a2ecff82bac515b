"""Fuzz every route from the service's own OpenAPI schema (schemathesis): no 5xx, answers match the schema."""

from __future__ import annotations

import os

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="pip install 'fa4-tune[test]'")
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import not_a_server_error, response_schema_conformance  # noqa: E402

from fa4.problem import Problem  # noqa: E402
from service.app import create_app  # noqa: E402
from store import ResultsStore  # noqa: E402

TOKEN = "fuzz-token"
# Bounded so the suite stays fast; CI runs this on every push, so coverage accumulates.
# FA4_FUZZ_EXAMPLES=N runs N per operation (the hardening measurements in bench/RESULTS.md).
MAX_EXAMPLES = int(os.environ.get("FA4_FUZZ_EXAMPLES", "25"))


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'fuzz.db'}"
    with ResultsStore.open(url) as store:
        # Some data, so that reads return rows and not only empty lists.
        dev = store.upsert_device({"name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132,
                                   "l2_bytes": 1, "memory_bytes": 1})
        pid = store.upsert_problem(Problem.standard(4096, 128))
        cid = store.upsert_config("fa4", {"tile_n": 176})
        store.add_measurement(dev, pid, cid, status="ok", samples_ms=[1.0], median_ms=1.0, tflops=500.0,
                              study_name="s", trial_number=0)
    app = create_app(url, token=TOKEN)
    return schemathesis.openapi.from_asgi("/openapi.json", app)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
# derandomize: the same examples on every run, so a CI failure reproduces locally.
@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture])
def test_no_5xx_and_schema_conformant(case):
    case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"},
                           checks=[not_a_server_error, response_schema_conformance])
