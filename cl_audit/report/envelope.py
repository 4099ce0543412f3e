"""The versioned JSON envelopes of reports: formats and versions, gzip, schema loading.

Every document is ``{"format": ..., "version": ..., ...}``; readers check both and accept the
versions they know. Version 14 of the report envelope and 10 of the sweep envelope write
``speed.table`` as an object: the table's name, the machine it describes (``identity``), how
that matched the machine the audit ran on (``match``, ``differences``, ``this_machine``),
whether ``--table`` chose it and where it came from; older documents named the table alone (a
string, read as a table of unknown machine). Version 13 of the report envelope and 9 of the
sweep envelope add ``speed`` (whether channels_last pays: the step's time in both layouts,
measured or predicted, by operation class, with its verdict) and the gate's ``on`` and
``slowdown`` (``--gate speed``, ``--fail-slowdown``); older documents are read without a speed
section, their gate on bytes.
Version 12 of the report envelope and 8 of the sweep envelope say
``environment.mode`` "fake-step" for a fake training step, whose backward cl-audit runs node by
node (versions 6-11 said "replayed" for a step traced and replayed; read as they were). Version 9
of the report envelope and 7 of the sweep envelope name a cost site's fix site as the operation
that last wrote its data's order (followed through folds), with ``root_cause`` where that NCHW data
began: what ``fix_site`` means changed; older sites are read without a root cause. Version 8 of the
report envelope and 6 of the sweep envelope prove remedies (``remedy.status``: verified by a
what-if run, refuted and not offered as a fix, or a lead; ``remedy.evidence``;
``cost.verify_seconds``): what ``remedy`` means changed; older remedies are read as leads. Version
7 of the report envelope and 5 of the sweep envelope judge the cost at a reference batch
(``cost.gate.batch``, ``cost.at_gate``: what the verdict means changed; older rows were judged at
their audited batch, their gate's batch null). Version 4 of the sweep envelope marks rows reused
from the sweep cache (``cached``, ``summary.cached``); version 4 of the report envelope adds
``compiled`` (``--compile``: Inductor's layout decision per graph); version 3 of both envelopes
weighs what channels_last costs against NCHW (``cost``, ``summary.verdict``); version 2 sorted
losses by what they mean; older versions are still read (versions 1 and 2: offending when there are
offenders).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from importlib import resources
from typing import Any, TypeVar

from cl_audit.report.codec import plain_json as plain_json  # public here before the codec

T = TypeVar("T")

REPORT_FORMAT = "cl-audit.report"


REPORT_VERSION = 16  # 16: speed.compiled (the compiled step timed in both layouts)
# 15: cost.groups (the sites grouped by what fixes them), speed.stages
# 14: speed.table an object (the table's machine, how it matched this one)
# 13: speed (measured or predicted), cost.gate.on and .slowdown
# 12: environment.mode "fake-step" (a fake training step's backward run
# node by node) where a fake training step was "replayed"
# 11: ddp (--train --ddp); 10: compiled.data_dependent
# 9: fix_site the writer of the data's order, cost site root_cause
# 8: remedies verified, refuted or leads (remedy.status, remedy.evidence)
# 7: the verdict judges the cost at gate.batch (cost.at_gate)
# 6: environment.mode "replayed" (a traced training step replayed)


BENCH_FORMAT = "cl-audit.bench"  # cl_audit.report.bench_report


# 2: verdict a word (faster/slower/inconclusive), verdict_text, warm-up; 3: the comparison's
# rounds_spread, past whose bound the verdict is inconclusive, and verdict_text's figure the table's
# 4: compiled configurations (timings[].compiled, .compile_seconds) and compiled_comparison
BENCH_VERSION = 4
BENCH_READABLE = (1, 2, 3, BENCH_VERSION)


OPS_FORMAT = "cl-audit.ops"  # cl_audit.features.ops_index: the operator coverage index


# 4: cases, unjudged; 3: gradients_not_judged; 2: the behaviour "copies", "copied" bytes, module_db
OPS_VERSION = 4
OPS_READABLE = (1, 2, 3, OPS_VERSION)


REPORT_READABLE = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, REPORT_VERSION)


class ReportFormatError(ValueError):
    """A JSON document is not a cl-audit report this version can read."""


def parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ReportFormatError(f"not JSON: {e}") from None


_GZIP_MAGIC = b"\x1f\x8b"


def encode_document(text: str, compress: bool) -> bytes:
    """What ``decode_document`` reads: UTF-8, gzip-compressed (reproducibly) when asked."""
    data = text.encode()
    return gzip.compress(data, mtime=0) if compress else data


def decode_document(data: bytes) -> Any:
    """A JSON document as written by ``--json``, gzip-compressed or not."""
    if data[:2] == _GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise ReportFormatError(f"broken gzip data: {e}") from None
    try:
        return parse_json(data.decode())
    except UnicodeDecodeError as e:
        raise ReportFormatError(f"not text: {e}") from None


def check_envelope(data: Any, expected_format: str, readable: tuple[int, ...]) -> int:
    """The document's version; refuses other formats and versions with a message."""
    if not isinstance(data, dict) or "format" not in data:
        raise ReportFormatError(f"not a {expected_format} document (no 'format' key)")
    if data["format"] != expected_format:
        raise ReportFormatError(f"unknown format {data['format']!r}; expected {expected_format!r}")
    version = data.get("version")
    if version not in readable:
        raise ReportFormatError(
            f"unsupported {expected_format} version {version!r}; this cl-audit reads versions "
            f"{_versions(readable)}"
        )
    return version


