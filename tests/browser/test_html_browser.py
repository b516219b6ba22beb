"""The HTML report in a real browser: what a reviewer sees, with JavaScript on and off.

Headless Chromium driven by Selenium (Debian's ``chromium`` and ``chromium-driver``;
``.ci/run`` installs them). The report is the bundled engine's failing check (2 layers,
4 steps, v1 PIECEWISE narrow): its findings are visible, its diagram is drawn, a
finding's anchor navigates to it, segments collapse and expand, zoom enlarges the
diagram and dragging pans it; with JavaScript disabled the verdict, the findings and the diagram are still
there. A screenshot of each is saved. Without Chromium the tests skip, except under
``CI=true``, where a missing browser is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from capturelint.cli import main
from capturelint.report import finding_entries

CI = os.environ.get("CI", "").lower() == "true"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ENGINE = ["--runner", "v1", "--mode", "PIECEWISE", "--layers", "2", "--steps", "4", "--eager-region", "narrow"]
PNG = b"\x89PNG\r\n\x1a\n"


def _browser_or_skip() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        text = f"{' and '.join(missing)} not installed (Debian packages chromium and chromium-driver)"
        if CI:
            pytest.fail(text + ": CI must run the browser tests")
        pytest.skip(text)
    if not CI:
        pytest.importorskip("selenium", reason="selenium is not installed (the test extra)")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, list[dict]]:
    """The HTML report of a failing check, and its findings as the JSON report lists them."""
    _browser_or_skip()
    folder = tmp_path_factory.mktemp("html")
    html, js = folder / "report.html", folder / "report.json"
    assert main(["check", *ENGINE, "--format", "json", "-o", str(js)]) == 1
    assert main(["check", *ENGINE, "--format", "html", "-o", str(html)]) == 1
    return html, finding_entries(json.loads(js.read_text()))


def _driver(javascript: bool):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    if not javascript:
        options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)  # against a hang, not a measurement
    return driver


@pytest.fixture(scope="module", params=[True, False], ids=["javascript", "no-javascript"])
def browser(request, report):
    driver = _driver(request.param)
    yield driver, request.param
    driver.quit()


def _in_view(driver, element) -> bool:
    rect = element.rect
    top = rect["y"] - driver.execute_script("return window.scrollY")
    return 0 <= top < driver.execute_script("return window.innerHeight")


def test_a_reviewer_sees_the_verdict_findings_and_diagram(browser, report, tmp_path):
    from selenium.webdriver.common.by import By

    driver, javascript = browser
    path, findings = report
    driver.get(path.as_uri())
    # the page's own script ran, or did not: the no-javascript run is really without it
    assert driver.find_element(By.TAG_NAME, "html").get_attribute("class") == ("js" if javascript else "")
    verdict = driver.find_element(By.CSS_SELECTOR, "#verdict h1")
    assert verdict.is_displayed() and verdict.text.startswith("Replay differs from eager execution in v1/PIECEWISE: ")
    assert verdict.text.endswith(f"{len(findings)} findings in 2 problems")
    for i, f in enumerate(findings, 1):
        article = driver.find_element(By.ID, f"finding-{i}")
        message = article.find_element(By.CSS_SELECTOR, ".message")
        assert message.is_displayed() and message.text == f["message"]
        frame = f["location"]  # the line to change (CL101: its branch) heads the finding and its first excerpt
        assert f"{frame['file']}:{frame['line']}" in article.find_element(By.CSS_SELECTOR, ".where").text
        marked = article.find_element(By.CSS_SELECTOR, "mark.line")
        assert marked.is_displayed() and marked.get_attribute("data-n") == str(frame["line"])
    svg = driver.find_element(By.CSS_SELECTOR, "#regions .canvas svg")
    assert svg.is_displayed() and svg.size["width"] > 200 and svg.size["height"] > 50
    assert len(svg.find_elements(By.CSS_SELECTOR, "g.node")) > 10  # drawn nodes, not an empty box
    # what the reviewer sees: the top of the page, and the diagram
    for name, element in (("top", verdict), ("diagram", svg)):
        driver.execute_script("arguments[0].scrollIntoView()", element)
        shot = tmp_path / f"report-{name}-{'js' if javascript else 'nojs'}.png"
        assert driver.save_screenshot(str(shot)) and shot.read_bytes().startswith(PNG)


def _top_and_bottom(driver, selector: str) -> tuple[float, float]:
    return tuple(driver.execute_script("var r = document.querySelector(arguments[0]).getBoundingClientRect();"
                                       "return [r.top + window.scrollY, r.bottom + window.scrollY];", selector))


def test_the_first_screen_answers(browser, report):
    """At 1440 x 900 the first screen holds the verdict line, the problems and what was
    compared; the diagram of the configuration with findings is one click away."""
    from selenium.webdriver.common.by import By

    driver, javascript = browser
    path, _ = report
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 1440, "height": 900, "deviceScaleFactor": 1, "mobile": False})
    try:
        driver.get(path.as_uri())
        assert driver.execute_script("return [window.innerWidth, window.innerHeight]") == [1440, 900]
        for selector in ("#verdict h1", "#verdict .summary", "#findings .problems", "#compared table"):
            top, bottom = _top_and_bottom(driver, selector)
            assert bottom <= 900, (selector, top, bottom)
        assert "compared:" in driver.find_element(By.CSS_SELECTOR, "#verdict .summary").text
        # a problem's line has no source listing's line-number box before it
        line = driver.find_element(By.CSS_SELECTOR, ".problem p.line")
        assert driver.execute_script("return getComputedStyle(arguments[0], '::before').content", line) == "none"
        # the diagram: one click on the contents' link to the configuration with findings
        link = driver.find_element(By.CSS_SELECTOR, '#contents a[href="#config-1"]')
        assert _top_and_bottom(driver, "#contents")[1] <= 900 and "finding" in link.text
        link.click()
        svg = driver.find_element(By.CSS_SELECTOR, "#config-1 .canvas svg")
        assert svg.is_displayed() and _in_view(driver, driver.find_element(By.ID, "config-1"))
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def test_a_findings_anchor_navigates_to_it(browser, report):
    from selenium.webdriver.common.by import By

    driver, _ = browser
    path, findings = report
    last = f"finding-{len(findings)}"
    driver.get(path.as_uri())
    target = driver.find_element(By.ID, last)
    assert not _in_view(driver, target)  # far below the top of the page
    driver.find_element(By.CSS_SELECTOR, f'.problems a[href="#{last}"]').click()  # from its problem's list
    assert driver.current_url.endswith(f"#{last}") and _in_view(driver, target)
    # a link from elsewhere (report.html#finding-N) opens on it too
    driver.get(path.as_uri() + "#finding-2")
    assert _in_view(driver, driver.find_element(By.ID, "finding-2"))


def test_segments_collapse_and_the_diagram_zooms(browser, report):
    from selenium.webdriver.common.by import By

    driver, javascript = browser
    path, _ = report
    driver.get(path.as_uri())
    segment = driver.find_element(By.CSS_SELECTOR, "details.segment")
    table = segment.find_element(By.TAG_NAME, "table")
    summary = segment.find_element(By.TAG_NAME, "summary")
    assert summary.is_displayed() and not table.is_displayed()
    driver.execute_script("arguments[0].scrollIntoView()", summary)
    summary.click()
    assert segment.get_attribute("open") is not None and table.is_displayed()
    summary.click()
    assert segment.get_attribute("open") is None and not table.is_displayed()
    # zoom: radio buttons and CSS, so it works without JavaScript as well
    svg = driver.find_element(By.CSS_SELECTOR, "#regions .canvas svg")
    widths = {}
    for label in ("100%", "200%"):
        button = driver.find_element(By.XPATH, f"//div[@class='diagram']/label[text()='{label}']")
        driver.execute_script("arguments[0].scrollIntoView()", button)
        button.click()
        widths[label] = svg.size["width"]
    assert widths["200%"] == pytest.approx(2 * widths["100%"], rel=0.01)
    # with JavaScript, dragging the diagram pans it (without, the canvas scrolls by its scroll bars)
    from selenium.webdriver.common.action_chains import ActionChains

    canvas = driver.find_element(By.CSS_SELECTOR, "#regions .canvas")
    driver.execute_script("arguments[0].scrollIntoView()", canvas)
    ActionChains(driver).move_to_element(canvas).click_and_hold().move_by_offset(-300, 0).release().perform()
    scrolled = driver.execute_script("return arguments[0].scrollLeft", canvas)
    assert scrolled == (300 if javascript else 0)
