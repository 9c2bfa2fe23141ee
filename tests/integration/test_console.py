"""The console in a real browser: Debian's headless Chromium driven by Selenium through Debian's
chromedriver (the same package version as the browser, so they always match).

Each page a test visits is saved as a screenshot under build/console-screenshots/ (CI keeps the
directory; nothing is committed)."""

from __future__ import annotations

import re
import secrets
import shutil
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from execbox.core.poison import Guard
from execbox.keyschema import Keys
from tests.conftest import ROOT, Redis, Side, Stack, run_code

pytestmark = [pytest.mark.docker, pytest.mark.redis]
SHOTS = ROOT / "build" / "console-screenshots"
PWNED = "document.title='pwned';window.pwned=1"
PAYLOAD = f'<script>{PWNED}</script><img src=x onerror="{PWNED}">'


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not binary or not driver:
        pytest.fail(
            "chromium and chromedriver are not installed: run scripts/install (apt-get install chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    # --no-sandbox: Chromium refuses to start as root with its own sandbox; it only loads our pages.
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1000",
    ):
        options.add_argument(flag)
    SHOTS.mkdir(parents=True, exist_ok=True)
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    yield chrome
    chrome.quit()


def shot(browser: WebDriver, name: str) -> None:
    browser.save_screenshot(str(SHOTS / f"{name}.png"))


def sign_in(browser: WebDriver, base_url: str, key: str) -> None:
    browser.delete_all_cookies()
    browser.get(f"{base_url}/console/signin")
    browser.find_element(By.ID, "key").send_keys(key)
    browser.find_element(By.ID, "signin").click()
    WebDriverWait(browser, 10).until(lambda b: "/signin" not in b.current_url)


def text_of(browser: WebDriver, element_id: str) -> str:
    return str(browser.find_element(By.ID, element_id).text)


def nothing_ran(browser: WebDriver) -> None:
    """No payload became markup, and no script ran: the page has no script or handler at all."""
    assert browser.title != "pwned" and not browser.execute_script("return window.pwned === 1")
    assert browser.execute_script("return document.scripts.length") == 0
    assert browser.execute_script("return document.querySelectorAll('[onerror], iframe, object, embed').length") == 0


def wait_text(browser: WebDriver, element_id: str, wanted: str, timeout: float = 90) -> None:
    """Wait for the page's own refresh to show `wanted` in the element (the page reloads itself)."""

    def shown(b: WebDriver) -> bool:
        found = b.find_elements(By.ID, element_id)
        return bool(found) and found[0].text == wanted

    WebDriverWait(browser, timeout, poll_frequency=0.5).until(shown, f"{element_id} never showed {wanted!r}")


def gated_plan(summary: str, objective: str = "send the report") -> dict[str, Any]:
    send = {"id": "send", "run": {"code": "import execbox\nexecbox.emit('sent', execbox.inputs['to'])\n"},
            "args": {"to": {"$ref": "/inputs/to"}}, "effect": "write", "idempotency": {"strategy": "key"},
            "approval": {"summary": summary}}  # fmt: skip
    draft = {"id": "draft", "run": {"code": "print('drafted')"}}
    send["depends_on"] = ["draft"]
    return {"format": "plan/v1", "objective": objective, "inputs": {"to": "ops@example.com"}, "steps": [draft, send]}


def awaiting(api: httpx.Client, run_id: str) -> dict[str, Any]:
    run: dict[str, Any] = api.get(f"/v1/runs/{run_id}").json()
    for _ in range(30):
        if run["status"] == "awaiting_approval":
            return run
        run = api.get(f"/v1/runs/{run_id}?wait=30&after={len(run['events'])}").json()
    raise AssertionError(f"run {run_id} never waited for its approval")


