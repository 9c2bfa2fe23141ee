"""Metrics scraped by a real Prometheus, trace ids end to end, OTLP export, readiness detail."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
import yaml

from execbox.sandbox.runtime import EXECUTION_LABEL, TRACE_LABEL
from tests.conftest import Processes, Side, Stack, free_port, run_code, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.redis]


@pytest.fixture(scope="module")
def prometheus(stack: Stack, module_processes: Processes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed: run `scripts/install` (apt-get install prometheus)")
    workdir = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "execbox-api", "static_configs": [{"targets": [stack.base_url.removeprefix("http://")]}]},
            {"job_name": "execbox-worker", "static_configs": [{"targets": stack.worker_metrics}]},
        ],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    module_processes.spawn("prometheus", [binary, f"--config.file={workdir / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                    {"PATH": "/usr/bin:/bin"})  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: len(up_targets(url)) == 3, 30, "Prometheus to scrape the API and both workers")
    yield url


def query(url: str, promql: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=5)
    response.raise_for_status()
    result: list[dict[str, Any]] = response.json()["data"]["result"]
    return result


def scalar(url: str, promql: str) -> float:
    result = query(url, promql)
    return float(result[0]["value"][1]) if result else 0.0


def up_targets(url: str) -> list[dict[str, Any]]:
    try:
        return query(url, "up == 1")
    except httpx.HTTPError:
        return []


def test_prometheus_sees_outcomes_histograms_and_requests(api: httpx.Client, prometheus: str) -> None:
    queries = {
        "ok": 'sum(execbox_executions_total{status="succeeded",category="none",language="bash"})',
        "exception": 'sum(execbox_executions_total{status="failed",category="code.exception",language="python"})',
        "timeout": 'sum(execbox_executions_total{status="failed",category="limit.timeout",language="python"})',
        "runs": 'sum(execbox_run_seconds_count{language="python"})',
        "e2e": 'sum(execbox_end_to_end_seconds_count{language="bash"})',
        "posts": 'sum(execbox_api_requests_total{route="/v1/executions",method="POST",code="200"})',
        "accepted": 'sum(execbox_executions_accepted_total{language="python"})',
    }
    before = {name: scalar(prometheus, q) for name, q in queries.items()}
    run_code(api, "echo ok", language="bash")
    run_code(api, "echo again", language="bash")
    run_code(api, "raise KeyError('x')")
    run_code(api, "import time\ntime.sleep(30)", timeout_s=1)
    expected = {"ok": 2, "exception": 1, "timeout": 1, "runs": 2, "e2e": 2, "posts": 4, "accepted": 2}

    def moved() -> bool:
        return all(scalar(prometheus, queries[n]) - before[n] >= delta for n, delta in expected.items())

    wait_until(moved, 30, "Prometheus to scrape the new samples", step_s=0.5)
    after = {name: scalar(prometheus, q) for name, q in queries.items()}
    assert {n: after[n] - before[n] for n in expected} == expected  # exactly what ran, nothing else counted
    p95 = query(prometheus, "histogram_quantile(0.95, sum by (le) (execbox_end_to_end_seconds_bucket))")
    assert p95 and float(p95[0]["value"][1]) > 0
    gauges = {r["metric"]["__name__"] for r in query(prometheus, '{__name__=~"execbox_(queue_depth|workers_alive)"}')}
    assert gauges == {"execbox_queue_depth", "execbox_workers_alive"}
    assert scalar(prometheus, "max(execbox_workers_alive)") >= 2
    labels = {tuple(sorted(r["metric"])) for r in query(prometheus, "execbox_executions_total")}
    assert all("execution_id" not in names and "id" not in names for names in labels)  # bounded labels only


def test_trace_id_reaches_response_record_labels_and_logs(
    api: httpx.Client, stack: Stack, docker_client: docker.DockerClient
) -> None:
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    response = api.post(
        "/v1/executions",
        json={"language": "python", "code": "import time\ntime.sleep(1.5)"},
        headers={"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"},
    )
    body = response.json()
    assert body["trace_id"] == trace_id and response.headers["x-trace-id"] == trace_id
    containers = wait_until(
        lambda: docker_client.api.containers(filters={"label": f"{EXECUTION_LABEL}={body['id']}"}), 20, "the sandbox"
    )
    assert containers[0]["Labels"][TRACE_LABEL] == trace_id  # type: ignore[index]
    final = api.get(f"/v1/executions/{body['id']}?wait=30").json()
    assert final["status"] == "succeeded" and final["trace_id"] == trace_id
    record = api.get(f"/v1/executions/{body['id']}/record").json()
    assert record["trace_id"] == trace_id and record["worker"] and record["image"].startswith("sha256:")
    assert [t["status"] for t in record["transitions"]] == ["queued", "running", "succeeded"]
    assert record["policy"]["name"] == "default" and len(record["request_sha256"]) == 64

    def job_logged() -> list[dict[str, Any]]:
        """The execution's worker lines, once RQ has logged the job's end (after the result is out)."""
        found = [json.loads(line) for name in ("worker-1.log", "worker-2.log")
                 for line in (stack.logs / name).read_text().splitlines() if body["id"] in line]  # fmt: skip
        return found if any("Job OK" in e["message"] for e in found) else []

    lines: list[dict[str, Any]] = wait_until(job_logged, 20, "RQ's line about the job")  # type: ignore[assignment]
    assert any(entry.get("trace_id") == trace_id and entry["message"] == "execution finished" for entry in lines)
    assert all(entry["execution_id"] == body["id"] for entry in lines)
    # RQ's own lines carry the trace id too, from the moment the job's payload is read.
    rq_job_lines = [e for e in lines if e["logger"].startswith("rq.") and "Job OK" in e["message"]]
    assert rq_job_lines and all(e["trace_id"] == trace_id for e in rq_job_lines)


class _Receiver(BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def do_POST(self) -> None:
        self.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_spans_are_exported_over_otlp_only_when_configured(side_stack: Callable[..., Side]) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    try:
        side = side_stack(EXECBOX_TELEMETRY__OTLP_ENDPOINT=endpoint)
        side.worker("traced")
        trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
        with side.client() as client:
            body = client.post(
                "/v1/executions?wait=60",
                json={"language": "python", "code": "print(1)"},
                headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"},
            ).json()
        assert body["status"] == "succeeded"
        wanted = [
            b"execbox.api.create_execution",
            b"execbox.enqueue",
            b"execbox.queue_wait",
            b"execbox.sandbox_create",
            b"execbox.run",
            b"execbox.collect",
            b"execbox-api",
            b"execbox-worker",
        ]

        def exported() -> bool:
            data = b"".join(_Receiver.bodies)
            return bytes.fromhex(trace_id) in data and all(name in data for name in wanted)

        wait_until(exported, 20, "the spans of both services to arrive")
    finally:
        server.shutdown()
        server.server_close()


def test_readyz_reports_each_dependency(api: httpx.Client) -> None:
    checks = api.get("/readyz").json()["checks"]
    assert set(checks) == {"redis", "workers", "docker", "images", "loops"}
    assert all(check["ok"] for check in checks.values())
    assert set(checks["loops"]["loops"]) == {"plans", "scheduler", "surprises"}, "this API's background loops"


DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def dashboard_queries() -> list[str]:
    panels = json.loads((DEPLOY / "grafana" / "execbox-dashboard.json").read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def test_every_dashboard_query_parses_and_every_metric_it_charts_is_exported(
    api: httpx.Client, prometheus: str
) -> None:
    """The Grafana dashboard stays importable without Grafana: its queries are valid PromQL for a real
    Prometheus, and each metric they name has a series once the service has run something."""
    queries = dashboard_queries()
    charted = {name for expr in queries for name in re.findall(r"\bexecbox_[a-z_]+", expr)}
    assert len(queries) >= 10 and len(charted) >= 10
    for expr in queries:
        answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=5)
        assert answer.status_code == 200, (expr, answer.text)  # a parse error is a 400
    run_code(api, "print(1)")  # per-language histograms get their first sample
    run_code(api, "echo 1", language="bash")

    def missing() -> set[str]:
        exported = {r["metric"]["__name__"] for r in query(prometheus, '{__name__=~"execbox_.+"}')}
        return charted - exported

    wait_until(lambda: not missing(), 30, "every charted metric to be scraped", step_s=0.5)


def test_deploy_prometheus_files_pass_promtool() -> None:
    root = DEPLOY / "prometheus"
    for args in (["check", "config", str(root / "prometheus.yml")], ["check", "config", str(root / "compose.yml")],
                 ["check", "rules", str(root / "rules.yml")]):  # fmt: skip
        done = subprocess.run(["promtool", *args], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
