"""The documentation holds together: every relative link in README.md, CONTRIBUTING.md,
docs/*.md, reports/README.md and reports/pages/*.md reaches a file that exists and, with a
``#anchor``, a heading of that file; and the README stays short, opening with its two commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "reports" / "README.md",
    *sorted((ROOT / "reports" / "pages").glob("*.md")),
]

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(([^()\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def _outside_code(text: str) -> list[str]:
    """The lines of a Markdown document that are not inside a fenced code block."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercased, backticks and every other punctuation mark
    removed except hyphens (letters, digits and underscores stay), each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a document's headings (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for line in _outside_code(path.read_text()):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    """Link targets of a document outside code blocks, leaving out web and mail addresses."""
    targets = []
    for line in _outside_code(path.read_text()):
        for match in LINK.finditer(line):
            target = match.group(1)
            if not re.match(r"(https?|mailto):", target):
                targets.append(target)
    return targets


def broken_links(path: Path) -> list[str]:
    """Each relative link of a document whose file, or whose heading, does not exist."""
    broken = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and (linked.is_dir() or anchor not in anchors(linked)):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    return broken


def test_heading_anchors_follow_githubs_rule():
    assert slug("Compiled models: `--compile`") == "compiled-models---compile"
    assert slug("Incremental sweeps: `--cache`") == "incremental-sweeps---cache"
    assert slug("Incremental sweeps: `cache/timm_torch-2.14.1.json`") == (
        "incremental-sweeps-cachetimm_torch-2141json"
    )
    assert slug("The verdict: what channels_last costs") == "the-verdict-what-channels_last-costs"


def test_a_missing_file_or_heading_is_reported_as_a_broken_link(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## A section\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Doc\n\n## Here\n\n[ok](other.md#a-section) [self](#here) [web](https://x.org/#nope)\n"
        "[gone](missing.md) [wrong](other.md#no-such-section) [local](#nowhere)\n"
        "```\n[in code](not-checked.md)\n# not a heading\n```\n[code heading](#not-a-heading)\n"
    )
    assert broken_links(doc) == [
        f"missing.md: no file {tmp_path / 'missing.md'}",
        "other.md#no-such-section: no heading #no-such-section in other.md",
        "#nowhere: no heading #nowhere in doc.md",
        "#not-a-heading: no heading #not-a-heading in doc.md",
    ]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_an_existing_file_and_heading(document):
    broken = broken_links(document)
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_readme_links_every_docs_page():
    linked = {t.partition("#")[0] for t in relative_links(ROOT / "README.md")}
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"docs pages the README does not link: {sorted(pages - linked)}"


def test_readme_is_at_most_220_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 220


def test_readme_opens_with_the_install_and_run_and_the_install_and_test_commands():
    text = (ROOT / "README.md").read_text()
    first_block = re.search(r"```[a-z]*\n(.*?)```", text, re.DOTALL)
    assert first_block is not None
    commands = first_block.group(1).strip().splitlines()
    assert len(commands) == 2
    assert "pip install -e ." in commands[0] and commands[0].endswith("cl-audit resnet50")
    assert "pip install -e '.[test" in commands[1] and commands[1].endswith("-m pytest")


CALL = re.compile(r"\bcl_audit((?:\.\w+)+)\(")


def _documented_calls() -> set[str]:
    """Every ``cl_audit.a.b(`` the documents call, in prose and in code."""
    return {m[1] for d in DOCUMENTS for m in CALL.finditer(d.read_text())}


def _resolve(dotted: str) -> object:
    """The package's object at ``dotted``, or the pytest fixture's method (docs/integrations.md
    calls the ``cl_audit`` fixture by the package's name)."""
    import importlib

    from cl_audit.integrations.pytest_plugin import ClAudit

    parts, found = dotted.strip(".").split("."), importlib.import_module("cl_audit")
    if len(parts) == 1 and not hasattr(found, parts[0]) and hasattr(ClAudit, parts[0]):
        return getattr(ClAudit, parts[0])
    for i, part in enumerate(parts):
        if not hasattr(found, part):  # a submodule not imported by its package
            importlib.import_module("cl_audit." + ".".join(parts[: i + 1]))
        found = getattr(found, part)
    return found


def test_every_call_the_documents_show_is_callable():
    """Issue #67: the docs called ``cl_audit.execution.audit_context()``, a module. The control:
    that call, resolved the same way, is not callable."""
    calls = _documented_calls()
    assert {".audit", ".audit_model", ".audit_models"} <= calls
    assert not [c for c in sorted(calls) if not callable(_resolve(c))]
    assert not callable(_resolve(".execution.audit_context"))