def test_sign_in_approve_a_gated_step_and_watch_the_run_succeed(
    api: httpx.Client, stack: Stack, browser: WebDriver
) -> None:
    run = awaiting(api, api.post("/v1/runs", json={"plan": gated_plan("send the weekly report")}).json()["id"])
    approval_id = run["steps"]["send"]["approval_id"]
    sign_in(browser, stack.base_url, stack.keys["alpha"])
    assert browser.current_url.endswith("/console/approvals")
    shot(browser, "approvals")
    card = browser.find_element(By.ID, f"approval-{approval_id}")
    assert "send the weekly report" in card.text and "ops@example.com" in card.find_element(By.CLASS_NAME, "args").text
    assert "draft · succeeded" in card.text, "the plan around the step is shown"
    card.find_element(By.NAME, "reason").send_keys("looks right")
    card.find_element(By.NAME, "decided_by").send_keys("alice")
    card.find_element(By.CSS_SELECTOR, "button.approve").click()
    WebDriverWait(browser, 10).until(lambda b: not b.find_elements(By.ID, f"approval-{approval_id}"))
    decided = [row.text for row in browser.find_elements(By.CSS_SELECTOR, "tr.decided") if approval_id in row.text]
    assert decided and "approved" in decided[0] and "looks right" in decided[0], decided

    browser.get(f"{stack.base_url}/console/runs/{run['id']}")
    wait_text(browser, "run-status", "succeeded")
    shot(browser, "run")
    steps = {row.get_attribute("data-step"): row.text for row in browser.find_elements(By.CSS_SELECTOR, "tr.step")}
    assert "succeeded" in steps["send"] and "succeeded" in steps["draft"]
    nodes = browser.find_elements(By.CSS_SELECTOR, "svg.graph g.node")
    assert {n.get_attribute("data-step"): n.get_attribute("class") for n in nodes} == {
        "draft": "node succeeded", "send": "node succeeded"}  # fmt: skip
    events = text_of(browser, "events")
    assert "awaiting_approval" in events and "succeeded" in events, events
    finished = api.get(f"/v1/runs/{run['id']}").json()
    assert finished["status"] == "succeeded" and finished["steps"]["send"]["outputs"] == {"sent": "ops@example.com"}
    browser.find_element(By.CSS_SELECTOR, "tr.step[data-step=send] a.attempt").click()
    WebDriverWait(browser, 10).until(lambda b: b.find_elements(By.ID, "execution-status"), "the step's execution")
    assert "/console/executions/exe_" in browser.current_url and text_of(browser, "execution-status") == "succeeded"


def test_an_execution_page_shows_its_chart_and_artifacts(api: httpx.Client, stack: Stack, browser: WebDriver) -> None:
    done = run_code(api, "import execbox, matplotlib.pyplot as plt\n"
                         "open(execbox.output_dir + '/numbers.csv', 'w').write('a,b\\n1,2\\n')\n"
                         "plt.plot([3, 1, 2])\nplt.show()\nprint('drawn')\n")  # fmt: skip
    assert done["status"] == "succeeded", done
    sign_in(browser, stack.base_url, stack.keys["alpha"])
    browser.get(f"{stack.base_url}/console/executions/{done['id']}")
    shot(browser, "execution")
    assert text_of(browser, "stdout") == "drawn"
    image = browser.find_element(By.CLASS_NAME, "result-image")
    WebDriverWait(browser, 10).until(lambda b: b.execute_script("return arguments[0].complete", image))
    assert browser.execute_script("return arguments[0].naturalWidth", image) > 100, "the chart loaded and decoded"
    rows = browser.find_element(By.ID, "artifacts").text
    csv = next(a for a in done["artifacts"] if a["name"] == "numbers.csv")
    assert "numbers.csv" in rows and csv["sha256"] in rows
    link = str(browser.find_element(By.LINK_TEXT, "download").get_attribute("href"))
    cookie = {c["name"]: c["value"] for c in browser.get_cookies()}
    got = httpx.get(link, cookies=cookie)
    assert got.status_code == 200 and got.content == b"a,b\n1,2\n"
    assert (
        got.headers["content-disposition"].startswith("attachment")
        and "sandbox" in got.headers["content-security-policy"]
    )


