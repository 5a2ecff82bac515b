"""Send finished results to a remote fa4-tune service (``fa4-tune --push URL``).

Every measurement of the tuned studies goes out as one ``POST /v1/results`` with the
service's bearer token ($FA4_API_TOKEN). Each carries an idempotency key derived from the
measurement itself (device, problem, config, numbers and timestamp), so a retry after a lost
answer, or pushing the same study again after a re-run, stores nothing twice. A push that
fails is reported and never touches the local results: run the command again to resend.
"""

from __future__ import annotations

import hashlib
import time

from fa4.timing import DEFAULT_TIMING
from store.store import canonical_json

TOKEN_ENV = "FA4_API_TOKEN"
DEVICE_FIELDS = ("name", "compute_capability", "sm_count", "l2_bytes", "memory_bytes", "driver", "cuda",
                 "torch", "cutlass_dsl", "provider_versions")
ROW_FIELDS = ("provider", "problem", "config", "status", "reason", "samples_ms", "median_ms", "iqr_ms", "tflops",
              "error", "ref_error", "source_fingerprint", "study_name", "trial_number", "is_default", "versions",
              "created_at")
RETRY_STATUSES = (429, 502, 503, 504)


def result_payload(row: dict, device: dict) -> dict:
    """The service's ResultIn body for one stored measurement (see service/schemas.py)."""
    dev = {k: device.get(k) for k in DEVICE_FIELDS}
    dev["provider_versions"] = {str(k): str(v) for k, v in (device.get("provider_versions") or {}).items()}
    body = {k: row.get(k) for k in ROW_FIELDS}
    # The timing mode travels when it is not the default (the service's default), so a row pushed
    # before timing modes existed keeps its idempotency key.
    if row.get("timing", DEFAULT_TIMING) != DEFAULT_TIMING:
        body["timing"] = row["timing"]
    body["device"] = dev
    return body


def idempotency_key(payload: dict) -> str:
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


class Unreachable(RuntimeError):
    pass


def _post(client, payload: dict, key: str, attempts: int, backoff_s: float):
    """(status, body) of the first definitive answer; raises Unreachable when none came."""
    import httpx

    last = None
    for i in range(attempts):
        if i:
            time.sleep(backoff_s * 2 ** (i - 1))
        try:
            r = client.post("/v1/results", json=payload, headers={"Idempotency-Key": key})
        except httpx.TransportError as e:  # connection refused, reset, timeout: maybe stored, retry
            last = f"{type(e).__name__}: {e}"
            continue
        if r.status_code in RETRY_STATUSES or r.status_code >= 500:
            last = f"HTTP {r.status_code}"
            continue
        return r.status_code, r
    raise Unreachable(last or "no answer")


def push_results(store, study_names: list[str], url: str, token: str, *, attempts: int = 4,
                 backoff_s: float = 0.5, timeout_s: float = 30.0, transport=None) -> dict:
    """Send every measurement of ``study_names`` from ``store``; returns a report, never raises."""
    import httpx

    report = {"url": url, "rows": 0, "created": 0, "already_there": 0, "failed": 0, "errors": []}
    devices: dict[int, dict] = {}
    rows = [r for name in study_names for r in store.measurements(study_name=name)]
    report["rows"] = len(rows)
    headers = {"Authorization": f"Bearer {token}"}
    try:
        client = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout_s, transport=transport)
    except Exception as e:  # a malformed URL
        report.update(failed=len(rows), errors=[f"cannot use {url}: {e}"])
        return report
    with client:
        for n, row in enumerate(rows):
            if row["device_id"] not in devices:
                devices[row["device_id"]] = store.get_device(row["device_id"]) or {}
            payload = result_payload(row, devices[row["device_id"]])
            try:
                status, r = _post(client, payload, idempotency_key(payload), attempts, backoff_s)
            except Unreachable as e:
                # The service is down or failing: the rest would fail the same way, slowly.
                report["failed"] += len(rows) - n
                report["errors"].append(f"service unreachable after {attempts} attempts ({e}); "
                                        f"{len(rows) - n} results not sent")
                break
            if status in (200, 201):
                report["created" if r.json().get("created") else "already_there"] += 1
                continue
            try:
                msg = r.json().get("error") or r.text
            except ValueError:
                msg = r.text
            if status in (401, 403):  # the token is wrong for every row alike
                report["failed"] += len(rows) - n
                report["errors"].append(f"HTTP {status}: {str(msg)[:200]}; {len(rows) - n} results not sent")
                break
            report["failed"] += 1
            if len(report["errors"]) < 5:
                report["errors"].append(f"HTTP {status} for trial {row['trial_number']} "
                                        f"of {row['study_name']}: {str(msg)[:200]}")
    return report


def describe(report: dict) -> str:
    head = (f"push to {report['url']}: {report['rows']} results, {report['created']} new, "
            f"{report['already_there']} already there, {report['failed']} failed")
    return "; ".join([head, *report["errors"]])