def _versions(readable: tuple[int, ...]) -> str:
    """``1 to 13``, or ``1 and 2``, or ``3``: the versions a reader reads, in runs."""
    runs: list[list[int]] = []
    for v in sorted(readable):
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    parts = [f"{r[0]} to {r[-1]}" if len(r) > 2 else " and ".join(map(str, r)) for r in runs]
    return ", ".join(parts)


def read_envelope(
    data: Any, expected_format: str, readable: tuple[int, ...], read: Callable[[int], T]
) -> T:
    """``read(version)`` of a document whose envelope ``check_envelope`` accepts; a body that
    does not read is a ``ReportFormatError`` naming the format."""
    version = check_envelope(data, expected_format, readable)
    try:
        return read(version)
    except (KeyError, TypeError, ValueError) as e:
        raise ReportFormatError(f"malformed {expected_format} document: {e!r}") from None


def load_schema(name: str = "report", version: int | None = None) -> dict[str, Any]:
    """The JSON Schema shipped in the package for ``cl-audit.<name>`` documents (report, sweep,
    bench, ops, speed-table) of ``version`` (the current one by default)."""
    current = {
        "report": REPORT_VERSION,
        "sweep": SWEEP_VERSION,
        "bench": BENCH_VERSION,
        "ops": OPS_VERSION,
        "speed-table": TABLE_VERSION,
    }[name]
    version = current if version is None else version
    file = f"{name}.schema.json" if version == current else f"{name}-v{version}.schema.json"
    return json.loads(resources.files("cl_audit.schema").joinpath(file).read_text())


SWEEP_FORMAT = "cl-audit.sweep"


# An operation time table (``predict.speed_table``, made by ``cl-audit table``). 2: the machine's
# identity, the host's cost per kind of operation measured, convolutions with their passes
# measured apart (version 1 was never written outside this project; its shipped tables were
# rewritten as version 2).
TABLE_FORMAT, TABLE_VERSION = "cl-audit.speed-table", 2


SWEEP_VERSION = 12  # 12: as report 16, a row's speed.compiled
# 11: as report 15, a row's cost.groups and speed.stages
# 10: as report 14, a row's speed.table an object
# 9: a row's speed section, cost.gate.on and .slowdown (as report 13)
# 8: environment.mode "fake-step" for a fake training sweep; 7: as report 9,
# fix sites followed through folds; 6: as report 8, remedies proven; 5: as report 7, rows judged
# at gate.batch
SWEEP_READABLE = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, SWEEP_VERSION)
