"""The pages of a paged KV cache: who holds each one, and a prefix index to share them.

Pure Python (no JAX), owned by the scheduler. A page is *held* by the sequences whose page
table lists it (a reference count). A full page whose sixteen positions were written by a
prefill can be *indexed* under a key that names its tokens and every token before it (a hash
chain: key(i) = hash(key(i - 1), tokens of page i)), with the policy version of the weights
that computed it. A new sequence whose prompt starts with indexed pages holds them instead of
prefilling them again; its own writes go only to positions past them, so a shared page is
never written (the one exception, a prompt that ends on a page boundary and must re-feed its
last token, gets a private copy of that page first: copy on write, done by the runner before
the next kernel call, see `copies`).

Memory: an indexed page nobody holds stays cached (LRU order) and is reused only when no
never-indexed page is free; `used()` counts held pages, each once however many sequences
share it.

Versions: an entry computed under version v is served while `current - v <= version_bound`
(0: only the same weights). A stale entry is replaced by the next registration of its key.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

from agentax.engine._config import PAGE

ROOT = 0x5EED
"""The chain key before a sequence's first page."""


@dataclasses.dataclass(frozen=True)
class _Entry:
    page: int
    parent: int
    tokens: tuple[int, ...]
    version: int


def chain_keys(tokens: Sequence[int], *, start: int = 0, parent: int = ROOT) -> list[int]:
    """The keys of the full pages of `tokens` from page `start` (`parent`: the key of page
    `start - 1`)."""
    keys = []
    for i in range(start, len(tokens) // PAGE):
        parent = hash((parent, tuple(tokens[i * PAGE:(i + 1) * PAGE])))
        keys.append(parent)
    return keys


class PagePool:
    """Free pages, reference counts and the prefix index of one paged cache.

    Args:
      num_pages: pages in the cache.
      sharing: keep a prefix index (False: pages are only allocated and freed).
      version_bound: the most policy versions an entry may lag the current weights and
        still be served.
    """

    def __init__(self, num_pages: int, *, sharing: bool = True, version_bound: int = 0):
        self.num_pages = num_pages
        self.sharing = sharing
        self.version_bound = version_bound
        self.free: list[int] = list(range(num_pages - 1, -1, -1))  # pop() takes the lowest
        """Pages nobody holds and no entry names."""
        self.refs = [0] * num_pages
        self.index: dict[int, _Entry] = {}
        self.key_of: dict[int, int] = {}
        """Indexed page -> its key."""
        self.lru: collections.OrderedDict[int, None] = collections.OrderedDict()
        """Indexed pages nobody holds, least recently released first (reused last)."""
        self.copies: list[tuple[int, int]] = []
        """(source, destination) page copies the runner must make before its next call."""

    # ------------------------------------------------------------------ holding

    def available(self) -> int:
        """Pages that `take` can hand out (free, then cached ones nobody holds)."""
        return len(self.free) + len(self.lru)

    def used(self) -> int:
        """Pages held by at least one sequence."""
        return self.num_pages - self.available()

    def take(self) -> int:
        """A page held once by the caller: a free page, else the least recently released
        cached one (its entry is dropped). The caller checks `available()` first."""
        if self.free:
            page = self.free.pop()
        else:
            page, _ = self.lru.popitem(last=False)
            self._unindex(page)
        self.refs[page] = 1
        return page

    def hold(self, page: int) -> None:
        if self.refs[page] == 0:
            self.lru.pop(page)
        self.refs[page] += 1

    def drop(self, page: int) -> None:
        """Releases one hold; a page nobody holds any more is cached if indexed, else free."""
        self.refs[page] -= 1
        if self.refs[page] == 0:
            if page in self.key_of:
                self.lru[page] = None
            else:
                self.free.append(page)

    def copy_on_write(self, page: int) -> int:
        """A private copy of a held `page` for a writer (the hold moves to the copy). The
        caller checks `available()` first."""
        new = self.take()
        self.copies.append((page, new))
        self.drop(page)
        return new

    def take_copies(self) -> list[tuple[int, int]]:
        copies, self.copies = self.copies, []
        return copies

    # ------------------------------------------------------------------ index

    def usable(self, key: int, parent: int, tokens: Sequence[int], version: int) -> _Entry | None:
        """The entry for `key` if it holds exactly these tokens after `parent` and is within
        the version bound of `version`."""
        entry = self.index.get(key)
        if (entry is None or version - entry.version > self.version_bound
                or entry.version > version or entry.parent != parent
                or entry.tokens != tuple(tokens)):
            return None
        return entry

    def match(self, tokens: Sequence[int], keys: Sequence[int], version: int) -> list[int]:
        """The pages of the longest indexed prefix of `tokens` (full pages, keys from
        `chain_keys`) usable at `version`; each is held once more by the caller."""
        pages, parent = [], ROOT
        if not self.sharing:
            return pages
        for i, key in enumerate(keys):
            entry = self.usable(key, parent, tokens[i * PAGE:(i + 1) * PAGE], version)
            if entry is None:
                break
            self.hold(entry.page)
            pages.append(entry.page)
            parent = key
        return pages

    def register(self, key: int, parent: int, tokens: Sequence[int], page: int,
                 version: int, current: int) -> bool:
        """Indexes a held, fully written `page` under `key`; a usable entry of the same key
        wins (True if `page` is now the entry)."""
        if not self.sharing or page in self.key_of:
            return False
        old = self.index.get(key)
        if old is not None:
            if self.usable(key, parent, tokens, current) is not None:
                return False
            self._unindex(old.page)
        self.index[key] = _Entry(page, parent, tuple(tokens), version)
        self.key_of[page] = key
        return True

    def _unindex(self, page: int) -> None:
        del self.index[self.key_of.pop(page)]
        if page in self.lru:  # cached and held by nobody: now simply free
            del self.lru[page]
            self.free.append(page)

    def check(self) -> None:
        """Asserts the pool's invariants (tests)."""
        held = {p for p in range(self.num_pages) if self.refs[p] > 0}
        assert all(r >= 0 for r in self.refs)
        assert len(self.free) == len(set(self.free)) and not held & set(self.free)
        assert not held & set(self.lru) and not set(self.free) & set(self.lru)
        assert len(held) + len(self.free) + len(self.lru) == self.num_pages
        assert set(self.lru) <= set(self.key_of)
        assert all(self.index[k].page == p for p, k in self.key_of.items())
        assert len(self.index) == len(self.key_of)
