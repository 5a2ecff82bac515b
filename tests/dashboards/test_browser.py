"""The dashboard in a real headless Chromium against real fa4-serve processes.

Every chart's data is read back from ECharts in the page and compared with what this test computes
itself from the REST API, so the page can only pass by showing the API's numbers. Screenshots go to
artifacts/dashboards/. Chromium is Debian's (/usr/bin/chromium), driven through Playwright.
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts" / "dashboards"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
VIEWS = ("throughput", "gain", "determinism", "study")
TOKEN = "dashboard-test-token"
TWIN = "test-twin-gpu"  # a second device name posted by the backward-data fixture


def _chromium() -> str | None:
    for candidate in (os.environ.get("FA4_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


@pytest.fixture(scope="module")
def browser():
    path = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    missing = [what for what, ok in (("chromium", path), ("playwright", sync_playwright)) if not ok]
    if missing:
        # CI installs both (.ci/run); there a missing browser is a failure, never a skip.
        if os.environ.get("CI") == "true":
            pytest.fail(f"{' and '.join(missing)} missing under CI: apt-get install chromium; pip install playwright")
        pytest.skip(f"{' and '.join(missing)} not installed (apt-get install chromium; pip install playwright)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        yield b
        b.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``fa4-serve`` in a subprocess on 127.0.0.1, a random port."""

    def __init__(self, *args: str, token: str | None = None):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        env.pop("FA4_API_TOKEN", None)
        env.pop("FA4_DB", None)
        if token:
            env["FA4_API_TOKEN"] = token
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", *args, "--host", "127.0.0.1", "--port", str(self.port),
             "--no-access-log", "--log-level", "warning"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"fa4-serve exited: {self.proc.stderr.read()}")
            if time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError("fa4-serve did not come up within 90 s")
            time.sleep(0.2)
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def get(self, path: str, **params):
        r = self.http.get(path, params={k: v for k, v in params.items() if v is not None})
        assert r.status_code == 200, (path, params, r.text)
        return r.json()

    def results(self, **params) -> list[dict]:
        items, offset = [], 0
        while True:
            page = self.get("/v1/results", limit=1000, offset=offset, **params)
            items += page["items"]
            offset += len(page["items"])
            if not page["items"] or offset >= page["total"]:
                return items

    def stop(self):
        self.http.close()
        self.proc.terminate()
        self.proc.wait(30)


@pytest.fixture(scope="module")
def demo_server():
    s = Server("--demo")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def empty_server(tmp_path_factory):
    s = Server("--db", f"sqlite:///{tmp_path_factory.mktemp('empty') / 'empty.db'}")
    yield s
    s.stop()


class Page:
    """A loaded dashboard page that records console errors, page errors and failed requests."""

    def __init__(self, browser, url: str, routes: dict | None = None, width: int = 1400, init_script: str = ""):
        self.page = browser.new_page(viewport={"width": width, "height": 1000})
        if init_script:
            self.page.add_init_script(init_script)
        for pattern, handler in (routes or {}).items():
            self.page.route(pattern, handler)
        self.problems: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.problems.append(f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("requestfailed", lambda r: self.problems.append(f"request failed: {r.url}"))
        self.page.on("response", lambda r: r.status >= 400 and self.problems.append(f"HTTP {r.status}: {r.url}"))
        self.page.goto(url)
        self.settle()

    def settle(self, view: str | None = None, raw_has: str | None = None):
        """Wait until no view (or ``view``) is loading, and its raw-JSON link holds ``raw_has``."""
        self.page.wait_for_function(
            """([view, rawHas]) => [...document.querySelectorAll('section.view')]
                 .filter(s => !view || s.id === view)
                 .every(s => s.dataset.state !== 'loading'
                             && (!rawHas || s.querySelector('a.raw').href.includes(rawHas)))""",
            arg=[view, raw_has], timeout=30000)

    def state(self, view: str) -> str:
        return self.page.get_attribute(f"#{view}", "data-state")

    def series(self, chart: str) -> list[dict]:
        return self.page.evaluate(
            """(id) => window.fa4dash.charts[id].getOption().series.map(s => ({
                 name: s.name, type: s.type,
                 data: s.data.map(d => (d !== null && typeof d === 'object' && 'value' in d) ? d.value : d),
                 markArea: s.markArea ? s.markArea.data : null,
                 markLine: s.markLine ? s.markLine.data : null}))""", chart)

    def option(self, chart: str, key: str):
        return self.page.evaluate("([id, key]) => JSON.parse(JSON.stringify(window.fa4dash.charts[id].getOption()[key]))",
                                  [chart, key])

    def raw(self, view: str) -> str:
        return self.page.get_attribute(f"#{view} a.raw", "href")

    def filter_value(self, view: str, name: str) -> str:
        return self.page.eval_on_selector(f"#{view} select[data-filter='{name}']", "e => e.value")

    def filter_options(self, view: str, name: str) -> list[str]:
        return self.page.eval_on_selector_all(f"#{view} select[data-filter='{name}'] option", "os => os.map(o => o.value)")

    def choose(self, view: str, name: str, value: str):
        self.page.select_option(f"#{view} select[data-filter='{name}']", value)

    def screenshot(self, name: str):
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)

    def close(self):
        self.page.close()


def _query(url: str) -> dict:
    """The filters of a /v1/results link, without paging."""
    q = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    return {k: v for k, v in q.items() if k not in ("limit", "offset")}


# -- what the charts must show, computed here from the API ---------------------------------------

