"""The documentation site builds with ``mkdocs build --strict``, has an API page for every public
module and a results page for every benchmark grid with results, and renders in a real browser
(headless Chromium, Debian's ``chromium`` and ``chromium-driver``) with no console errors.

Without mkdocs (the ``docs`` extra) or Chromium these tests skip, saying so; CI installs both
and sets ``ROBOTRL_REQUIRE_BROWSER=1``, which turns a skip into a failure.
``ROBOTRL_SCREENSHOTS=DIR`` keeps the browser's screenshots there.
"""

from __future__ import annotations

import fcntl
import functools
import http.server
import importlib
import os
import pkgutil
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def _need(what: str) -> None:
    if os.environ.get("ROBOTRL_REQUIRE_BROWSER"):
        pytest.fail(f"{what} is missing and ROBOTRL_REQUIRE_BROWSER is set")
    pytest.skip(f"{what} is missing")


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once a test run with --strict (every warning an error) into a temporary
    folder, from nothing built before (a fresh clone has no ``build/``). Under pytest-xdist the
    first worker to need it builds it, under a lock, and the others read that build: two builds
    at once would share the repository's ``build/api_src``."""
    if shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None:
        _need('mkdocs (pip install -e ".[docs]")')
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # one process (-n 0)
        return _build_site(tmp_path_factory.mktemp("site"))
    shared = tmp_path_factory.getbasetemp().parent  # this run's folder, above every worker's
    with open(shared / "site.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out = shared / "site"
        if not (out / "index.html").is_file():
            _build_site(out)
        return out


def _build_site(out: Path) -> Path:
    shutil.rmtree(ROOT / "build" / "api_src", ignore_errors=True)  # as on a fresh clone
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
    done = subprocess.run([str(Path(sys.executable).parent / "mkdocs"), "build", "--strict",
                           "--site-dir", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-6000:]
    return out


def public_modules() -> list[str]:
    """Every public module of the installed package (the CLI's are commands, not an API)."""
    names = []
    for package in ("robotrl", "robotrl.envs", "robotrl.algos", "robotrl.sim2real"):
        names.append(package)
        path = importlib.import_module(package).__path__
        names += [m.name for m in pkgutil.walk_packages(path, package + ".")]
    return sorted({n for n in names if not n.startswith("robotrl.cli")
                   and not any(p.startswith("_") for p in n.split("."))})


def test_every_public_module_has_an_api_page(site: Path) -> None:
    modules = public_modules()
    assert {"robotrl.experiment", "robotrl.envs.mujoco", "robotrl.algos.offline.iql",
            "robotrl.sim2real.export", "robotrl.stats"} <= set(modules)
    for name in modules:
        page = site / "reference" / Path(*(name.split(".")[1:] or ["robotrl"])) / "index.html"
        assert page.is_file(), f"no API page for {name}"
    text = (site / "reference" / "config" / "index.html").read_text()
    assert "TrainConfig" in text and "num_seeds" in text  # field docstrings rendered


def test_every_benchmark_grid_with_results_has_a_page(site: Path) -> None:
    from robotrl.bench.grid import load_grid

    grids = [p for p in (ROOT / "benchmarks" / "grids").glob("*.yaml")
             if (results := load_grid(p).results) and (ROOT / results).is_file()]
    assert grids
    for grid in grids:
        page = (site / "results" / grid.stem / "index.html").read_text()
        assert "95%" in page or "CI" in page, grid.stem  # a table with intervals


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The site over HTTP on localhost (the browser test loads it as a reader would)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        _need("Chromium (apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # as root in a container, on a machine with no network: no sandbox, no background fetches
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1280,900"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options,
                              service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    yield driver
    driver.quit()


@pytest.mark.parametrize(("page", "expected"), [
    ("", "robotrl"),
    ("guides/train/", "Train, evaluate, resume"),
    ("reference/experiment/", "robotrl.experiment"),
    ("results/", "Results"),  # the generated overview, a figure per family
    ("results/zoo/", "zoo: 2 algorithms x 8 tasks x 3 seeds"),  # a grid page with its figure
])
def test_pages_render_without_console_errors(served: str, browser, page: str, expected: str,
                                             tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    browser.get_log("browser")  # drop what earlier pages logged
    browser.get(f"{served}/{page}")
    heading = browser.find_element(By.CSS_SELECTOR, "article h1").text
    assert expected in heading
    assert browser.find_elements(By.CSS_SELECTOR, "nav.md-nav")  # the theme's navigation
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    broken = browser.execute_script(  # every image loaded: no broken figure on the page
        "return [...document.images].filter(i => !i.complete || i.naturalWidth === 0)"
        ".map(i => i.src)")
    assert not broken, broken
    if page.startswith("results"):
        assert browser.find_elements(By.CSS_SELECTOR, "article img"), "no figure"
    folder = Path(os.environ.get("ROBOTRL_SCREENSHOTS", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    name = (page.strip("/").replace("/", "_") or "index") + ".png"
    assert browser.save_screenshot(str(folder / name))
