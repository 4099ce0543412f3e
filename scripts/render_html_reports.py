"""The committed HTML examples and their screenshots, in Debian's headless Chromium.

    python scripts/render_html_reports.py --sweep reports/torchvision_torch-2.14.1_cpu_eager.json.gz

Writes reports/html/torchvision-sweep.html from the sweep report, audits shufflenet_v2_x1_0 and
maxvit_t (eager CPU, with the format timeline) into reports/html/<model>.html, and saves a
screenshot of each page beside it (and one of the sweep's models x operators matrix). Needs
chromium, chromedriver and selenium, as the tests.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from cl_audit.files import read_report, write_text
from cl_audit.render.html import model_html, sweep_html
from cl_audit.report import ModelSource, SweepReport
from cl_audit.settings import AuditSettings
from cl_audit.sources import ModelRef, load_model
from cl_audit.sources.audit import audit_loaded

OUT = Path(__file__).resolve().parents[1] / "reports" / "html"
MODELS = ("shufflenet_v2_x1_0", "maxvit_t")


def screenshot(page: Path, png: Path, section: str | None = None) -> None:
    """The top of ``page``, or the element with id ``section`` scrolled into view."""
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1800"):
        options.add_argument(argument)
    driver = webdriver.Chrome(
        service=Service(executable_path=shutil.which("chromedriver")), options=options
    )
    try:
        driver.get(page.resolve().as_uri())
        if section is not None:
            driver.execute_script(f"document.getElementById('{section}').scrollIntoView()")
        driver.save_screenshot(str(png))
    finally:
        driver.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=Path, required=True)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    sweep = read_report(args.sweep)
    assert isinstance(sweep, SweepReport)
    pages = {"torchvision-sweep": sweep_html(sweep)}
    for name in MODELS:
        loaded = load_model(ModelRef(ModelSource.TORCHVISION, name))
        pages[name] = model_html(audit_loaded(loaded, AuditSettings(timeline=True)))
    for name, html in pages.items():
        page = OUT / f"{name}.html"
        write_text(page, html, "--html")
        screenshot(page, OUT / f"{name}.png")
        print(f"{page} and {name}.png")
    matrix = OUT / "torchvision-sweep-matrix.png"
    screenshot(OUT / "torchvision-sweep.html", matrix, section="heatmap")
    print(matrix)


if __name__ == "__main__":
    main()