def expected_throughput(rows) -> dict[str, list]:
    best_default, best_any, tuned_at = {}, {}, defaultdict(set)
    for r in rows:
        if r["tflops"] is None:
            continue
        key = (r["provider"], r["problem"]["seqlen_q"])
        best_any[key] = max(best_any.get(key, 0), r["tflops"])
        if r["is_default"]:
            best_default[key] = max(best_default.get(key, 0), r["tflops"])
        else:
            tuned_at[r["provider"]].add(r["problem"]["seqlen_q"])
    out = defaultdict(list)
    for (prov, s), t in sorted(best_default.items()):
        out[f"{prov} default"].append([s, t])
    for prov, seqlens in tuned_at.items():
        out[f"{prov} tuned"] = [[s, best_any[(prov, s)]] for s in sorted(seqlens)]
    return dict(out)


def expected_gain(rows) -> dict[tuple, float]:
    studies = {}
    for r in rows:
        if not r["study_name"] or r["tflops"] is None:
            continue
        s = studies.setdefault(r["study_name"], {"rows": []})
        s["rows"].append(r)
    cells = {}
    for name, s in studies.items():
        rs = s["rows"]
        defaults = [r["tflops"] for r in rs if r["is_default"]]
        if not defaults:
            continue
        p = rs[0]["problem"]
        newest = max((r["created_at"], r["id"]) for r in rs)
        key = (f"{rs[0]['provider']} hd{p['head_dim']}", p["seqlen_q"])
        if key not in cells or newest > cells[key][0]:
            cells[key] = (newest, max(r["tflops"] for r in rs) / max(defaults))
    return {k: v[1] for k, v in cells.items()}


def expected_determinism(rows) -> dict[tuple, dict]:
    shapes = {}
    for r in rows:
        p = r["problem"]
        s = shapes.setdefault((p["head_dim"], p["causal"], p["seqlen_q"]), {"det": None, "nondet": None})
        mode = "det" if p["deterministic"] else "nondet"
        s[mode] = max(s[mode] or 0, r["tflops"])
    return shapes


