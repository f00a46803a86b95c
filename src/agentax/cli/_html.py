"""`agentax show --html`: one self-contained HTML page of a run.

Everything is inline (CSS, JS, the episodes as JSON, curves.png as base64), so the page opens
from a file, offline, and can be mailed or attached to an issue. It shows the run's
before/after numbers (summary.json), its curves, the doctor's report (doctor.txt) and the
episodes, which its script renders and filters (phase, outcome, step and reward range, text).
The address's #fragment sets the first filters, e.g. `transcripts.html#phase=train&outcome=failure`.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentax.run import DOCTOR_REPORT
from agentax.cli._show import conversation, format_header

__all__ = ["page", "write_page"]

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:1100px;padding:0 1em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
code,pre{font:12.5px/1.4 ui-monospace,monospace}pre{white-space:pre-wrap;word-break:break-word;margin:0}
table{border-collapse:collapse}td,th{padding:.15em .7em;border-bottom:1px solid #eee;text-align:right}
th:first-child,td:first-child{text-align:left}img{max-width:100%}
#doctor pre{background:#f6f6f6;padding:.6em;max-height:24em;overflow:auto}
#filters{display:flex;flex-wrap:wrap;gap:.4em 1em;align-items:center;margin:.6em 0}
#filters input[type=number]{width:5.5em}#count{color:#666}#fold button{margin-right:.4em}
.episode{border:1px solid #ddd;border-left:4px solid #c33;border-radius:4px;margin:.4em 0;padding:.2em .6em}
.episode.success{border-left-color:#2a2}.episode summary{cursor:pointer;font-weight:600}
.msg{margin:.35em 0 .35em .6em;padding:.2em .5em;border-radius:3px;background:#f8f8f8}
.msg .role{font-weight:600;font-size:.85em;color:#555}
.msg.assistant{background:#eef7ee}.msg.user{background:#eef3fb}.msg.tool{background:#fbf6e8}
.msg.system{background:#f5eefa}.error{color:#b00}
"""

_JS = """
(function () {
  const data = JSON.parse(document.getElementById("transcripts").textContent);
  const $ = (id) => document.getElementById(id);
  const ids = {phase: "f-phase", outcome: "f-outcome", step_min: "f-step-min",
    step_max: "f-step-max", reward_min: "f-reward-min", reward_max: "f-reward-max", text: "f-text"};
  // Episodes open or closed as rendered; "expand all" / "collapse all" (or #open=1) set it.
  let allOpen = false;
  new URLSearchParams(location.hash.slice(1)).forEach(function (value, key) {
    if (ids[key]) $(ids[key]).value = value;
    if (key === "open") allOpen = value === "1";
  });
  for (const r of data) {
    r.search = (r.header + "\\n" + r.conversation.map((m) => m.join(" ")).join("\\n")).toLowerCase();
  }
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function num(id) {
    const v = $(id).value;
    return v === "" ? null : Number(v);
  }
  function matches(r) {
    const phase = $("f-phase").value, outcome = $("f-outcome").value;
    const text = $("f-text").value.toLowerCase();
    if (phase === "eval" ? !r.phase.startsWith("eval") : phase && r.phase !== phase) return false;
    if (outcome && (outcome === "success") !== r.success) return false;
    const lo = num("f-step-min"), hi = num("f-step-max");
    const rlo = num("f-reward-min"), rhi = num("f-reward-max");
    if ((lo !== null && r.step < lo) || (hi !== null && r.step > hi)) return false;
    if ((rlo !== null && r.reward < rlo) || (rhi !== null && r.reward > rhi)) return false;
    return !text || r.search.includes(text);
  }
  function render(r) {
    const d = el("details", "episode " + (r.success ? "success" : "failure"));
    d.dataset.phase = r.phase;
    d.dataset.step = r.step;
    d.open = allOpen;
    d.appendChild(el("summary", "", r.header));
    for (const [role, detail, text] of r.conversation) {
      const m = el("div", "msg " + role);
      m.appendChild(el("div", "role", detail ? role + " [" + detail + "]" : role));
      m.appendChild(el("pre", "", text));
      d.appendChild(m);
    }
    if (r.error) d.appendChild(el("p", "error", "error: " + r.error));
    return d;
  }
  function update() {
    const box = $("episodes");
    box.replaceChildren();
    let shown = 0;
    for (const r of data) {
      if (matches(r)) {
        box.appendChild(render(r));
        shown += 1;
      }
    }
    $("count").textContent = shown + " of " + data.length + " episodes";
  }
  function fold(open) {
    allOpen = open;
    for (const d of $("episodes").children) d.open = open;
  }
  $("expand-all").addEventListener("click", () => fold(true));
  $("collapse-all").addEventListener("click", () => fold(false));
  $("filters").addEventListener("input", update);
  update();
})();
"""