def test_hostile_stdout_artifact_names_and_plan_text_execute_nothing(
    api: httpx.Client, stack: Stack, browser: WebDriver
) -> None:
    name = "<img src=x onerror=\"document.title='pwned'\">.txt"
    code = f"import execbox\nprint({PAYLOAD!r})\nopen(execbox.output_dir + '/' + {name!r}, 'w').write('x')\n"
    done = run_code(api, code)
    assert done["status"] == "succeeded" and any(a["name"] == name for a in done["artifacts"]), done
    run = awaiting(api, api.post("/v1/runs", json={"plan": gated_plan(PAYLOAD, objective=PAYLOAD)}).json()["id"])
    refused = api.post(
        "/v1/runs", json={"plan": {"format": "plan/v1", "steps": [{"id": "<script>", "run": {"code": "1"}}]}}
    )
    assert refused.status_code == 422 and "steps.0.id" in refused.text, "a step id cannot carry markup at all"

    sign_in(browser, stack.base_url, stack.keys["alpha"])
    browser.get(f"{stack.base_url}/console/executions/{done['id']}")
    shot(browser, "hostile-execution")
    nothing_ran(browser)
    assert text_of(browser, "stdout") == PAYLOAD and name in text_of(browser, "artifacts")
    for page in ("approvals", f"runs/{run['id']}", "runs"):
        browser.get(f"{stack.base_url}/console/{page}")
        shot(browser, "hostile-" + page.split("/")[0])
        nothing_ran(browser)
        assert PAYLOAD in browser.find_element(By.TAG_NAME, "main").text, page
    policy = httpx.get(f"{stack.base_url}/console/signin").headers["content-security-policy"]
    assert "script-src" not in policy and "default-src 'none'" in policy and "unsafe-inline" not in policy
    api.post(f"/v1/runs/{run['id']}/cancel")


def test_another_tenants_key_sees_nothing_of_the_first(api: httpx.Client, stack: Stack, browser: WebDriver) -> None:
    run = awaiting(api, api.post("/v1/runs", json={"plan": gated_plan("alpha only")}).json()["id"])
    done = run_code(api, "import execbox\nopen(execbox.output_dir + '/secret.txt', 'w').write('alpha data')")
    sign_in(browser, stack.base_url, stack.keys["beta"])
    assert "beta" in text_of(browser, "who")
    assert run["steps"]["send"]["approval_id"] not in browser.page_source
    shot(browser, "beta-approvals")
    for path in (f"runs/{run['id']}", f"executions/{done['id']}", f"executions/{done['id']}/artifacts/secret.txt"):
        browser.get(f"{stack.base_url}/console/{path}")
        assert "404" in browser.title and "alpha" not in browser.find_element(By.TAG_NAME, "main").text, path
    browser.get(f"{stack.base_url}/console/runs")
    assert run["id"] not in browser.page_source
    api.post(f"/v1/runs/{run['id']}/cancel")


def test_forms_from_elsewhere_and_without_the_form_token_are_refused(api: httpx.Client, stack: Stack) -> None:
    run = awaiting(api, api.post("/v1/runs", json={"plan": gated_plan("csrf target")}).json()["id"])
    approval_id = run["steps"]["send"]["approval_id"]
    origin = {"Origin": stack.base_url}
    with httpx.Client(base_url=stack.base_url) as web:
        assert web.post("/console/signin", data={"key": stack.keys["alpha"]}).status_code == 403, "no Origin"
        signed = web.post("/console/signin", data={"key": stack.keys["alpha"]}, headers=origin)
        assert signed.status_code == 303
        cookie = signed.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/console" in cookie
        page = web.get("/console/approvals").text
        token = re.search(r'name="form_token" value="([^"]+)"', page)
        assert token is not None
        decision = {"decision": "approve", "form_token": token.group(1)}
        elsewhere = web.post(f"/console/approvals/{approval_id}/decision", data=decision,
                             headers={"Origin": "http://evil.example"})  # fmt: skip
        tokenless = web.post(f"/console/approvals/{approval_id}/decision", data={"decision": "approve"}, headers=origin)
        assert elsewhere.status_code == 403 and tokenless.status_code == 403
        assert api.get(f"/v1/approvals/{approval_id}").json()["status"] == "pending", "nothing was decided"
        assert web.post("/console/signout", data={"form_token": token.group(1)}, headers=origin).status_code == 303
        assert web.get("/console/approvals").headers["location"] == "/console/signin"
    api.post(f"/v1/runs/{run['id']}/cancel")