def js_str(v) -> str:
    """JavaScript's String(v) of a JSON value, as the page labels knob values."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _close(a, b) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9))


def _by_name(series: list[dict]) -> dict[str, list]:
    return {s["name"]: s["data"] for s in series}


def _assert_points(got: dict[str, list], want: dict[str, list]):
    assert sorted(got) == sorted(want)
    for name in want:
        assert [p[0] for p in got[name]] == [p[0] for p in want[name]], name
        assert all(_close(g[1], w[1]) for g, w in zip(got[name], want[name])), (name, got[name], want[name])


# -- the demo: recorded H200 data ----------------------------------------------------------------

@pytest.fixture(scope="module")
def demo_page(browser, demo_server):
    page = Page(browser, demo_server.url + "/")
    yield page
    page.close()


def test_demo_page_loads_without_errors_and_offers_the_api_devices(demo_page, demo_server):
    demo_page.screenshot("demo")
    assert demo_page.problems == []
    names = sorted({d["name"] for d in demo_server.get("/v1/devices")})
    for view in VIEWS:
        assert sorted(demo_page.filter_options(view, "device")) == names
    assert [demo_page.state(v) for v in VIEWS] == ["ready"] * len(VIEWS)
    # The page and its chart library come from the service itself: nothing else was asked for.
    urls = demo_page.page.evaluate("() => performance.getEntriesByType('resource').map(e => e.name)")
    assert urls and all(u.startswith(demo_server.url) or u.startswith("data:") for u in urls), urls


def test_throughput_chart_shows_the_api_numbers_and_follows_filters(demo_page, demo_server):
    raw = demo_page.raw("throughput")
    params = _query(raw)
    assert params["device"] == demo_page.filter_value("throughput", "device")
    rows = demo_server.results(**params)
    want = expected_throughput(rows)
    # The recorded bench table puts all four providers on this chart.
    assert {n.rsplit(" ", 1)[0] for n in want} == {"fa4", "flash-attn-4", "cudnn", "fa2"}
    before = _by_name(demo_page.series("chart-throughput"))
    _assert_points(before, want)

    other = next(v for v in demo_page.filter_options("throughput", "head_dim") if v != params["head_dim"])
    demo_page.choose("throughput", "head_dim", other)
    demo_page.settle("throughput", raw_has=f"head_dim={other}")
    params2 = _query(demo_page.raw("throughput"))
    # The value head dim follows (the demo's shapes have head_dim_v == head_dim).
    assert params2 == {**params, "head_dim": other, "head_dim_v": other}
    after = _by_name(demo_page.series("chart-throughput"))
    _assert_points(after, expected_throughput(demo_server.results(**params2)))
    assert after != before
    demo_page.screenshot(f"demo-throughput-hd{other}")
    assert demo_page.problems == []


def test_timing_filter_offers_the_declared_modes_and_narrows_every_chart(demo_page, demo_server):
    """The modes come from GET /v1/timings (fa4/timing.py), the default selected; the demo's rows
    are all eager-cold, so another mode empties the chart and says which flags fill it."""
    modes = demo_server.get("/v1/timings")
    names = [m["name"] for m in modes]
    assert len(names) == 4 and modes[0]["default"]
    for view in ("throughput", "gain", "determinism"):
        assert demo_page.filter_options(view, "timing") == names
        assert demo_page.filter_value(view, "timing") == names[0] == _query(demo_page.raw(view))["timing"]
    demo_page.choose("throughput", "timing", "graph-warm")
    demo_page.settle("throughput", raw_has="timing=graph-warm")
    assert demo_page.state("throughput") == "empty"
    text = demo_page.page.inner_text("#throughput .empty")
    assert "--launch graph --l2 warm" in text, text
    demo_page.choose("throughput", "timing", names[0])
    demo_page.settle("throughput", raw_has=f"timing={names[0]}")
    assert demo_page.state("throughput") == "ready"
    assert demo_page.problems == []


def test_gain_heatmap_shows_tuned_over_default_per_study(demo_page, demo_server):
    rows = demo_server.results(**_query(demo_page.raw("gain")))
    want = expected_gain(rows)
    assert want and all(g >= 1.0 for g in want.values())  # the best of a study includes its default
    xs = demo_page.option("chart-gain", "xAxis")[0]["data"]
    ys = demo_page.option("chart-gain", "yAxis")[0]["data"]
    (heat,) = demo_page.series("chart-gain")
    got = {(ys[y], int(xs[x])): g for x, y, g in heat["data"]}
    assert sorted(got) == sorted(want)
    assert all(_close(got[k], want[k]) for k in want)


# -- verdicts: the gain heatmap shows what a lookup serves, with its confidence --------------------

V_SIG, V_KEPT = "fa4 hd128", "fa4 hd64"  # the demo's two fa4 studies (fwd bf16, seqlen 8192)


@pytest.fixture(scope="module")
def verdict_server(tmp_path_factory):
    """The demo DB plus verdicts on its two fa4 studies: hd128's challenger kept (+6.1% +- 0.1%, 5 rounds),
    hd64's default kept (-6.8% +- 15%, 7 rounds, re-measured twice: the newest counts); the
    flash-attn-4 studies stay without one."""
    from service.demo import build_demo_db
    from store import ResultsStore

    url = f"sqlite:///{tmp_path_factory.mktemp('verdicts') / 'v.db'}"
    build_demo_db(url)
    with ResultsStore.open(url) as store:
        studies = {}
        for r in store.measurements(provider="fa4", status="ok"):
            if r["study_name"]:
                studies.setdefault(r["problem"]["head_dim"], []).append(r)
        for hd, significant, gain, spread, n in ((128, True, 0.061, 0.001, 5), (64, False, 0.02, 0.4, 3),
                                                 (64, False, -0.068, 0.15, 7)):
            rows = studies[hd]
            served = max(rows, key=lambda r: r["tflops"]) if significant else next(r for r in rows if r["is_default"])
            store.add_verdict(served["device_id"], served["problem_id"], "fa4", measurement_id=served["id"],
                              significant=significant, gain=gain, spread=spread,
                              rounds={"configs": [], "tflops": [[1.0, 1.0]] * n, "order": [[0, 1]] * n},
                              study_name=served["study_name"], source_fingerprint=served["source_fingerprint"])
    s = Server("--db", url)
    yield s
    s.stop()


def test_gain_heatmap_shows_the_served_gain_with_its_confidence(browser, verdict_server):
    page = Page(browser, verdict_server.url + "/")
    try:
        assert page.state("gain") == "ready"
        params = _query(page.raw("gain"))
        rows = verdict_server.results(**params)
        verdicts = {v["study_name"]: v for v in verdict_server.get("/v1/verdicts", device=params["device"],
                                                                   timing=params["timing"])}
        assert len(verdicts) == 2 and sorted(v["significant"] for v in verdicts.values()) == [False, True]
        study_gain = expected_gain(rows)
        xs = page.option("chart-gain", "xAxis")[0]["data"]
        ys = page.option("chart-gain", "yAxis")[0]["data"]
        cells = page.page.evaluate("""() => window.fa4dash.charts['chart-gain'].getOption().series[0].data
            .map(d => ({ value: d.value, label: d.label, confidence: d.confidence, study: d.study }))""")
        got = {(ys[c["value"][1]], int(xs[c["value"][0]])): c for c in cells}
        assert sorted(got) == sorted(study_gain)
        sig, kept = got[(V_SIG, 8192)], got[(V_KEPT, 8192)]
        # Significant: the served value is 1 + gain, the confidence beside it.
        assert _close(sig["value"][2], 1 + verdicts[sig["study"]]["gain"])
        assert sig["confidence"] == "+6.1% \u00b1 0.1% (5 rounds): challenger kept"
        assert sig["label"] == f"{1.061:.3f}x\n\u00b10.1%"
        # Not significant: the default stays (1.000), whatever the study's best measured.
        assert study_gain[(V_KEPT, 8192)] >= 1.0 and kept["value"][2] == 1
        assert kept["confidence"] == (f"study best {study_gain[(V_KEPT, 8192)]:.2f}x; "
                                      "re-measured \u22126.8% \u00b1 15.0% (7 rounds): default kept")
        assert kept["label"] == "1.000x\ndefault kept"
        # Without a verdict: the study's best over its default, marked as not re-measured.
        for key, c in got.items():
            if key not in ((V_SIG, 8192), (V_KEPT, 8192)):
                assert _close(c["value"][2], study_gain[key]) and "not re-measured" in c["label"]
                assert "not re-measured" in c["confidence"]
        # The tooltips say it too, next to the served speedup.
        tips = page.page.evaluate("""async () => {
            const c = window.fa4dash.charts['chart-gain'];
            const out = [];
            for (let i = 0; i < c.getOption().series[0].data.length; i++) {
              c.dispatchAction({ type: "showTip", seriesIndex: 0, dataIndex: i });
              await new Promise((r) => setTimeout(r, 30));
              out.push(document.getElementById('chart-gain').innerText);
            }
            return out;
          }""")
        assert any("served 1.061x: +6.1% \u00b1 0.1% (5 rounds): challenger kept" in t for t in tips), tips
        assert any("served 1.000x: study best" in t and "default kept" in t for t in tips), tips
        assert any("not re-measured" in t for t in tips), tips
        page.screenshot("gain-verdicts")
        assert page.problems == []
    finally:
        page.close()


def test_determinism_chart_shows_the_measured_backward_of_each_provider(demo_page, demo_server):
    device = demo_page.filter_value("determinism", "device")
    bwd = demo_server.results(device=device, status="ok", **{"pass": "bwd"})
    providers = sorted({r["provider"] for r in bwd})
    assert providers == ["cudnn", "fa2", "fa4", "flash-attn-4"]
    assert demo_page.filter_options("determinism", "provider") == providers
    # It opens on the first provider measured in both modes (the SDPA ones have no deterministic mode).
    assert demo_page.state("determinism") == "ready" and demo_page.filter_value("determinism", "provider") == "fa4"
    for provider in ["fa4", "cudnn", "fa2", "flash-attn-4"]:
        if demo_page.filter_value("determinism", "provider") != provider:
            demo_page.choose("determinism", "provider", provider)
            demo_page.settle("determinism", raw_has=f"provider={provider}")
        params = _query(demo_page.raw("determinism"))
        assert params == {"device": device, "status": "ok", "pass": "bwd", "provider": provider, "dtype": "bf16",
                          "timing": "eager-cold"}
        want = expected_determinism(demo_server.results(**params))
        assert len(want) == 4  # S=8192, hd 64/128, causal or not
        series = _assert_determinism_chart(demo_page, want)
        both = provider in ("fa4", "flash-attn-4")
        assert all((r is not None) == both for r in series["ratio"]["data"])
        assert all((d is not None) == both for d in series["deterministic"]["data"])
        demo_page.screenshot(f"demo-determinism-{provider}")
    demo_page.choose("determinism", "provider", "fa4")
    demo_page.settle("determinism", raw_has="provider=fa4")
    # Ours at hd128 non-causal, as the demo's check_bwd.py log printed it: 565 / 552 = 0.976.
    labels = demo_page.option("chart-determinism", "xAxis")[0]["data"]
    series = {s["name"]: s["data"] for s in demo_page.series("chart-determinism")}
    i = labels.index("S8192 hd128")
    assert (round(series["non-deterministic"][i]), round(series["deterministic"][i])) == (565, 552)
    assert round(series["ratio"][i], 3) == 0.976
    assert demo_page.problems == []


def test_study_view_matches_the_study_and_knob_endpoints(demo_page, demo_server):
    name = demo_page.filter_value("study", "study")
    study = demo_server.get(f"/v1/studies/{name}")
    assert urlsplit(demo_page.raw("study")).path == "/v1/studies/" + quote(name, safe="")
    knobs = demo_server.get(f"/v1/providers/{study['provider']}/knobs")["passes"][study["problem"]["pass"]]["knobs"]
    assert knobs
    ok = [t for t in study["trials"] if t["status"] == "ok"]
    history = _by_name(demo_page.series("chart-history"))
    shown = sorted(history["TFLOP/s"] + history["default config"])
    assert shown == sorted([t["trial_number"], t["tflops"]] for t in ok)
    best = [p[1] for p in history["best so far"]]
    assert best == sorted(best) and best[-1] == study["best"]["tflops"]

    # Parallel coordinates: one axis per knob of the API, in its order, then TFLOP/s.
    axes = demo_page.option("chart-parallel", "parallelAxis")
    assert [a["name"] for a in axes] == [k["name"] for k in knobs] + ["TFLOP/s"]
    for a, k in zip(axes, knobs):
        assert [js_str(c) for c in k["choices"]] == a["data"][: len(k["choices"])]
    (lines,) = demo_page.series("chart-parallel")
    assert sorted(map(tuple, lines["data"]), key=str) == sorted(
        (tuple(js_str(t["config"][k["name"]]) for k in knobs) + (t["tflops"],) for t in ok), key=str)

    # Failed and infeasible trials are listed with their reasons.
    cells = demo_page.page.eval_on_selector_all(
        "#study table.failed tbody tr[data-status]", "rs => rs.map(r => [...r.cells].map(c => c.textContent))")
    assert [(int(c[0]), c[1], c[2]) for c in cells] == [
        (t["trial_number"], t["status"], t["reason"]) for t in study["trials"] if t["status"] != "ok"]
    # Today's studies sample feasible configs only, and every one ran: the table lists none. (The
    # listing of failed trials with their reasons is what the equality above checks either way.)
    assert len(cells) == sum(t["status"] != "ok" for t in study["trials"])


def test_knob_filter_narrows_the_study_charts(demo_page, demo_server):
    name = demo_page.filter_value("study", "study")
    study = demo_server.get(f"/v1/studies/{name}")
    knobs = demo_server.get(f"/v1/providers/{study['provider']}/knobs")["passes"][study["problem"]["pass"]]["knobs"]
    ok = [t for t in study["trials"] if t["status"] == "ok"]
    # The first knob whose value differs between the measured trials.
    knob, value = next((k["name"], js_str(t["config"][k["name"]])) for k in knobs for t in ok
                       if len({js_str(x["config"][k["name"]]) for x in ok}) > 1)
    demo_page.choose("study", f"knob:{knob}", value)
    demo_page.page.wait_for_function(
        "([k, v]) => document.querySelector(`#study select[data-filter='knob:${k}']`).value === v"
        " && document.querySelector('#study').dataset.state === 'ready'", arg=[knob, value])
    demo_page.settle("study")
    history = _by_name(demo_page.series("chart-history"))
    want = sorted([t["trial_number"], t["tflops"]] for t in ok if js_str(t["config"][knob]) == value)
    assert sorted(history["TFLOP/s"] + history["default config"]) == want
    assert 0 < len(want) < len(ok)
    (lines,) = demo_page.series("chart-parallel")
    assert len(lines["data"]) == len(want)
    demo_page.screenshot("demo-study-filtered")
    demo_page.choose("study", f"knob:{knob}", "")
    demo_page.settle("study")
    assert demo_page.problems == []


def test_a_new_knob_appears_as_axis_and_filter_without_dashboard_change(browser, demo_server):
    """The knob endpoint, amended in flight with one more knob: the page picks it up by itself."""
    probe = {"name": "probe_knob", "type": "int", "choices": [1, 2, 4], "default": 2, "doc": "added by the test"}

    def add_knob(route):
        response = route.fetch()
        doc = response.json()
        for p in doc["passes"].values():
            p["knobs"].append(probe)
        route.fulfill(response=response, json=doc)

    page = Page(browser, demo_server.url + "/", routes={"**/v1/providers/*/knobs": add_knob})
    try:
        study = demo_server.get(f"/v1/studies/{page.filter_value('study', 'study')}")
        knobs = demo_server.get(f"/v1/providers/{study['provider']}/knobs")["passes"][study["problem"]["pass"]]["knobs"]
        axes = page.option("chart-parallel", "parallelAxis")
        assert [a["name"] for a in axes] == [k["name"] for k in knobs] + ["probe_knob", "TFLOP/s"]
        assert axes[-2]["data"] == ["1", "2", "4"]
        assert page.filter_options("study", "knob:probe_knob") == ["", "1", "2", "4"]
        # No stored config has it: every trial is drawn at its default.
        (lines,) = page.series("chart-parallel")
        assert lines["data"] and all(row[-2] == "2" for row in lines["data"])
        assert page.problems == []
    finally:
        page.close()


def test_the_url_hash_keeps_and_restores_every_views_filters(browser, demo_server):
    page = Page(browser, demo_server.url + "/")
    try:
        hd = page.filter_options("throughput", "head_dim")[-1]
        studies = page.filter_options("study", "study")
        page.choose("throughput", "head_dim", hd)
        page.settle("throughput", raw_has=f"head_dim={hd}")
        page.choose("study", "study", studies[-1])
        page.settle("study", raw_has=quote(studies[-1], safe=""))
        study = demo_server.get(f"/v1/studies/{studies[-1]}")
        knob, value = next((k, js_str(v)) for k, v in study["best"]["config"].items())
        page.choose("study", f"knob:{knob}", value)
        page.page.wait_for_function("(k) => location.hash.includes(k)", arg=f"study.knob.{knob}")
        link = page.page.evaluate("() => location.href")
    finally:
        page.close()
    # A fresh page from that link shows the same selection.
    page = Page(browser, link)
    try:
        assert page.filter_value("throughput", "head_dim") == hd
        assert _query(page.raw("throughput"))["head_dim"] == hd
        assert page.filter_value("study", "study") == studies[-1]
        assert page.filter_value("study", f"knob:{knob}") == value
        history = _by_name(page.series("chart-history"))
        assert sorted(history["TFLOP/s"] + history["default config"]) == sorted(
            [t["trial_number"], t["tflops"]] for t in study["trials"]
            if t["status"] == "ok" and js_str(t["config"][knob]) == value)
        assert page.problems == []
    finally:
        page.close()


def test_a_stale_link_falls_back_to_valid_filters(browser, demo_server):
    page = Page(browser, demo_server.url + "/#throughput.head_dim=999&throughput.bogus=1&study.study=gone")
    try:
        assert [page.state(v) for v in VIEWS] == ["ready"] * len(VIEWS)
        params = _query(page.raw("throughput"))
        assert "bogus" not in params and params["head_dim"] in page.filter_options("throughput", "head_dim")
        assert page.filter_value("study", "study") in page.filter_options("study", "study")
        assert page.problems == []
    finally:
        page.close()


def test_an_api_failure_is_shown_in_each_view_not_thrown(browser, demo_server):
    def unavailable(route):
        route.fulfill(status=503, json={"error": "database unavailable: OperationalError"})

    page = Page(browser, demo_server.url + "/", routes={"**/v1/results?*": unavailable})
    try:
        assert [page.state(v) for v in VIEWS] == ["error"] * len(VIEWS)
        for view in VIEWS:
            assert "database unavailable: OperationalError" in page.page.inner_text(f"#{view} .empty")
        # The browser logs the 503s themselves; nothing else may go wrong on the page.
        assert [p for p in page.problems if "503" not in p] == []
    finally:
        page.close()


def test_every_raw_json_link_answers(demo_page, demo_server):
    links = demo_page.page.eval_on_selector_all("a.raw:not([hidden])", "as => as.map(a => a.href)")
    assert len(links) >= len(VIEWS)
    for url in links:
        r = httpx.get(url, timeout=30)
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/json"), url


# -- backward data: the determinism chart ----------------------------------------------------------

def _device_payload(server) -> dict:
    d = server.get("/v1/devices")[0]
    return {k: d[k] for k in ("name", "compute_capability", "sm_count", "l2_bytes", "memory_bytes", "driver",
                              "cuda", "torch", "cutlass_dsl", "provider_versions")}


@pytest.fixture(scope="module")
def bwd_server(tmp_path_factory):
    """The demo DB plus backward rows of flash-attn-4 posted through the API (test data beside the
    recorded ones: a shape timed twice in one mode, and a shape with one mode only)."""
    from service.demo import build_demo_db

    url = f"sqlite:///{tmp_path_factory.mktemp('bwd') / 'bwd.db'}"
    build_demo_db(url)
    s = Server("--db", url, token=TOKEN)
    try:
        device = _device_payload(s)
        # Two shapes with both modes, one with the non-deterministic mode only.
        for seqlen, hd, det, tflops in ((4096, 128, False, 400.0), (4096, 128, True, 352.0),
                                        (8192, 64, False, 300.0), (8192, 64, True, 291.0), (8192, 64, True, 287.5),
                                        (16384, 128, False, 420.0)):
            body = {"device": device, "provider": "flash-attn-4", "config": {}, "status": "ok", "median_ms": 1.0,
                    "tflops": tflops,
                    "problem": {"batch": 16384 // seqlen, "seqlen_q": seqlen, "seqlen_k": seqlen,
                                "heads_q": 2048 // hd, "heads_kv": 2048 // hd, "head_dim": hd, "head_dim_v": hd,
                                "deterministic": det, "pass": "bwd"}}
            r = s.http.post("/v1/results", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
            assert r.status_code == 201, r.text
        # A second device with one forward row, for the device selector.
        body = {"device": {**device, "name": TWIN}, "provider": "cudnn", "status": "ok", "median_ms": 1.0,
                "tflops": 123.0, "problem": {"batch": 4, "seqlen_q": 4096, "seqlen_k": 4096, "heads_q": 16,
                                             "heads_kv": 16, "head_dim": 128, "head_dim_v": 128}}
        r = s.http.post("/v1/results", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 201, r.text
        yield s
    finally:
        s.stop()


def _assert_determinism_chart(page, want: dict[tuple, dict]) -> dict[str, dict]:
    """The chart holds, per shape in (head_dim, causal, seqlen) order, both modes' best and their ratio."""
    labels = page.option("chart-determinism", "xAxis")[0]["data"]
    series = {s["name"]: s for s in page.series("chart-determinism")}
    assert len(labels) == len(want)
    for i, (hd, causal, seqlen) in enumerate(sorted(want)):
        w = want[(hd, causal, seqlen)]
        assert labels[i] == f"S{seqlen} hd{hd}" + (" causal" if causal else "")
        assert _close(series["non-deterministic"]["data"][i], w["nondet"])
        assert _close(series["deterministic"]["data"][i], w["det"])
        ratio = w["det"] / w["nondet"] if w["det"] and w["nondet"] else None
        assert _close(series["ratio"]["data"][i], ratio)
    band = series["ratio"]["markArea"][0]
    assert [band[0]["yAxis"], band[1]["yAxis"]] == [0.85, 0.9]
    assert [m["yAxis"] for m in series["ratio"]["markLine"]] == [0.95]
    return series


