"""The Prefect UI of a completed deployment run, in a real browser: the task graph, the metrics table and the
learning curve render.

The run goes the operator's way (server on 127.0.0.1, pool, deploy, `deployment run`, `worker --run-once`); the page
is then read by Debian's chromium (`make browser-deps`) driven by Playwright. Screenshots go to the test's temp dir;
with GYMFLOW_SCREENSHOT set, the run page's is also copied there (docs/ui-flow-run.png is made this way).
"""
from __future__ import annotations

import os
import shutil
import struct
import time
from pathlib import Path

import pytest

from tests.prefect_server import api_post, flow_run_state, prefect, prefect_server, run_deployment

pytestmark = [pytest.mark.slow]
CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(f"Debian's chromium is not installed at {CHROMIUM}: `make browser-deps` installs it "
                "(apt-get install -y chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed: `make install` brings it "
                                                              "(the dev extra)")

RUN_NAME = "ui"
COMPLETED_GREEN = (33, 157, 75)  # the UI's colour of a Completed task run's bar in the graph
ARTIFACT_LINKS = 'a[href*="/artifacts/artifact/"]'


@pytest.fixture
def completed_run(tmp_path):
    """A `train-control/train` run (tiny preset) completed through a worker; yields (UI url, flow run id, env)."""
    timings = {}
    began = time.monotonic()
    with prefect_server(tmp_path) as env:
        timings["server_s"] = time.monotonic() - began
        prefect(["work-pool", "create", "gymflow", "--type", "process"], env)
        prefect(["--no-prompt", "deploy", "--name", "train"], env)
        run_id = run_deployment("train-control/train", {"preset": "tiny", "run_name": RUN_NAME,
                                                        "store": f"file://{tmp_path}/runs"}, env)
        prefect(["worker", "start", "--pool", "gymflow", "--run-once"], env, timeout=600)
        assert flow_run_state(run_id, env) == "COMPLETED"
        timings["completed_run_s"] = time.monotonic() - began
        yield env["PREFECT_API_URL"].removesuffix("/api"), run_id, env, timings


def test_a_completed_runs_page_shows_its_graph_metrics_and_learning_curve(completed_run, tmp_path) -> None:
    from rl_core.reporting import read_metrics

    url, run_id, env, timings = completed_run
    browser_began = time.monotonic()
    task_runs = api_post(env, "task_runs/filter", {"flow_runs": {"id": {"any_": [run_id]}}})
    iterations = len(read_metrics(f"file://{tmp_path}/runs/{RUN_NAME}"))
    curve_size = _png_size(tmp_path / "runs" / RUN_NAME / "reports" / "learning-curve.png")
    shots = tmp_path / "screenshots"
    shots.mkdir()
    page_errors: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"], headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("pageerror", lambda err: page_errors.append(str(err)))
            page.goto(f"{url}/runs/flow-run/{run_id}")

            # The task graph is drawn on a canvas (WebGL): it has a size and, once drawn, the run's Completed bars.
            graph = page.locator(".flow-run-graph canvas").first
            graph.wait_for(state="visible")
            box = graph.bounding_box()
            assert box and box["width"] > 100 and box["height"] > 100, box
            _wait_for_completed_bars(graph, shots / "graph.png")

            # Every task run is listed by name on the Task Runs tab.
            page.get_by_role("tablist").get_by_text("Task Runs", exact=True).click()
            listed = page.get_by_role("tabpanel", name="Task Runs")
            sync_api.expect(listed.get_by_text(f"{len(task_runs)} Task runs")).to_be_visible()
            for task_run in task_runs:
                sync_api.expect(listed.get_by_text(task_run["name"], exact=True)).to_be_visible()

            # The Artifacts tab links the run's artifacts; the run page (graph and artifacts) is the screenshot.
            page.get_by_role("tablist").get_by_text("Artifacts", exact=True).click()
            links = page.get_by_role("tabpanel", name="Artifacts").locator(ARTIFACT_LINKS)
            sync_api.expect(links.filter(has_text=f"{RUN_NAME}-summary")).to_be_visible()
            artifact_pages = {key: links.filter(has_text=key).first.get_attribute("href")
                              for key in (f"{RUN_NAME}-{what}" for what in ("progress", "metrics", "summary",
                                                                            "checkpoints"))
                              if links.filter(has_text=key).count()}
            assert set(artifact_pages) == {f"{RUN_NAME}-{w}" for w in ("progress", "metrics", "summary",
                                                                       "checkpoints")}, artifact_pages
            page.screenshot(path=shots / "flow-run.png", full_page=True)

            # The metrics table: a row per iteration, the metrics as columns.
            page.goto(url + artifact_pages[f"{RUN_NAME}-metrics"])
            table = page.locator("table").first
            table.wait_for(state="visible")
            headers = table.locator("th").all_inner_texts()
            assert {"iteration", "env_steps_total", "mean_return", "steps_per_s", "version"} <= set(headers), headers
            sync_api.expect(table.locator("tbody tr")).to_have_count(iterations)
            page.screenshot(path=shots / "metrics.png", full_page=True)

            # The summary: the learning curve, embedded as a data: URI, loads as the run's PNG.
            page.goto(url + artifact_pages[f"{RUN_NAME}-summary"])
            curve = page.locator('img[alt="learning curve"]')
            curve.wait_for(state="visible")
            page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=curve.element_handle())
            assert curve.get_attribute("src").startswith("data:image/png;base64,")
            assert curve.evaluate("img => [img.naturalWidth, img.naturalHeight]") == list(curve_size)
            page.screenshot(path=shots / "summary.png", full_page=True)
        finally:
            browser.close()
    assert not page_errors, f"the UI raised in the page: {page_errors}"
    if target := os.environ.get("GYMFLOW_SCREENSHOT"):
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shots / "flow-run.png", target)
    timings["browser_s"] = time.monotonic() - browser_began
    print(f"\nUI checks: {', '.join(f'{k} {v:.1f}' for k, v in timings.items())}; screenshots in {shots}")


def _wait_for_completed_bars(graph, shot: Path, timeout_s: float = 30.0) -> None:
    """Until the graph shows Completed task bars above its bottom strip (the flow run's own state bar)."""
    from PIL import Image

    deadline = time.monotonic() + timeout_s
    while True:
        graph.screenshot(path=shot)
        with Image.open(shot) as image:
            rgb = image.convert("RGB")
            width, height = rgb.size
            top = rgb.crop((0, 0, width, max(height - 24, 1)))
            bars = sum(count for count, color in top.getcolors(maxcolors=width * height)
                       if all(abs(a - b) <= 12 for a, b in zip(color, COMPLETED_GREEN)))
        if bars >= 200:
            return
        assert time.monotonic() < deadline, f"no Completed task bars drawn in the graph ({bars} pixels); see {shot}"
        time.sleep(0.5)


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", header[16:24])
