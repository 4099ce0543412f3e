"""The HTML page every report is drawn on: one self-contained file, its style and its sorting
script, and escaping."""

from __future__ import annotations

import base64
import gzip
import json
from html import escape

__all__ = ["breakable", "esc", "html_page", "json_block", "summary_cards"]


def breakable(value: object, separators: str = "/.:") -> str:
    """``esc`` with a line-break opportunity after each separator (path separators: a long
    call site wraps between its parts, never inside a name; a model name's ``_`` too)."""
    text = esc(value)
    for separator in separators:
        text = text.replace(separator, separator + "<wbr>")
    return text


def esc(value: object) -> str:
    """A value as escaped HTML text (None: empty), quotes too: safe in attributes."""
    return escape("" if value is None else str(value), quote=True)


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d2330;background:#fff}
h1{font-size:1.4em;margin:0 0 .3em}h2{font-size:1.1em;margin:1.6em 0 .4em}
.verdict-bad{color:#b3261e}.verdict-good{color:#1e7d32}.dim{color:#667}
table{border-collapse:collapse;margin:.4em 0;width:100%}
th,td{border:1px solid #d7dae0;padding:.25em .45em;text-align:left;vertical-align:top}
th{background:#f1f3f6;cursor:pointer;user-select:none;white-space:nowrap}
td.num,th.num{text-align:right}code{font-size:.92em;overflow-wrap:anywhere}code.op{white-space:nowrap;overflow-wrap:normal}
code.site{overflow-wrap:normal}code.aten{white-space:normal}
.verdict-minor{color:#a86400}.warn{color:#a86400;font-weight:600}
.remedy-verified{color:#1e7d32}.remedy-refuted{color:#a86400}
tr.target{outline:2px solid #f0a020}
.cards{display:flex;gap:.6em;flex-wrap:wrap}.card{border:1px solid #d7dae0;border-radius:6px;
padding:.4em .8em}.card b{display:block;font-size:1.3em}
.strip{display:flex;flex-wrap:wrap;gap:1px;margin:.4em 0}
.ev{display:block;width:9px;height:22px;border-top:5px solid transparent}
.ev.channels_last{background:#3b82c4}.ev.contiguous{background:#e0a030}
.ev.ambiguous{background:#b9c2cf}.ev.other{background:#8a6fb3}
.ev.loss{border-top-color:#d62d20}.ev.regain{border-top-color:#1e9e48}
.legend span{display:inline-block;margin-right:1em}.legend i{display:inline-block;width:12px;
height:12px;margin-right:.3em;vertical-align:middle}
.heat{width:auto}.heat td.cell{width:1.6em;text-align:center;cursor:pointer;font-size:.8em}
.heat th.rot{writing-mode:vertical-rl;transform:rotate(180deg);cursor:default}
input[type=search],select{font:inherit;padding:.2em .4em;margin-right:.6em}
td.strides{white-space:nowrap}td.opname{min-width:18em}
#cost{table-layout:fixed}#cost code.site{white-space:normal}#cost th{white-space:normal}
#cost th:nth-child(1){width:17%}#cost th:nth-child(2){width:20%}#cost th:nth-child(3){width:15%}
#cost th:nth-child(4){width:8%}#cost th:nth-child(5){width:6%}#cost th:nth-child(6){width:16%}
#cost th:nth-child(7){width:18%}#cost td{overflow-wrap:anywhere}
#models th,#operators th,table.sites th,#stages th{white-space:normal}
#models td:first-child{min-width:11em}#operators td:first-child{min-width:14em}
#models td:last-child,#operators td:last-child{overflow-wrap:anywhere}
.wide{overflow-x:auto}
.stages{display:flex;gap:1.2em;flex-wrap:wrap;align-items:flex-start}
.stages>div{flex:1;min-width:22em}.stages svg{max-width:100%;height:auto}
#stages-picture .axis{fill:#667}#stages code{overflow-wrap:normal}
tr.costliest td{background:#fdecea}
details{margin:.3em 0}.phase{font-size:.8em;color:#fff;background:#6b5ba8;padding:0 .3em;
border-radius:3px}
"""


_SCRIPT = """
document.querySelectorAll('table.sortable').forEach(function (table) {
  table.querySelectorAll('th').forEach(function (th, column) {
    th.addEventListener('click', function () {
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      var numeric = th.classList.contains('num');
      var descending = th.dataset.order !== 'desc';
      th.dataset.order = descending ? 'desc' : 'asc';
      rows.sort(function (a, b) {
        var x = a.cells[column].dataset.value || a.cells[column].textContent;
        var y = b.cells[column].dataset.value || b.cells[column].textContent;
        var order = numeric ? parseFloat(x) - parseFloat(y) : x.localeCompare(y);
        return descending ? -order : order;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
function applyFilter() {
  var text = document.getElementById('filter');
  var status = document.getElementById('status-filter');
  if (!text) { return; }
  var needle = text.value.toLowerCase();
  document.querySelectorAll('table.filterable tbody tr').forEach(function (row) {
    var matches = row.textContent.toLowerCase().indexOf(needle) >= 0;
    var wanted = !status.value || row.dataset.status === status.value;
    row.style.display = matches && wanted ? '' : 'none';
  });
}
['filter', 'status-filter'].forEach(function (id) {
  var input = document.getElementById(id);
  if (input) { input.addEventListener('input', applyFilter); }
});
var timeline = document.getElementById('timeline-data');
if (timeline) {
  var known = JSON.parse(timeline.textContent);
  var cells = document.querySelectorAll('#timeline .ev');
  known.events.forEach(function (e, i) {
    var marks = Array.prototype.slice.call(cells[i].classList, 1);
    cells[i].title = '#' + i + ' ' + known.ops[e[0]] + ' in ' + known.modules[e[1]] +
      ': shape (' + e[2].join(', ') + '), strides (' + e[3].join(', ') + '), ' +
      marks.join(', ');
  });
}
document.querySelectorAll('[data-jump]').forEach(function (cell) {
  cell.addEventListener('click', function () {
    var target = document.getElementById(cell.dataset.jump);
    if (!target) { return; }
    if (target.tagName === 'DETAILS') { target.open = true; }
    target.scrollIntoView();
    document.querySelectorAll('.target').forEach(function (t) { t.classList.remove('target'); });
    target.classList.add('target');
  });
});
"""


def json_block(data: object) -> str:
    """``data`` as JSON safe inside a ``<script type="application/json">`` element."""
    text = json.dumps(data, allow_nan=False, separators=(",", ":"))
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def summary_cards(pairs: tuple[tuple[str, object], ...]) -> str:
    return "".join(
        f'<div class="card"><b>{esc(value)}</b>{esc(label)}</div>' for label, value in pairs
    )


def html_page(title: str, body: str, data: dict[str, object]) -> str:
    """A self-contained page: ``body``, the shared style and script, ``data`` embedded as its
    JSON, gzip-compressed and base64-encoded (a tenth of its size; no script reads it):
    ``json.loads(gzip.decompress(base64.b64decode(element.text)))``."""
    raw = json.dumps(data, allow_nan=False, separators=(",", ":")).encode()
    embedded = base64.b64encode(gzip.compress(raw, mtime=0)).decode("ascii")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>\n{body}\n"
        '<script type="application/gzip" data-encoding="base64" id="cl-audit-data">'
        f"{embedded}</script>\n<script>{_SCRIPT}</script></body></html>\n"
    )
