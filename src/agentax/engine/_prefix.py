"""The scheduler's prefix sharing: fresh sequences attach indexed pages their prompts start
with, prefilled pages are indexed, and identical prompts in flight wait to share a prefill.

A mixin of `Scheduler` (engine/_scheduler.py), which owns the state it reads: `pool` (the
`PagePool`), `version`, `holders`, `counts` and `_inflight` (page key -> the request
prefilling it).
"""

from __future__ import annotations

from agentax.engine._config import PAGE
from agentax.engine._pages import ROOT, chain_keys
from agentax.engine._requests import _Request

__all__ = ["PrefixSharing"]


class PrefixSharing:
    """Prefix-sharing steps of the scheduler (see the module docstring)."""

    def _prompt_keys(self, req: _Request) -> list[int]:
        if req.prompt_keys is None:
            req.prompt_keys = chain_keys(req.seq.tokens) if self.pool.sharing else []
        return req.prompt_keys

    def _waits_for_prefix(self, req: _Request) -> bool:
        """Whether a fresh sequence's next page past what the index serves is being prefilled
        by another request now: it then waits to share that prefill instead of repeating it."""
        seq = req.seq
        if seq.pages or not self.pool.sharing or not self._inflight:
            return False
        keys, parent = self._prompt_keys(req), ROOT
        for i, key in enumerate(keys):
            tokens = seq.tokens[i * PAGE:(i + 1) * PAGE]
            if self.pool.usable(key, parent, tokens, self.version) is None:
                return key in self._inflight
            parent = key
        return False

    def _attach_prefix(self, req: _Request) -> None:
        """Gives a fresh sequence (no pages yet) the indexed pages its tokens start with: its
        prefill then starts after them. A prompt that ends on a page boundary re-feeds its
        last token (its next one is sampled from it) into a private copy of the last page."""
        seq, pool = req.seq, self.pool
        keys = self._prompt_keys(req)
        pages = pool.match(seq.tokens, keys, self.version)
        if not pages:
            return
        if len(pages) * PAGE >= len(seq.tokens):
            if pool.available():
                pages[-1] = pool.copy_on_write(pages[-1])
                seq.keys = keys[:len(pages) - 1]
            else:  # no page to copy into: prefill that page again
                pool.drop(pages.pop())
                seq.keys = keys[:len(pages)]
            seq.cached = min(len(pages) * PAGE, len(seq.tokens) - 1)
        else:
            seq.keys = keys[:len(pages)]
            seq.cached = len(pages) * PAGE
        if pages:
            seq.pages = pages
            self.holders += 1
            req.cached_prompt_tokens = seq.cached
            # What is prefilled after these pages attends to them: it is as old as they are.
            req.prefill_version = min(pool.index[k].version for k in seq.keys) if seq.keys \
                else self.version
            self.counts["prefix_hit_tokens"] += seq.cached

    def _register_pages(self, req: _Request) -> None:
        """Indexes the full pages of a request's sequence that its prefills wrote, in
        order after those already indexed (a chain has no gaps)."""
        seq, pool = req.seq, self.pool
        full = seq.cached // PAGE
        if len(seq.keys) >= full or len(seq.keys) * PAGE < req.prefill_start:
            return
        parent = seq.keys[-1] if seq.keys else ROOT
        for i in range(len(seq.keys), full):
            tokens = seq.tokens[i * PAGE:(i + 1) * PAGE]
            key = chain_keys(tokens, parent=parent)[0]
            pool.register(key, parent, tokens, seq.pages[i], req.prefill_version, self.version)
            seq.keys.append(key)
            self._inflight.pop(key, None)
            parent = key

    def _mark_inflight(self, req: _Request) -> None:
        """Records the keys of the full pages the request is about to prefill (identical
        prompts admitted meanwhile wait for them, `_waits_for_prefix`)."""
        seq = req.seq
        if not self.pool.sharing or len(seq.keys) * PAGE != seq.cached:
            return
        parent = seq.keys[-1] if seq.keys else ROOT
        for key in chain_keys(seq.tokens, start=len(seq.keys), parent=parent):
            if key not in self._inflight:
                self._inflight[key] = req
                req.inflight.append(key)

    def _clear_inflight(self, req: _Request) -> None:
        for key in req.inflight:
            if self._inflight.get(key) is req:
                del self._inflight[key]
        req.inflight.clear()
