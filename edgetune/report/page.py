"""The dashboard as one self-contained HTML page: every chart a data URI, the style and the few
lines of script that sort the tables inline, and a Content-Security-Policy that forbids fetching
anything. Every value from disk is escaped."""

from __future__ import annotations

import hashlib
from html import escape

from edgetune.inventory.schema import Fleet
from edgetune.report import plots
from edgetune.report.sources import Sources
from edgetune.report.views import (
    BoardRow,
    ClassTuning,
    HistoryRow,
    VersionRow,
    board_rows,
    class_tunings,
    count_text,
    history_rows,
    version_rows,
)
from edgetune.tune.report import NOT_MEASURED, NOT_YET, TuningSummary

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"
BOARD_NAMES_SHOWN = 8  # a version run by more boards lists the rest behind "and N more"

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 2px 8px; text-align: left; vertical-align: top; }
th { background: #eee; cursor: pointer; user-select: none; }
th.sorted-up::after { content: " \\25B2"; } th.sorted-down::after { content: " \\25BC"; }
.num { text-align: right; font-variant-numeric: tabular-nums; }
.offline, .verdict-slower, .verdict-wrong_output, .verdict-load_failed, .changed { color: #b00; font-weight: bold; }
.verdict-unreachable, .verdict-not_deployed, .missing { color: #888; }
.verdict-ok, .online { color: #070; } .verdict-faster { color: #06c; }
.problems { background: #fee; border: 1px solid #b00; padding: 0.5em 1em; }
.curves { display: flex; flex-wrap: wrap; gap: 1em; } .curves figure { margin: 0; }
.scroll { max-height: 70vh; overflow: auto; display: inline-block; } .scroll th { position: sticky; top: 0; }
nav a { margin-right: 1em; } #boards td { white-space: nowrap; } .fingerprint { font-family: monospace; }
"""

# Click a header to sort its table by that column (numbers as numbers: a cell's data-sort, else its text).
_SCRIPT = r"""
document.querySelectorAll("table.sortable th").forEach((th) => th.addEventListener("click", () => {
  const table = th.closest("table"), body = table.tBodies[0], column = th.cellIndex;
  const up = !th.classList.contains("sorted-up");
  table.querySelectorAll("th").forEach((h) => h.classList.remove("sorted-up", "sorted-down"));
  th.classList.add(up ? "sorted-up" : "sorted-down");
  const key = (row) => { const cell = row.cells[column]; return cell ? (cell.dataset.sort ?? cell.textContent) : ""; };
  const rows = Array.from(body.rows).sort((a, b) => {
    const x = key(a), y = key(b), nx = parseFloat(x), ny = parseFloat(y);
    const order = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
    return up ? order : -order;
  });
  rows.forEach((row) => body.appendChild(row));
}));
// The boards' filter: keep the rows whose text holds every word typed.
document.getElementById("board-filter").addEventListener("input", (e) => {
  const words = e.target.value.toLowerCase().split(/\s+/).filter((w) => w);
  document.querySelectorAll("#boards tbody tr").forEach((row) => {
    const text = row.textContent.toLowerCase();
    row.hidden = !words.every((w) => text.includes(w));
  });
});
"""


def render_page(sources: Sources, generated: str) -> bytes:
    fleet = sources.fleet
    history = history_rows(sources)
    parts = [
        (
            f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f"<title>edgetune: {escape(fleet.name)}</title><style>{_STYLE}</style></head><body>"
        ),
        (
            f"<h1>Fleet {escape(fleet.name)}</h1><p>Drawn from the files of {escape(str(fleet.path))} at {escape(generated)}.</p>"
            '<nav><a href="#fleet">the fleet</a><a href="#versions">artifacts</a><a href="#tuning">tuning</a>'
            '<a href="#history">history</a></nav>'
        ),
        _problems(sources.problems),
        _fleet_section(sources, board_rows(sources)),
        _versions_section(version_rows(sources)),
        _tuning_section(class_tunings(sources)),
        _history_section(history),
        f"<script>{_SCRIPT}</script></body></html>",
    ]
    return "\n".join(parts).encode("utf-8")


def _problems(problems: list[str]) -> str:
    if not problems:
        return ""
    items = "".join(f"<li>{escape(p)}</li>" for p in problems)
    return f"<div class=problems id=problems><b>Files that could not be read (left out of this page):</b><ul>{items}</ul></div>"


def _fleet_section(sources: Sources, rows: list[BoardRow]) -> str:
    fleet = sources.fleet
    models = [m.name for m in fleet.models]
    classes = ", ".join(f"{escape(c.name)} ({_class_boards(fleet, c.name)})" for c in fleet.device_classes)
    online = sum(1 for r in rows if r.online == "online")
    checked = next((r.checked for r in rows if r.checked), None)
    status = (
        f"{online} of {len(rows)} boards online at the last <code>fleet status</code> ({escape(checked)})"
        if checked
        else "<span class=missing>no <code>fleet status</code> recorded yet</span>"
    )
    headers = ["board", "class", "role", "status", "firmware", "firmware changed", "last report"]
    headers += [h for m in models for h in (f"{m}: runs", f"{m}: since", f"{m}: last regress")]
    body = "".join(_board_tr(row, models) for row in rows)
    return (
        f"<section id=fleet><h2>The fleet</h2><p>Device classes: {classes}. {status}.</p>"
        f"{_class_summary(sources, rows)}"
        "<p><label>Show the boards whose row holds: <input id=board-filter type=search "
        'placeholder="e.g. slower, offline, gw-fast"></label></p>'
        f"<div class=scroll>{_table('boards', headers, body)}</div></section>"
    )


def _class_boards(fleet: Fleet, device_class: str) -> str:
    """'4 boards', and where the class names a tuning pool, '4 boards, 2 in its tuning pool'."""
    boards, pool = len(fleet.boards_of(device_class)), len(fleet.pool_of(device_class))
    return f"{boards} boards" + (f", {pool} in its tuning pool" if pool < boards else "")


def _class_summary(sources: Sources, rows: list[BoardRow]) -> str:
    """Per class: boards online, offline and never checked, firmware changes, and the last
    regress verdicts counted (what needs a look, before the long table)."""
    headers = ["class", "boards", "online", "offline", "not checked", "firmware changed", "last regress verdicts"]
    body = ""
    for c in sources.fleet.device_classes:
        mine = [r for r in rows if r.device_class == c.name]
        count = {state: sum(1 for r in mine if r.online == state) for state in ("online", "offline", "not checked")}
        verdicts = [v.verdict for r in mine for v in r.verdicts.values()]
        verdict_text = count_text(verdicts) if verdicts else "no regress run yet"
        changed = sum(1 for r in mine if r.firmware_changed)
        body += (
            f"<tr>{_td(c.name)}{_num(str(len(mine)), len(mine))}{_num(str(count['online']), count['online'])}"
            f'<td class="num{" offline" if count["offline"] else ""}">{count["offline"]}</td>'
            f"{_num(str(count['not checked']), count['not checked'])}"
            f'<td class="num{" changed" if changed else ""}">{changed}</td>{_td(verdict_text)}</tr>'
        )
    return _table("classes", headers, body)


def _board_tr(row: BoardRow, models: list[str]) -> str:
    changed = {True: "<td class=changed>changed</td>", False: "<td>same</td>", None: "<td class=missing>unknown</td>"}
    cells = [
        _td(row.name),
        _td(row.device_class),
        _td(row.role),
        f"<td class={_css(row.online)}>{escape(row.online)}</td>",
        _firmware_td(row.firmware),
        changed[row.firmware_changed],
        _td(row.reported or "-"),
    ]
    for model in models:
        running = row.running.get(model)
        version = (
            "none"
            if running is None
            else (f"v{running.version}" if isinstance(running.version, int) else str(running.version))
        )
        cells.append(
            f'<td class=running data-model="{escape(model)}" data-sort="{_sort_key(running)}">{escape(version)}</td>'
        )
        cells.append(_td(running.since if running and running.since else "-"))
        cells.append(_verdict_td(row.verdicts.get(model)))
    return f'<tr data-board="{escape(row.name)}">{"".join(cells)}</tr>'


def _firmware_td(firmware: str | None) -> str:
    """The fingerprint's digest (equal fingerprints, equal digests), the whole of it on hover."""
    if firmware is None:
        return "<td class=missing>unknown</td>"
    digest = hashlib.sha256(firmware.encode()).hexdigest()[:10]
    return f'<td class=fingerprint title="{escape(firmware)}">{digest}</td>'


def _sort_key(running) -> str:
    return str(running.version) if running is not None and isinstance(running.version, int) else "-1"


def _verdict_td(verdict) -> str:
    if verdict is None:
        return "<td class=missing>no regress run yet</td>"
    text = verdict.verdict
    if verdict.ratio is not None:
        text += f" {verdict.ratio:.2f}x"
        if verdict.interval:
            text += f" [{verdict.interval[0]:.2f}, {verdict.interval[1]:.2f}]"
    sort = f"{verdict.ratio:.4f}" if verdict.ratio is not None else "0"
    return (
        f'<td class="verdict verdict-{_css(verdict.verdict)}" data-sort={sort} '
        f'title="{escape(verdict.time)}">{escape(text)}</td>'
    )


def _versions_section(rows: list[VersionRow]) -> str:
    if not rows:
        return "<section id=versions><h2>Artifacts</h2><p class=missing>no artifact version built yet</p></section>"
    headers = [
        "model",
        "class",
        "version",
        "created",
        "tuned ms",
        "untuned ms",
        "speed-up [interval]",
        "vs onnxruntime",
        "vs best runtime",
        "parity",
        "library MB",
        "trials",
        "signing key",
        "boards running it",
    ]
    body = "".join(_version_tr(r) for r in rows)
    return (
        f"<section id=versions><h2>Artifacts per model and class</h2>"
        f"<p>Speed-up: untuned / tuned time, the median over the class's boards; in brackets the lowest and "
        f"highest bound of the boards' 95 % intervals (the build's gate). Against onnxruntime: onnxruntime / tuned "
        f"time, the same way, over the boards whose Python has onnxruntime (timed on the board, in the same "
        f"rounds); against the best runtime: the faster of onnxruntime and OpenVINO on each board that has one, "
        f"named; above 1, the tuned build is faster. Parity: the trial and minute of tuning at which the class "
        f"run's estimate of the model first reached the faster runtime's time on a board of the class (timed at "
        f"the run's start), from the tuning report the version ships.</p>{_table('versions', headers, body)}</section>"
    )


def _ratio_text(ratio: float | None, interval: tuple[float, float] | None) -> str:
    text = "-" if ratio is None else f"{ratio:.2f}x"
    return text + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")


def _runtime_td(
    css: str, ratio: float | None, interval: tuple[float, float] | None, ran: str, runtime: str = ""
) -> str:
    """A ratio against a runtime ('1.21x [1.18, 1.25] openvino'), what ran it on hover; 'not
    measured' where no board ran it."""
    if ratio is None:
        return (
            '<td class=missing title="no board of the class has the runtime, or the model is no ONNX file">'
            "not measured</td>"
        )
    text = _ratio_text(ratio, interval) + (f" {runtime}" if runtime else "")
    return f'<td class="num {css}" data-sort="{ratio}" title="{escape(ran)}">{escape(text)}</td>'


def _parity_td(parity: str) -> str:
    """'trial 12, 3.1 min vs openvino'; 'not yet', 'not measured' and no tuning report as missing."""
    if parity in (NOT_YET, NOT_MEASURED, ""):
        return f"<td class=missing>{escape(parity or 'no tuning report')}</td>"
    return f"<td class=parity>{escape(parity)}</td>"


def _version_tr(r: VersionRow) -> str:
    speedup = _ratio_text(r.speedup, r.speedup_interval)
    boards = ", ".join(r.boards[:BOARD_NAMES_SHOWN])
    if len(r.boards) > BOARD_NAMES_SHOWN:
        boards += f" and {len(r.boards) - BOARD_NAMES_SHOWN} more"
    cells = [
        _td(r.model),
        _td(r.device_class),
        _num(f"v{r.version}", r.version),
        _td(r.created),
        _num(_ms(r.tuned_ms), r.tuned_ms),
        _num(_ms(r.untuned_ms), r.untuned_ms),
        _num(speedup, r.speedup),
        _runtime_td("vs-onnxruntime", r.vs_onnxruntime, r.vs_onnxruntime_interval, r.onnxruntime),
        _runtime_td("vs-best-runtime", r.vs_best_runtime, r.vs_best_runtime_interval, r.runtimes, r.best_runtime or ""),
        _parity_td(r.parity),
        _num("-" if r.library_mb is None else f"{r.library_mb:.2f}", r.library_mb),
        _num(str(r.trials), r.trials),
        _td(r.key_id or "unreadable"),
        f"<td data-sort={len(r.boards)}>{len(r.boards)}: {escape(boards)}</td>",
    ]
    return f"<tr>{''.join(cells)}</tr>"


def _tuning_section(classes: list[ClassTuning]) -> str:
    parts = ["<section id=tuning><h2>Tuning per class</h2>"]
    for c in classes:
        parts.append(
            f"<h3>{escape(c.device_class)}</h3><p>Trials spent: {c.trials}. Budget: {escape(c.budget)}. "
            f"Runs: {escape(c.runs)}.</p>"
        )
        if not c.models:
            parts.append("<p class=missing>no tuning report yet</p>")
            continue
        figures = "".join(_curve_figure(model, c.device_class, s) for model, s in c.models.items())
        parts.append(f"<div class=curves>{figures}</div>")
        for model, summary in c.models.items():
            parts.append(f"<h4>{escape(model)} on {escape(c.device_class)}: tasks</h4>" + _tasks_table(summary))
    parts.append("</section>")
    return "".join(parts)


def _curve_figure(model: str, device_class: str, summary: TuningSummary) -> str:
    uri = plots.curve_png(f"{model} on {device_class}", summary)
    return (
        f'<figure><img class=curve alt="tuning curve of {escape(model)} on {escape(device_class)}" src="{uri}">'
        f"<figcaption>{escape(_summary_line(summary))}</figcaption></figure>"
    )


def _summary_line(s: TuningSummary) -> str:
    line = f"{s.trials} trials, {s.tasks_tuned} of {s.tasks_total} tasks measured"
    estimate = s.estimated_latency_s
    line += f", estimate {estimate * 1e3:.3f} ms" if estimate is not None else ", no whole-model estimate yet"
    line += f", knee at {s.knee.trials} trials" if s.knee else ""
    line += f", time to parity: {s.time_to_parity}"
    return line + (f"; run stopped: {s.stopped}" if s.stopped else "")


def _tasks_table(summary: TuningSummary) -> str:
    headers = ["task", "calls", "trials", "failed", "best us", "GFLOP/s", "why it stopped"]
    body = "".join(
        f"<tr>{_td(t.name)}{_num(str(t.calls), t.calls)}{_num(str(t.trials), t.trials)}"
        f"{_num(str(t.failed_trials), t.failed_trials)}"
        f"{_num(_us(t.best_latency_s), t.best_latency_s)}{_num(_float(t.gflops), t.gflops)}"
        f"{_td(t.stopped or 'not stopped early')}</tr>"
        for t in summary.tasks
    )
    return _table("tasks", headers, body)


def _history_section(rows: list[HistoryRow]) -> str:
    if not rows:
        return (
            "<section id=history><h2>History</h2><p class=missing>no rollout, regress run or fleet status "
            "recorded yet</p></section>"
        )
    timeline = plots.timeline_png(rows)
    body = "".join(
        f"<tr class=event-{r.kind}>{_td(r.time)}<td class={'changed' if r.kind == 'firmware' else r.kind}>"
        f"{escape(r.kind)}</td>{_td(r.what)}</tr>"
        for r in reversed(rows)
    )
    return (
        f'<section id=history><h2>History</h2><img class=timeline alt="history timeline" src="{timeline}">'
        f"{_table('history', ['time (UTC)', 'event', 'what'], body)}</section>"
    )


def _table(name: str, headers: list[str], body: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    return f"<table class=sortable id={name}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _td(value: object) -> str:
    return f"<td>{escape(str(value))}</td>"


def _num(text: str, sort: object) -> str:
    key = sort if isinstance(sort, (int, float)) and not isinstance(sort, bool) else ""
    return f'<td class=num data-sort="{key}">{escape(text)}</td>'


def _css(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "-" for c in name)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _us(seconds: object) -> str:
    return f"{seconds * 1e6:.1f}" if isinstance(seconds, (int, float)) else "-"


def _float(value: object) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "-"