def _episode(record: dict[str, Any]) -> dict[str, Any]:
    """What the page's script needs of a record: the header and conversation as the text view
    shows them, and the fields the filters read."""
    reward = record.get("reward")
    return {"phase": str(record.get("phase", "")), "step": record.get("step"),
            "reward": reward if isinstance(reward, (int, float)) else None,
            "success": bool(record.get("success")), "header": format_header(record),
            "conversation": [list(m) for m in conversation(record)],
            "error": str(record.get("error", ""))}


def _summary_table(summary: dict[str, Any]) -> str:
    """The held-out numbers before and after RL (summary.json), as a table."""
    before, after = summary.get("eval_before") or {}, summary.get("eval_after") or {}
    if not isinstance(before, dict) or not isinstance(after, dict) or not (before or after):
        return ""
    keys = list(dict.fromkeys([*before, *after]))

    def cell(d: dict, k: str) -> str:
        v = d.get(k)
        return html.escape(f"{v:.4g}" if isinstance(v, float) else str(v if v is not None else ""))

    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{cell(before, k)}</td>"
                   f"<td>{cell(after, k)}</td></tr>" for k in keys)
    return ("<h2>Held-out evaluation</h2><table><tr><th></th><th>before RL</th>"
            f"<th>after RL</th></tr>{rows}</table>")


def _doctor_text(run_dir: Path, summary: dict[str, Any]) -> str:
    """The doctor's full report (doctor.txt), else its verdict from summary.json, else ''."""
    path = run_dir / DOCTOR_REPORT
    if path.is_file():
        return path.read_text(encoding="utf-8", errors="replace")
    doctor = summary.get("doctor")
    if isinstance(doctor, dict):
        return "\n".join(f"{k}: {v}" for k, v in doctor.items())
    return ""


def _read_summary(run_dir: Path) -> dict[str, Any]:
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # a run still going (or killed) has none yet
        return {}
    return summary if isinstance(summary, dict) else {}


def _phase_options(records: Sequence[dict[str, Any]]) -> str:
    phases = sorted({str(r.get("phase", "")) for r in records} - {"train"})
    options = [("", "all"), ("train", "train"), ("eval", "every evaluation"),
               *((p, p) for p in phases)]
    return "".join(f'<option value="{html.escape(v)}">{html.escape(label)}</option>'
                   for v, label in options)


def page(run_dir: str | Path, records: Sequence[dict[str, Any]]) -> str:
    """The HTML page of a run with these transcript records."""
    run_dir = Path(run_dir)
    summary = _read_summary(run_dir)
    curves = run_dir / "curves.png"
    image = (f'<h2>Curves</h2><img alt="learning curves" src="data:image/png;base64,'
             f'{base64.b64encode(curves.read_bytes()).decode()}">' if curves.is_file() else "")
    doctor = _doctor_text(run_dir, summary)
    doctor_html = (f'<section id="doctor"><h2>Doctor</h2><pre>{html.escape(doctor)}</pre>'
                   "</section>" if doctor else "")
    data = json.dumps([_episode(r) for r in records], default=str).replace("<", "\\u003c")
    name = html.escape(run_dir.resolve().name)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>agentax run {name}</title><style>{_CSS}</style></head>
<body>
<h1>agentax run <code>{name}</code></h1>
<p><code>{html.escape(str(run_dir))}</code></p>
{_summary_table(summary)}
{image}
{doctor_html}
<section id="browse"><h2>Episodes</h2>
<form id="filters" onsubmit="return false">
<label>phase <select id="f-phase">{_phase_options(records)}</select></label>
<label>outcome <select id="f-outcome"><option value="">all</option>
<option value="success">success</option><option value="failure">failure</option></select></label>
<label>steps <input id="f-step-min" type="number"> to <input id="f-step-max" type="number"></label>
<label>reward <input id="f-reward-min" type="number" step="any"> to
<input id="f-reward-max" type="number" step="any"></label>
<label>text <input id="f-text" type="search"></label>
</form>
<p id="fold"><span id="count"></span> <button type="button" id="expand-all">expand all</button><button
type="button" id="collapse-all">collapse all</button></p>
<div id="episodes"></div>
</section>
<script id="transcripts" type="application/json">{data}</script>
<script>{_JS}</script>
</body></html>
"""


def write_page(run_dir: str | Path, records: Sequence[dict[str, Any]], out: str | Path) -> Path:
    """Writes `page(run_dir, records)` to `out` (its folder must exist)."""
    out = Path(out)
    if not out.parent.is_dir():
        raise FileNotFoundError(f"cannot write {out}: the folder {out.parent} does not exist")
    out.write_text(page(run_dir, records), encoding="utf-8")
    return out
