"""Real-browser fixtures: the app served by `streamlit run` on a free port, and headless Chromium.

The browser is Debian's `chromium` (apt-get install chromium), driven by Playwright for Python; the
tests never download a browser. Without playwright or chromium every browser test is skipped, with
the reason shown.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
START_TIMEOUT_S = 90
# SCREENSHOTS=1: the README's pictures are taken (tests/browser/test_screenshots.py), of the app reading the fixed
# demo folder docs/demo/ (relative paths: the pictures show "docs/demo/...", not a temporary folder)
SCREENSHOTS = os.environ.get("SCREENSHOTS") == "1"
DEMO = Path("docs") / "demo"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Under pytest-xdist (-n), every browser test runs on one worker: one app server, one Chromium. First among the
    hooks: xdist's own (in each worker) turns the mark into the group it schedules by, and must see it."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.xdist_group("browser"))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="session")
def app_url(tmp_path_factory):
    """Start the app (python -m streamlit run app/main.py) and yield its URL; stop it afterwards."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path_factory.mktemp("streamlit") / "server.log"
    command = [sys.executable, "-m", "streamlit", "run", "app/main.py", "--server.address", "127.0.0.1",
               "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false"]
    # a temporary designs folder: each session starts from the LSTM preset; the user's designs/ is never touched
    env = dict(os.environ, RNN_DESIGNS_DIR=str(tmp_path_factory.mktemp("designs")))
    if SCREENSHOTS:
        env.update(RNN_DESIGNS_DIR=str(DEMO / "designs"), RNN_RESULTS_DIR=str(DEMO / "results"))
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(url):
            if server.poll() is not None:
                pytest.fail(f"streamlit exited with code {server.returncode}:\n{log_path.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"streamlit was not healthy after {START_TIMEOUT_S} s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        yield url
    finally:
        # the server runs in its own process group (start_new_session): stop it and only it
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


@pytest.fixture(scope="session")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed "
                                   "(pip install -r requirements-test.txt)")
    executable = shutil.which("chromium")
    if executable is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser):
    """A fresh browser context per test (its own Streamlit session), 1400 x 900."""
    context = browser.new_context(viewport={"width": 1400, "height": 900}, accept_downloads=True)
    context.set_default_timeout(60_000)
    tab = context.new_page()
    yield tab
    context.close()
