"""--push: finished results reach a real fa4-tune service once, however often they are sent."""

import json

import httpx
import pytest

from fa4.problem import Problem
from service.app import create_app
from store import ResultsStore
from service.settings import Settings
from tests.service.live import free_port, serve
from tests.tuner.test_cli import fa4_tune
from tuner.push import push_results

TOKEN = "push-test-token"
PROBLEM = Problem.standard(8192, 64, causal=True)  # recorded on the H200
SAME = ("trial_number", "config", "status", "reason", "samples_ms", "median_ms", "tflops", "error", "is_default",
        "created_at", "source_fingerprint", "device", "provider", "problem")


@pytest.fixture
def service(tmp_path):
    central = f"sqlite:///{tmp_path / 'central.db'}"
    with serve(create_app(settings=Settings(db_url=central, token=TOKEN, best_cache_ttl_s=0.0))) as url:
        yield url, central


def _tune(tmp_path, url, token=TOKEN, trials=10):
    args = ["--seqlen", "8192", "--hdim", "64", "--causal", "--provider", "replay", "--trials", str(trials),
            "--db", f"sqlite:///{tmp_path / 'local.db'}", "--json", "--push", url]
    return fa4_tune(*args, env_extra={"FA4_API_TOKEN": token} if token else {"FA4_API_TOKEN": ""})


def _rows(url, name):
    with ResultsStore.open(url) as s:
        return [{k: r[k] for k in SAME} for r in s.measurements(study_name=name)]


def test_push_sends_each_result_once(tmp_path, service):
    url, central = service
    r = _tune(tmp_path, url)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    local = _rows(f"sqlite:///{tmp_path / 'local.db'}", doc["study_name"])
    assert len(local) >= 1
    assert doc["push"] == {"url": url, "rows": len(local), "created": len(local), "already_there": 0,
                           "failed": 0, "errors": []}
    assert _rows(central, doc["study_name"]) == local  # the same facts, field for field

    again = _tune(tmp_path, url)  # the study is full: nothing tuned, everything re-sent
    doc2 = json.loads(again.stdout)
    assert again.returncode == 0 and doc2["push"]["created"] == 0 and doc2["push"]["already_there"] == len(local)
    assert _rows(central, doc["study_name"]) == local


class LoseFirstAnswers(httpx.HTTPTransport):
    """The request reaches the service and is stored, but the answer never comes back (once per row)."""

    def __init__(self):
        super().__init__()
        self.lost = set()

    def handle_request(self, request):
        response = super().handle_request(request)
        key = request.headers.get("Idempotency-Key")
        if key and key not in self.lost:
            self.lost.add(key)
            response.read()
            raise httpx.ReadError("connection reset before the answer arrived")
        return response


def test_a_retry_after_a_lost_answer_stores_nothing_twice(tmp_path, service):
    url, central = service
    local_url = f"sqlite:///{tmp_path / 'local.db'}"
    r = fa4_tune("--seqlen", "8192", "--hdim", "64", "--causal", "--provider", "replay", "--trials", "6",
                 "--db", local_url, "--json")
    assert r.returncode == 0, r.stderr
    name = json.loads(r.stdout)["study_name"]
    transport = LoseFirstAnswers()
    with ResultsStore.open(local_url) as store:
        rep = push_results(store, [name], url, TOKEN, backoff_s=0.01, transport=transport)
    n = len(_rows(local_url, name))
    assert len(transport.lost) == n
    assert rep["failed"] == 0 and rep["created"] == 0 and rep["already_there"] == n  # stored by the first try
    assert _rows(central, name) == _rows(local_url, name)


def test_push_failures_are_reported_not_fatal(tmp_path, service):
    url, central = service
    bad = _tune(tmp_path, url, token="wrong")
    assert bad.returncode == 0, bad.stderr
    doc = json.loads(bad.stdout)
    n = len(_rows(f"sqlite:///{tmp_path / 'local.db'}", doc["study_name"]))
    assert n > 0 and doc["best"] is not None  # the local results are all there
    assert doc["push"]["failed"] == n and "HTTP 401" in doc["push"]["errors"][0]
    assert "push to" in bad.stderr and f"{n} failed" in bad.stderr
    assert _rows(central, doc["study_name"]) == []

    dead = f"http://127.0.0.1:{free_port()}"
    with ResultsStore.open(f"sqlite:///{tmp_path / 'local.db'}") as store:
        rep = push_results(store, [doc["study_name"]], dead, TOKEN, attempts=2, backoff_s=0.01)
    assert rep["failed"] == n and rep["created"] == 0 and "service unreachable after 2 attempts" in rep["errors"][0]


def test_push_without_a_token_is_a_usage_error(tmp_path, service):
    url, _ = service
    r = _tune(tmp_path, url, token=None)
    assert r.returncode == 2 and "--push needs the service's API token in $FA4_API_TOKEN" in r.stderr
