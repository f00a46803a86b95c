"""The browser environment's text view of a page: a pruned DOM with a stable id per control.

One `page.evaluate` of `OBSERVE_JS` walks the visible DOM under a root element (the whole body,
or a site's task area), minus the parts a `skip` selector names, in document order and returns one line per item:

* an interactive element (link, button, input, select, textarea, anything with a click role,
  `onclick`, `tabindex` or a pointer cursor of its own) becomes `[7] button "Submit"`, `[8] input text "typed value"`,
  `[9] select "Red" options: Red|Green|Blue`, `[10] checkbox checked "Remember me"`;
* visible text that is not inside a control becomes a line of its own (whitespace squeezed).

Ids live on the elements (`data-agentax-id`, numbered by a per-page counter), so an element
keeps its id for as long as it is in the page, across observations and after other elements
come or go; ids are only renumbered when the page itself is replaced (navigation).
The text is cut to `max_chars` (the cut is said, never silent).
"""

from __future__ import annotations

__all__ = ["OBSERVE_JS", "ID_ATTR", "format_view"]

ID_ATTR = "data-agentax-id"

# Arguments: [rootSelector, skipSelector, maxTextLen]. Returns {lines: [...], title, url}.
OBSERVE_JS = r"""
([rootSel, skipSel, maxText]) => {
  const ATTR = 'data-agentax-id';
  if (window.__agentaxNextId === undefined) window.__agentaxNextId = 1;
  const root = (rootSel && document.querySelector(rootSel)) || document.body;
  const lines = [];
  if (!root) return {lines, title: document.title, url: location.href};
  const CONTROL_TAGS = new Set(['A', 'BUTTON', 'INPUT', 'SELECT', 'TEXTAREA']);
  const CONTROL_ROLES = new Set(['button', 'link', 'checkbox', 'radio', 'tab', 'menuitem',
                                 'option', 'switch', 'textbox', 'combobox', 'treeitem']);
  const squeeze = (s) => (s || '').replace(/\s+/g, ' ').trim();
  const cut = (s) => s.length > maxText ? s.slice(0, maxText) + '…' : s;
  const q = (s) => '"' + cut(squeeze(s)).replace(/"/g, "'") + '"';
  const visible = (el) => {
    if (el.hidden) return false;
    const st = getComputedStyle(el);
    if (st.display === 'none' || st.visibility === 'hidden') return false;
    const r = el.getBoundingClientRect();
    return r.width > 0 && r.height > 0 || el.tagName === 'OPTION';
  };
  const isControl = (el) => {
    if (CONTROL_TAGS.has(el.tagName)) return !(el.tagName === 'INPUT' && el.type === 'hidden');
    const role = el.getAttribute('role');
    if (role && CONTROL_ROLES.has(role)) return true;
    if (el.hasAttribute('onclick') || el.hasAttribute('tabindex') && el.tabIndex >= 0) return true;
    // Script-bound handlers leave no attribute; a pointer cursor (not inherited) marks them.
    const parent = el.parentElement;
    return getComputedStyle(el).cursor === 'pointer' &&
           !(parent && getComputedStyle(parent).cursor === 'pointer');
  };
  const idOf = (el) => {
    let id = el.getAttribute(ATTR);
    if (id === null) { id = String(window.__agentaxNextId++); el.setAttribute(ATTR, id); }
    return id;
  };
  const labelOf = (el) => {
    if (el.labels && el.labels.length) return squeeze(el.labels[0].textContent);
    return squeeze(el.getAttribute('aria-label') || '');
  };
  const describe = (el) => {
    const tag = el.tagName;
    let s = '[' + idOf(el) + '] ';
    if (tag === 'INPUT') {
      const t = (el.type || 'text').toLowerCase();
      if (t === 'checkbox' || t === 'radio') {
        s += t + (el.checked ? ' checked' : '') + ' ' + q(labelOf(el) || el.value);
      } else if (t === 'submit' || t === 'button' || t === 'reset') {
        s += 'button ' + q(el.value || t);
      } else {
        s += 'input ' + t + ' ' + q(t === 'password' ? '*'.repeat(el.value.length) : el.value);
        const hint = labelOf(el) || el.placeholder;
        if (hint) s += ' label=' + q(hint);
      }
    } else if (tag === 'TEXTAREA') {
      s += 'textarea ' + q(el.value);
      if (el.placeholder) s += ' label=' + q(el.placeholder);
    } else if (tag === 'SELECT') {
      const opts = Array.from(el.options).map((o) => cut(squeeze(o.text)));
      const cur = el.selectedIndex >= 0 ? el.options[el.selectedIndex].text : '';
      s += 'select ' + q(cur) + ' options: ' + opts.join('|');
    } else {
      const kind = tag === 'A' ? 'link' : tag === 'BUTTON' ? 'button'
                 : (el.getAttribute('role') || 'clickable');
      s += kind + ' ' + q(el.innerText || el.textContent || el.getAttribute('aria-label') || '');
    }
    return s;
  };
  let text = '';
  const flush = () => { const t = squeeze(text); if (t) lines.push(cut(t)); text = ''; };
  const BLOCK = new Set(['DIV', 'P', 'BR', 'LI', 'UL', 'OL', 'TR', 'TABLE', 'H1', 'H2', 'H3',
                         'H4', 'H5', 'H6', 'FORM', 'SECTION', 'HEADER', 'FOOTER', 'LABEL']);
  const walk = (node) => {
    if (node.nodeType === Node.TEXT_NODE) { text += ' ' + node.data; return; }
    if (node.nodeType !== Node.ELEMENT_NODE) return;
    const el = node;
    if (el.tagName === 'SCRIPT' || el.tagName === 'STYLE' || el.tagName === 'NOSCRIPT') return;
    if (!visible(el) || skipSel && el.matches(skipSel)) return;
    if (el.tagName === 'LABEL' && el.control && el.contains(el.control) && visible(el.control)) {
      flush(); lines.push(describe(el.control)); return;  // the label is the control's name
    }
    if (isControl(el)) { flush(); lines.push(describe(el)); return; }
    const block = BLOCK.has(el.tagName);
    if (block) flush();
    for (const child of el.childNodes) walk(child);
    if (block) flush();
  };
  walk(root);
  flush();
  return {lines, title: document.title, url: location.href};
}
"""


def format_view(lines: list[str], *, instruction: str = "", max_chars: int = 4000) -> str:
    """The observation text: the instruction (if any), then the page's lines, cut to `max_chars`."""
    head = [instruction] if instruction else []
    out: list[str] = []
    used = sum(len(s) + 1 for s in head)
    for i, line in enumerate(lines):
        if used + len(line) + 1 > max_chars:
            out.append(f"... ({len(lines) - i} more lines cut)")
            break
        out.append(line)
        used += len(line) + 1
    return "\n".join(head + out)
