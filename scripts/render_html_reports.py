"""The committed HTML examples and their screenshots, in Debian's headless Chromium.

    python scripts/render_html_reports.py --sweep reports/torchvision_torch-2.14.1_cpu_eager.json.gz
    python scripts/render_html_reports.py --ops reports/ops/cpu-float32_torch-2.14.1.json.gz
    python scripts/render_html_reports.py --docs

Writes reports/html/torchvision-sweep.html from the sweep report, audits shufflenet_v2_x1_0 and
maxvit_t (eager CPU, with the format timeline) into reports/html/<model>.html, and saves a
screenshot of each page beside it (and one of the sweep's models x operators matrix). With
``--ops INDEX``: the index's page (reports/html/ops.html) and deeplabv3_mobilenet_v3_large's
report linked to it (``--ops-index``), with screenshots of the page and of the links. With
``--docs``: the README's screenshots, at 1280 px, in docs/images/: the page of
``cl-audit --timm efficientnet_b3_gn --fake --device cuda --train --amp fp16`` (its headline and
grouped cost sites) and a small fake sweep's page (``SWEPT``: its cards and scatter). Needs
chromium, chromedriver and selenium, as the tests.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from cl_audit.execution.settings import AuditSettings
from cl_audit.render.html_model import model_html
from cl_audit.render.html_sweep import sweep_html
from cl_audit.report import ModelSource, SweepReport
from cl_audit.report.files import read_ops, read_report, write_text
from cl_audit.sources import ModelRef, load_model
from cl_audit.sources.source_audit import audit_loaded

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "reports" / "html"
DOCS = ROOT / "docs" / "images"
GROUPED = ("--timm", "efficientnet_b3_gn", "--fake", "--device", "cuda", "--train", "--amp", "fp16")
MODELS = ("shufflenet_v2_x1_0", "maxvit_t")
LINKED = "deeplabv3_mobilenet_v3_large"  # its losses read against the operator index


def screenshot(page: Path, png: Path, section: str | None = None, size: str = "1400,1800") -> None:
    """The top of ``page``, or the element with id ``section`` scrolled into view."""
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", f"--window-size={size}"):
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


def _sweep_pages(path: Path) -> None:
    sweep = read_report(path)
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


def _ops_pages(path: Path) -> None:
    from cl_audit.render.html_ops import ops_html

    index = read_ops(path)
    page = OUT / "ops.html"
    write_text(page, ops_html(index), "--html")
    screenshot(page, OUT / "ops.png")
    loaded = load_model(ModelRef(ModelSource.TORCHVISION, LINKED))
    linked = OUT / f"{LINKED}.html"
    write_text(linked, model_html(audit_loaded(loaded, AuditSettings()), index), "--html")
    screenshot(linked, OUT / f"{LINKED}-ops.png", section="op-links")
    print(f"{page}, ops.png, {linked} and {LINKED}-ops.png")


# a small sweep for the sweep page's screenshot: fake CPU audits, predicted speed
SWEPT = ("resnet18", "mobilenet_v3_small", "shufflenet_v2_x0_5", "densenet121", "efficientnet_b0",
         "convnext_tiny", "regnet_x_400mf", "squeezenet1_1")  # fmt: skip


def _docs_pages() -> None:
    """The README's two screenshots, each page made by the CLI: a model page (its headline and
    grouped cost sites) and a small sweep's page (its cards and scatter)."""
    DOCS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        page, swept = Path(folder) / "model.html", Path(folder) / "sweep.html"
        for arguments, html in ((GROUPED, page), ((*SWEPT, "--fake"), swept)):
            command = [sys.executable, "-m", "cl_audit", *arguments, "--html", str(html)]
            done = subprocess.run(command, check=False, capture_output=True, text=True)
            if not html.is_file():
                raise SystemExit(f"{' '.join(command)} wrote no page: {done.stderr[-500:]}")
        screenshot(page, DOCS / "model-page.png", size="1280,1500")
        screenshot(swept, DOCS / "sweep-page.png", section="speed-cards", size="1280,1500")
    print(DOCS / "model-page.png", DOCS / "sweep-page.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=Path)
    parser.add_argument("--ops", type=Path)
    parser.add_argument("--docs", action="store_true", help="the README's screenshots")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if args.sweep is not None:
        _sweep_pages(args.sweep)
    if args.ops is not None:
        _ops_pages(args.ops)
    if args.docs:
        _docs_pages()


if __name__ == "__main__":
    main()