def test_determinism_chart_takes_each_modes_best_and_leaves_one_mode_shapes_without_ratio(browser, bwd_server):
    page = Page(browser, bwd_server.url + "/")
    try:
        page.choose("determinism", "provider", "flash-attn-4")
        page.settle("determinism", raw_has="provider=flash-attn-4")
        assert page.state("determinism") == "ready"
        params = _query(page.raw("determinism"))
        assert params["pass"] == "bwd" and params["provider"] == "flash-attn-4"
        rows = bwd_server.results(**params)
        want = expected_determinism(rows)
        # The posted rows add a shape measured twice in one mode and one measured in one mode only.
        assert len(rows) > sum((w["det"] is not None) + (w["nondet"] is not None) for w in want.values())
        assert any(w["det"] is None for w in want.values())
        _assert_determinism_chart(page, want)
        page.screenshot("determinism-posted")
        assert page.problems == []
    finally:
        page.close()


# -- an empty database ------------------------------------------------------------------------------

def test_empty_database_shows_every_empty_state_with_its_command(browser, empty_server):
    assert empty_server.get("/v1/devices") == []
    page = Page(browser, empty_server.url + "/")
    try:
        page.screenshot("empty")
        assert [page.state(v) for v in VIEWS] == ["empty"] * len(VIEWS)
        for view in VIEWS:
            text = page.page.inner_text(f"#{view} .empty")
            assert "fa4-tune --seqlen" in text, (view, text)
            assert page.page.eval_on_selector_all(f"#{view} .chart", "cs => cs.every(c => c.hidden)")
        assert "--pass bwd --deterministic" in page.page.inner_text("#determinism .empty")
        assert page.problems == []
    finally:
        page.close()