def test_the_operator_sees_the_fleet_and_drops_a_dead_letter(
    stack: Stack, side_stack: Any, redis_server: Redis, browser: WebDriver
) -> None:
    token = "admin-" + secrets.token_hex(16)
    side: Side = side_stack(EXECBOX_AUTH__ADMIN_TOKEN=token)
    harness = redis.Redis.from_url(redis_server.url)
    keys = Keys(stack.prefix)
    source = f"{stack.prefix}:console-test-due"
    harness.zadd(source, {"poisoned-item": 0})

    def fail() -> None:
        raise ValueError("a poisoned item for the console test")

    Guard(harness, keys, "scheduler", (source,), max_attempts=1).record(source, "poisoned-item", fail)
    sign_in(browser, side.base_url, token)
    assert browser.current_url.endswith("/console/operators")
    shot(browser, "operators")
    assert "worker-1" in text_of(browser, "workers") and text_of(browser, "queue-depth").isdigit()
    assert "alpha" in text_of(browser, "tenants")
    row = next(r for r in browser.find_elements(By.CSS_SELECTOR, "#dead-letters tr") if "poisoned-item" in r.text)
    row.find_element(By.TAG_NAME, "a").click()
    WebDriverWait(browser, 10).until(lambda b: b.find_elements(By.ID, "letter"), "the dead letter's page")
    assert "a poisoned item for the console test" in text_of(browser, "letter")
    browser.find_element(By.CSS_SELECTOR, "button[value=drop]").click()
    WebDriverWait(browser, 10).until(lambda b: b.current_url.endswith("/console/operators"))
    assert "poisoned-item" not in text_of(browser, "dead-letters")
    browser.get(f"{side.base_url}/console")
    assert browser.current_url.endswith("/console/operators"), "the operator's first page"
    browser.get(f"{side.base_url}/console/runs")
    assert "403" in browser.title, "the operator's sign-in has no tenant's data"
    sign_in(browser, side.base_url, stack.keys["alpha"])
    browser.get(f"{side.base_url}/console/operators")
    assert "403" in browser.title, "a tenant's key is no operator"
    harness.delete(source)


def test_a_wrong_key_is_refused_and_signed_out_pages_send_to_the_sign_in(stack: Stack, browser: WebDriver) -> None:
    browser.delete_all_cookies()
    browser.get(f"{stack.base_url}/console/runs")
    assert browser.current_url.endswith("/console/signin")
    sign_in_form = browser.find_element(By.ID, "key")
    sign_in_form.send_keys("ebx_nothing_" + secrets.token_hex(8))
    browser.find_element(By.ID, "signin").click()
    WebDriverWait(browser, 10).until(lambda b: b.find_elements(By.ID, "problem"), "the sign-in page's answer")
    assert "not a valid API key" in text_of(browser, "problem")
    assert not browser.get_cookies()