def test_device_selector_switches_every_view_to_that_device(browser, bwd_server):
    page = Page(browser, bwd_server.url + "/")
    try:
        assert TWIN in page.filter_options("throughput", "device")
        before = _by_name(page.series("chart-throughput"))
        for view in VIEWS:
            page.choose(view, "device", TWIN)
        page.settle("throughput", raw_has=f"device={TWIN}")
        page.settle()
        params = _query(page.raw("throughput"))
        assert params["device"] == TWIN
        after = _by_name(page.series("chart-throughput"))
        _assert_points(after, expected_throughput(bwd_server.results(**params)))
        assert after != before and after
        # The twin has no backward rows and no study: those views say so for this device.
        assert [page.state(v) for v in VIEWS] == ["ready", "empty", "empty", "empty"]
        assert TWIN in page.page.inner_text("#determinism .empty")
        page.screenshot("device-twin")
        assert page.problems == []
    finally:
        page.close()


def test_dashboard_works_under_a_path_prefix(browser, tmp_path):
    """Behind a proxy that serves the service under /fa4/, the page asks for /fa4/v1/... and /fa4/static/..."""
    import threading

    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from service.demo import build_demo_db
    from service.app import create_app

    url = f"sqlite:///{tmp_path / 'prefixed.db'}"
    build_demo_db(url)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Mount("/fa4", app=create_app(url))]), host="127.0.0.1",
                                           port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        page = Page(browser, f"http://127.0.0.1:{port}/fa4/")
        try:
            assert [page.state(v) for v in VIEWS] == ["ready"] * len(VIEWS)
            urls = page.page.evaluate("() => performance.getEntriesByType('resource').map(e => e.name)")
            assert all(urlsplit(u).path.startswith("/fa4/") for u in urls if not u.startswith("data:")), urls
            assert urlsplit(page.raw("throughput")).path == "/fa4/v1/results"
            assert page.problems == []
        finally:
            page.close()
    finally:
        server.should_exit = True
        thread.join(10)