def test_a_running_executions_output_shows_live_and_a_long_one_is_paged(
    api: httpx.Client, stack: Stack, browser: WebDriver
) -> None:
    code = "import time\nfor i in range(120):\n    print('tick', i, flush=True)\n    time.sleep(0.5)\n"
    running = api.post("/v1/executions", json={"language": "python", "code": code, "policy": {"timeout_s": 90}}).json()
    sign_in(browser, stack.base_url, stack.keys["alpha"])
    browser.get(f"{stack.base_url}/console/executions/{running['id']}")

    def ticked(b: WebDriver) -> bool:
        found = b.find_elements(By.ID, "stdout")
        return bool(found) and "tick 2" in found[0].text

    WebDriverWait(browser, 60, poll_frequency=0.5).until(ticked, "live output on the page")
    assert text_of(browser, "execution-status") == "running", "shown while it runs, before the record has it"
    shot(browser, "execution-live")
    api.post(f"/v1/executions/{running['id']}/cancel")

    long = run_code(api, "print('x' * 200_000)")
    assert long["status"] == "succeeded" and len(long["stdout"]) == 200_001
    browser.get(f"{stack.base_url}/console/executions/{long['id']}")
    assert "page 1 of 4" in browser.find_element(By.TAG_NAME, "main").text
    assert len(text_of(browser, "stdout")) == 64 * 1024
    browser.find_element(By.ID, "stdout-next").click()
    WebDriverWait(browser, 10).until(lambda b: "page 2 of 4" in b.find_element(By.TAG_NAME, "main").text)


def http_sign_in(web: httpx.Client, key: str) -> None:
    assert (
        web.post("/console/signin", data={"key": key}, headers={"Origin": str(web.base_url).rstrip("/")}).status_code
        == 303
    )


def test_a_failed_run_a_scripts_code_and_bad_parameters_are_pages(api: httpx.Client, stack: Stack) -> None:
    failing = {"format": "plan/v1", "steps": [{"id": "boom", "run": {"code": "raise SystemExit(3)"}}]}
    run = api.post("/v1/runs", json={"plan": failing}).json()
    while run["status"] == "running":
        run = api.get(f"/v1/runs/{run['id']}?wait=30&after={len(run['events'])}").json()
    api.post(f"/v1/runs/{run['id']}/cancel")
    name = f"console-{secrets.token_hex(3)}"
    code = "import execbox\nexecbox.emit('shown', '<b>the code</b>')\n"
    created = api.post("/v1/scripts", json={"name": name, "version": "1.0.0", "code": code, "description": "d"})
    assert created.status_code == 201, created.text
    with httpx.Client(base_url=stack.base_url, timeout=60) as web:
        http_sign_in(web, stack.keys["alpha"])
        page = web.get(f"/console/runs/{run['id']}")
        assert page.status_code == 200 and "code.exit_nonzero" in page.text, page.text[:500]
        script = web.get(f"/console/scripts/{name}")
        assert (
            script.status_code == 200
            and "execbox.emit(&#39;shown&#39;, &#39;&lt;b&gt;the code&lt;/b&gt;&#39;)" in script.text
        )
        for path, status in ((f"/console/executions/exe_{'a' * 26}?out=0", 422), ("/console/nowhere", 404)):
            answer = web.get(path)
            assert answer.status_code == status and answer.headers["content-type"].startswith("text/html"), path
            assert "default-src 'none'" in answer.headers["content-security-policy"], path
        assert web.get("/v1/nowhere").headers["content-type"].startswith("application/problem+json"), "the API's own"


def test_an_approval_that_outlived_its_run_does_not_stop_the_inbox(
    api: httpx.Client, stack: Stack, redis_server: Redis
) -> None:
    run = awaiting(api, api.post("/v1/runs", json={"plan": gated_plan("outlives its run")}).json()["id"])
    approval_id = run["steps"]["send"]["approval_id"]
    harness = redis.Redis.from_url(redis_server.url)
    assert harness.delete(f"{stack.prefix}:run:{run['id']}") == 1, "the run passed its retention"
    with httpx.Client(base_url=stack.base_url, timeout=60) as web:
        http_sign_in(web, stack.keys["alpha"])
        inbox = web.get("/console/approvals")
    assert inbox.status_code == 200 and approval_id in inbox.text
    assert f'id="approval-{approval_id}"' not in inbox.text, "it no longer waits for a decision"
    row = inbox.text[inbox.text.index(f"<td>{approval_id}</td>") :].split("</tr>")[0]
    assert 'class="withdrawn">withdrawn<' in row, "it ended with its run (issue 44: an approval ends with its subject)"
    assert f"/console/approvals/{approval_id}/decision" not in inbox.text, "no decision is offered for it"