# -- hostile data and small screens ---------------------------------------------------------------

def _payload(field: str) -> str:
    # Runs as script wherever the page puts API text into HTML unescaped (an image that fails to load).
    return f"<img src=x onerror=__xss.push('{field}')>"


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory):
    """Results whose every free-text field carries script: device strings, study, reason, versions."""
    from fa4.knobs import config_to_dict, iter_configs
    from fa4.sm90.fwd_config import FwdConfigSm90

    s = Server("--db", f"sqlite:///{tmp_path_factory.mktemp('hostile') / 'h.db'}", token=TOKEN)
    device = {"name": _payload("device"), "compute_capability": "9.0", "sm_count": 132, "l2_bytes": 62914560,
              "memory_bytes": 150754820096, **{k: _payload(k) for k in ("driver", "cuda", "torch", "cutlass_dsl")},
              "provider_versions": {_payload("pv-key"): _payload("pv-value")}}
    common = {"device": device, "provider": "fa4", "source_fingerprint": _payload("fingerprint"),
              "study_name": _payload("study"), "versions": {_payload("v-key"): _payload("v-value")}}
    configs = [config_to_dict(c) for c in list(iter_configs(FwdConfigSm90))[:3]]
    bodies = []
    for seqlen in (4096, 8192):
        prob = {"batch": 16384 // seqlen, "seqlen_q": seqlen, "seqlen_k": seqlen, "heads_q": 16, "heads_kv": 16,
                "head_dim": 128, "head_dim_v": 128}
        for i, cfg in enumerate(configs):
            bodies.append({**common, "problem": prob, "config": cfg, "status": "ok", "median_ms": 1.0 + i,
                           "tflops": 300.0 + 10 * i + seqlen / 1024, "is_default": i == 0, "trial_number": i,
                           "study_name": _payload(f"study-{seqlen}")})
        bodies.append({**common, "problem": prob, "config": configs[0], "status": "compile_error",
                       "reason": _payload("reason"), "trial_number": 3, "study_name": _payload(f"study-{seqlen}"),
                       "idempotency_key": f"failed-{seqlen}"})
    for det, tflops in ((False, 400.0), (True, 360.0)):
        bodies.append({**common, "problem": {"batch": 4, "seqlen_q": 4096, "seqlen_k": 4096, "heads_q": 16,
                                             "heads_kv": 16, "head_dim": 128, "head_dim_v": 128, "pass": "bwd",
                                             "deterministic": det},
                       "config": {}, "status": "ok", "median_ms": 1.0, "tflops": tflops, "study_name": None})
    try:
        for body in bodies:
            r = s.http.post("/v1/results", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
            assert r.status_code == 201, r.text
        yield s
    finally:
        s.stop()


def test_script_in_every_free_text_field_never_runs(browser, hostile_server):
    page = Page(browser, hostile_server.url + "/", init_script="window.__xss = [];")
    dialogs = []
    page.page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    try:
        assert [page.state(v) for v in VIEWS] == ["ready"] * len(VIEWS), page.problems
        # Every data point of every chart shows its tooltip (the HTML part of the page).
        shown = page.page.evaluate("""async () => {
            const out = {};
            for (const [id, c] of Object.entries(window.fa4dash.charts)) {
              out[id] = [];
              c.getOption().series.forEach((s, si) => s.data.forEach((_, di) => {
                c.dispatchAction({ type: "showTip", seriesIndex: si, dataIndex: di });
                out[id].push(document.getElementById(id).innerText);
              }));
              await new Promise((r) => setTimeout(r, 50));
            }
            return out;
          }""")
        page.page.wait_for_timeout(300)
        text = page.page.inner_text("body")
        assert page.page.evaluate("() => window.__xss") == [] and dialogs == []
        assert page.page.evaluate("() => document.querySelectorAll('img').length") == 0
        # The strings are shown, as text: the study and device selectors, the failed trial, the tooltips.
        assert _payload("study-8192") in page.filter_options("study", "study")
        assert _payload("device") in page.filter_options("throughput", "device")
        assert _payload("reason") in text
        tips = {k: " ".join(v) for k, v in shown.items()}
        assert _payload("study-4096") in tips["chart-gain"] or _payload("study-8192") in tips["chart-gain"]
        assert "fa4 tuned" in tips["chart-throughput"] and "trial 1" in tips["chart-history"]
        assert "deterministic" in tips["chart-determinism"]
        assert page.problems == []
    finally:
        page.close()


def test_the_page_fits_a_420px_viewport(browser, demo_server):
    page = Page(browser, demo_server.url + "/", width=420)
    try:
        page.screenshot("demo-420px")
        assert [page.state(v) for v in VIEWS] == ["ready"] * len(VIEWS)
        widths = page.page.evaluate("""() => ({ doc: document.documentElement.scrollWidth,
            widest: Math.max(...[...document.querySelectorAll('body *')].map((e) => e.getBoundingClientRect().right)) })""")
        assert widths["doc"] <= 420 and widths["widest"] <= 420, widths
        assert page.problems == []
    finally:
        page.close()


def test_the_demo_says_whether_its_numbers_are_of_the_running_kernels(demo_page, demo_server):
    """The shipped demo was measured with the kernels of ``service.demo.MEASURED_SOURCE``: when the
    running kernels are other ones (any later kernel change), the page must say so, naming both;
    when they are the same, it says the numbers are current. Either way the line is on the page."""
    from fa4.fingerprint import source_fingerprint
    from service import demo

    running = next(p for p in demo_server.get("/v1/providers") if p["name"] == "fa4")["source_fingerprint"]
    assert running == source_fingerprint()
    rows = demo_server.results(provider="fa4")
    assert rows and {r["source_fingerprint"] for r in rows} == {demo.MEASURED_SOURCE}
    line = demo_page.page.locator("#provenance")
    line.wait_for(state="visible")
    text = line.inner_text()
    if demo.MEASURED_SOURCE != running:
        assert line.get_attribute("data-state") == "stale"
        assert f"{len(rows)} of {len(rows)} fa4 measurements are of older kernels" in text
        assert demo.MEASURED_SOURCE in text and running in text
    else:
        assert line.get_attribute("data-state") == "current" and running in text


def test_value_head_dim_is_a_filter_offered_per_head_dim(browser, bwd_server):
    """The problem filters come from GET /v1/problem-fields; head_dim_v offers the value head dims
    of the chosen head dim only, and a 192/128 shape is its own series, not merged with 192/192."""
    from store.store import FAMILY_FIELDS

    fields = [f["name"] for f in bwd_server.get("/v1/problem-fields")]
    assert fields == ["pass" if f == "pass_" else f for f in FAMILY_FIELDS] and "head_dim_v" in fields
    # Every field the page offers as a filter is one the API declares (none listed in the page).
    for f in ("head_dim", "head_dim_v", "causal"):
        assert f in fields
    device = _device_payload(bwd_server)
    for dv, tflops in ((192, 610.0), (128, 655.0)):
        body = {"device": device, "provider": "fa4", "config": {}, "status": "ok", "median_ms": 1.0, "tflops": tflops,
                "problem": {"batch": 2, "seqlen_q": 8192, "seqlen_k": 8192, "heads_q": 10, "heads_kv": 10,
                            "head_dim": 192, "head_dim_v": dv}}
        r = bwd_server.http.post("/v1/results", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 201, r.text
    page = Page(browser, bwd_server.url + "/")
    try:
        assert "192" in page.filter_options("throughput", "head_dim")
        start = page.filter_value("throughput", "head_dim")
        assert page.filter_options("throughput", "head_dim_v") == [start]  # the demo's shapes have dv == d
        page.choose("throughput", "head_dim", "192")
        page.settle("throughput", raw_has="head_dim=192")
        assert page.filter_options("throughput", "head_dim_v") == ["128", "192"]
        for dv in ("192", "128"):
            page.choose("throughput", "head_dim_v", dv)
            page.settle("throughput", raw_has=f"head_dim_v={dv}")
            params = _query(page.raw("throughput"))
            assert (params["head_dim"], params["head_dim_v"]) == ("192", dv)
            got = _by_name(page.series("chart-throughput"))
            _assert_points(got, expected_throughput(bwd_server.results(**params)))
            assert got and all(p[1] == (655.0 if dv == "128" else 610.0) for pts in got.values() for p in pts)
        assert page.problems == []
    finally:
        page.close()


@pytest.fixture(scope="module")
def decode_server(tmp_path_factory):
    """The demo DB plus a decode study (issue 19: provider fa4-decode, TB/s in its tflops column) of the
    demo's device, posted through the API after the recorded rows: the newest study."""
    from service.demo import build_demo_db

    url = f"sqlite:///{tmp_path_factory.mktemp('decode') / 'decode.db'}"
    build_demo_db(url)
    s = Server("--db", url, token=TOKEN)
    try:
        device = _device_payload(s)
        problem = {"kind": "decode", "batch": 1, "seqlen_q": 1, "seqlen_k": 8192, "heads_q": 32, "heads_kv": 8,
                   "head_dim": 128, "page_size": 256, "seqlen_k_mean": 0, "dtype": "bf16", "causal": False}
        for n, (splits, tbps) in enumerate(((0, 1.253), (8, 1.291), (16, 1.25), (4, 1.1))):
            body = {"device": device, "provider": "fa4-decode", "problem": problem, "status": "ok",
                    "config": {"num_splits": splits}, "median_ms": 0.026, "tflops": tbps, "is_default": n == 0,
                    "study_name": "decode-test-study", "trial_number": n}
            r = s.http.post("/v1/results", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
            assert r.status_code == 201, r.text
        yield s
    finally:
        s.stop()


def test_decode_rows_stay_out_of_the_attention_charts_and_show_as_a_study(browser, decode_server):
    page = Page(browser, decode_server.url + "/")
    try:
        for view in ("throughput", "gain"):  # the backward view asks for pass=bwd: no decode row has it
            assert _query(page.raw(view)).get("kind") == "attention", view
        assert all(r["provider"] != "fa4-decode" for r in decode_server.results(**_query(page.raw("determinism"))))
        params = _query(page.raw("throughput"))
        rows = decode_server.results(**params)
        assert rows and all(r["provider"] != "fa4-decode" for r in rows)
        got = _by_name(page.series("chart-throughput"))
        _assert_points(got, expected_throughput(rows))
        assert not any(p[0] == 1 for pts in got.values() for p in pts)  # no decode step at seqlen_q 1
        # The decode study is the newest: the study view opens on it with the decode knobs as axes.
        assert page.filter_value("study", "study") == "decode-test-study"
        knobs = decode_server.get("/v1/providers/fa4-decode/knobs")["passes"]["decode"]["knobs"]
        axes = page.option("chart-parallel", "parallelAxis")
        assert [a["name"] for a in axes] == [k["name"] for k in knobs] + ["TFLOP/s"]
        history = _by_name(page.series("chart-history"))
        assert sorted(history["TFLOP/s"] + history["default config"]) == [[0, 1.253], [1, 1.291], [2, 1.25],
                                                                           [3, 1.1]]
        page.screenshot("decode-study")
        assert page.problems == []
    finally:
        page.close()
