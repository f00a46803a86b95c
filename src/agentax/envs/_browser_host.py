"""One headless Chromium per worker process (and event loop), shared by its browser episodes.

`browser_host()` returns the host of the running event loop; it launches the installed Chromium
through Playwright (`executable_path`, nothing downloaded) on first use. Each episode gets an
isolated *context* of its own (`new_context`: fresh cookies, storage and cache), so many
episodes run in one browser at once.

A finished episode's context and page (a `BrowserTab`) can go back to the host instead of being
closed (`recycle`), scrubbed: the page is moved to `about:blank` (the episode's document, its
timers and workers end), `window.name`, cookies, permissions, the storage of every origin the
tab's pages visited (local and session storage, IndexedDB, cache storage, service workers) and
the navigation history are cleared, and extra pages (pop-ups) are closed. The next episode
`take_tab`s it and skips opening a context and a page, which starts a renderer process: a
start costs about half the CPU of a fresh context (`benchmarks/browser.py`). The HTTP cache is
kept. A tab serves at most `MAX_TAB_EPISODES` episodes; a browser crash drops the idle ones.

When the browser dies (crash, OOM kill), Playwright reports it disconnected: the host counts the
crash, the episodes whose contexts lived in it fail (`is_current(generation)` turns false, the
environment ends them as ENV_ERROR and counts them here), and the next `new_context` launches a
fresh browser. Every launch runs under a timeout.

Chromium is found from `AGENTAX_CHROMIUM`, then `chromium-headless-shell` (the lighter
headless-only build), `chromium`, `chromium-browser`, `google-chrome` on PATH;
`check_browser_available()` raises `BrowserUnavailableError` with a one-line fix when Chromium
or the `playwright` package is missing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import re
import shutil
import uuid
import weakref
from collections.abc import Sequence
from typing import Any

from agentax.trace import get_tracer, names

__all__ = ["BrowserHost", "BrowserTab", "BrowserUnavailableError", "browser_host", "check_browser_available",
           "find_chromium", "shutdown_browser"]


# Debian's `chromium-headless-shell` first: Chromium's headless-only build (what Playwright itself
# runs headless), without the browser window and its UI that full Chromium builds for every
# context; an episode's reset costs ~40 % less CPU with it (~320 -> ~200 ms, issue 45).
_CANDIDATES = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome",
               "google-chrome-stable")

# Hosts by event loop: Playwright objects belong to the loop that made them.
_HOSTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, BrowserHost] = weakref.WeakKeyDictionary()


# Chromium's own window UI that headless Chrome still builds for every window, and Playwright
# opens a window per context: each new context started two omnibox-popup WebUI pages
# (chrome://omnibox-popup.top-chrome/, two renderers of their own) that no page needs. They cost
# ~0.3 CPU-s a context and kept burning CPU while the context lived, which made 8 concurrent
# episodes no faster than 1 on 2 cores (issue 45).
# Chromium also starts a spare renderer after each navigation for the next one, but a spare
# serves only its own context and each episode opens a new one: every reset started a renderer
# that no page ever used (2 processes a reset instead of 1, ~40 ms of CPU).
_DISABLED_FEATURES = ("WebUIOmniboxPopup", "WebUIOmniboxAimPopup", "WebUIOmniboxFullPopup",
                      "SpareRendererForSitePerProcess")

# Chromium keeps only the last `--disable-features` switch, and Playwright passes one of its
# own before ours (features its driver needs off, e.g. with request routing): ours must repeat
# them. Read from the installed driver; this copy (Playwright 1.65) stands in when it can't be.
_PLAYWRIGHT_DISABLED_FEATURES = (
    "AvoidUnnecessaryBeforeUnloadCheckSync", "DestroyProfileOnBrowserClose", "HttpsUpgrades",
    "HttpsFirstBalancedModeAutoEnable", "LensOverlay", "MediaRouter", "PaintHolding",
    "ThirdPartyStoragePartitioning", "AvoidCorsURLLoaderRestartOnRedirect", "TcpPortRandomizationWin",
    "OptimizationHints", "NetworkTimeServiceQuerying", "AimEnabled", "PreconnectToSearch",
    "msForceBrowserSignIn", "msEdgeUpdateLaunchServicesPreferredVersion",
)


@functools.cache
def _playwright_disabled_features() -> tuple[str, ...]:
    """The features the installed Playwright driver disables at launch (its `disabledFeatures`
    list), with the copy above added."""
    found: list[str] = []
    try:
        import playwright

        pkg = os.path.join(os.path.dirname(playwright.__file__), "driver", "package", "lib")
        for rel in ("coreBundle.js", os.path.join("server", "chromium", "chromiumSwitches.js")):
            path = os.path.join(pkg, rel)
            if not os.path.isfile(path):
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                m = re.search(r"disabledFeatures\s*=\s*(?:\([^)]*\)\s*=>\s*)?\[(.*?)\]", f.read(), re.S)
            if m:
                found += re.findall(r"""["']([A-Za-z0-9_]+)["']""", m.group(1))
                break
    except Exception:  # noqa: BLE001 - the copy is enough
        pass
    return tuple(dict.fromkeys([*found, *_PLAYWRIGHT_DISABLED_FEATURES]))


def launch_args(extra: Sequence[str] = ()) -> list[str]:
    """Chromium switches of a launch: ours, then `extra`, with every `--disable-features`
    (Playwright's, ours, `extra`'s) merged into one switch at the end, the one Chromium keeps."""
    features = [*_playwright_disabled_features(), *_DISABLED_FEATURES]
    rest = []
    for a in extra:
        if a.startswith("--disable-features="):
            features += [f for f in a.split("=", 1)[1].split(",") if f]
        else:
            rest.append(a)
    return [*rest, "--disable-features=" + ",".join(dict.fromkeys(features))]


class BrowserUnavailableError(RuntimeError):
    """Chromium or the `playwright` package is missing; the message says how to install it."""


def find_chromium(executable_path: str | None = None) -> str:
    """Path of the Chromium to drive (`executable_path`, `$AGENTAX_CHROMIUM`, then PATH).

    Raises:
      BrowserUnavailableError: no Chromium found, or the `playwright` package is missing.
    """
    try:
        import playwright  # noqa: F401
    except ImportError:
        raise BrowserUnavailableError(
            "BrowserEnvironment needs the playwright package: pip install 'agentax[browser]' "
            "(it drives the installed Chromium; no `playwright install` needed)"
        ) from None
    path = executable_path or os.environ.get("AGENTAX_CHROMIUM")
    if path:
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise BrowserUnavailableError(f"Chromium not found at {path!r} (executable_path / AGENTAX_CHROMIUM)")
        return path
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return _unwrapped(found)
    raise BrowserUnavailableError(
        "BrowserEnvironment needs Chromium: run `apt-get install chromium chromium-headless-shell` "
        "as root on Debian/Ubuntu "
        "(bash scripts/setup.sh does it), or set AGENTAX_CHROMIUM=/path/to/chrome"
    )


def _unwrapped(path: str) -> str:
    """The browser binary a launcher script runs, when `path` is one (Debian's
    /usr/bin/chromium-headless-shell is `/usr/lib/chromium/chromium-headless-shell "$@"`
    without `exec`: launched through it, the browser is a child of a shell, whose pid is not
    the browser's); `path` itself otherwise."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return path
    if not head.startswith(b"#!"):
        return path
    name = os.path.basename(path)
    for line in head.decode(errors="replace").splitlines()[1:]:
        for token in line.split():
            token = token.strip("\"'")
            if (token.startswith("/") and os.path.basename(token) == name and token != path
                    and os.path.isfile(token) and os.access(token, os.X_OK)):
                with open(token, "rb") as f:
                    if not f.read(2).startswith(b"#!"):
                        return token
    return path


def check_browser_available(executable_path: str | None = None) -> str:
    """`find_chromium`, for callers that only want to know (tests skip with its message)."""
    return find_chromium(executable_path)


MAX_TAB_EPISODES = 200
"""Episodes one recycled tab serves before it is closed (bounds what a page can leak)."""

MAX_IDLE_TABS = 64
"""Idle tabs a host keeps; more are closed."""

_BLANK_NAME_JS = "() => { window.name = ''; }"


def _storage_origin(url: str) -> str | None:
    """The origin `Storage.clearDataForOrigin` takes for a page at `url` (None: nothing to clear)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    if scheme == "file":
        return "file://"
    if scheme in ("http", "https"):
        return f"{scheme}://{rest.split('/', 1)[0]}"
    return None


@dataclasses.dataclass(eq=False)
class BrowserTab:
    """A context and its page, owned by one episode at a time.

    Attributes:
      context, page: the Playwright objects.
      generation: the browser launch they live in (`BrowserHost.is_current`).
      key: the context options they were made with (a tab is reused only for the same).
      origins: origins its pages have visited since the last scrub.
      episodes: episodes it has started.
    """

    context: Any
    page: Any
    generation: int
    key: tuple
    origins: set[str] = dataclasses.field(default_factory=set)
    episodes: int = 1
    cdp: Any = None

    def track(self, page: Any) -> None:
        """Record the origins `page`'s frames navigate to (they are cleared at the scrub)."""
        page.on("framenavigated", self._visited)

    def _visited(self, frame: Any) -> None:
        origin = _storage_origin(frame.url)
        if origin is not None:
            self.origins.add(origin)


class BrowserHost:
    """The shared headless Chromium of one event loop.

    Attributes:
      stats: launches, crashes (browsers that died under us), crashed_episodes (episodes ended
        by a crash; the environment counts them), contexts (opened over the lifetime),
        blocked_requests (network requests refused: not loopback), recycled_tabs (finished
        episodes' pages scrubbed and kept for the next episode).
    """

    def __init__(self, executable_path: str, *, launch_timeout_s: float = 60.0,
                 args: Sequence[str] = ()) -> None:
        self.executable_path = executable_path
        self.launch_timeout_s = launch_timeout_s
        self.args = tuple(args)
        self.marker = f"--agentax-browser={uuid.uuid4().hex}"  # finds our process in /proc
        self.generation = 0
        self.stats = {"launches": 0, "crashes": 0, "crashed_episodes": 0, "contexts": 0,
                      "blocked_requests": 0, "recycled_tabs": 0}
        self._idle: dict[tuple, list[BrowserTab]] = {}
        self._pw: Any = None
        self._browser: Any = None
        self._lock: asyncio.Lock | None = None

    # ------------------------------------------------------------------ lifecycle

    def is_current(self, generation: int) -> bool:
        """Whether a context made at `generation` still lives in a connected browser."""
        return generation == self.generation and self._browser is not None and self._browser.is_connected()

    async def _ensure(self) -> Any:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._browser is not None and self._browser.is_connected():
                return self._browser
            await asyncio.wait_for(self._launch(), self.launch_timeout_s)
            return self._browser

    async def _launch(self) -> None:
        from playwright.async_api import async_playwright

        with get_tracer().span(names.BROWSER_LAUNCH, args={"restart": self.stats["launches"] > 0}):
            if self._pw is None:
                self._pw = await async_playwright().start()
            args = [
                "--no-sandbox",  # root in containers; each page is still isolated by its context
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-extensions",
                "--no-first-run",
                # A second wall behind the request filter: outside names do not resolve, and
                # anything else not loopback goes to a proxy that is not there (loopback
                # bypasses proxies).
                "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost, EXCLUDE 127.0.0.1",
                "--proxy-server=http://127.0.0.1:9",
                self.marker,
            ]
            browser = await self._pw.chromium.launch(executable_path=self.executable_path,
                                                     headless=True, args=launch_args([*args, *self.args]))
        self.generation += 1
        gen = self.generation
        browser.on("disconnected", lambda _b: self._on_disconnected(gen))
        self._browser = browser
        self.stats["launches"] += 1

    def _on_disconnected(self, generation: int) -> None:
        if generation == self.generation and not getattr(self, "_closing", False):
            self.stats["crashes"] += 1

    async def new_context(self, **options: Any) -> tuple[Any, int]:
        """A fresh, isolated context (launching or relaunching the browser if needed).

        Returns:
          (context, generation): pass `generation` to `is_current` to learn whether the
          browser that holds the context is still alive.
        """
        browser = await self._ensure()
        gen = self.generation
        context = await browser.new_context(**options)
        self.stats["contexts"] += 1
        return context, gen

    def take_tab(self, key: tuple) -> BrowserTab | None:
        """An idle recycled tab made with context options `key`, or None."""
        idle = self._idle.get(key)
        while idle:
            tab = idle.pop()
            if self.is_current(tab.generation) and not tab.page.is_closed():
                tab.episodes += 1
                return tab
        return None

    async def recycle(self, tab: BrowserTab, timeout_s: float = 5.0) -> bool:
        """Scrub `tab` (see the module doc) and keep it for `take_tab`. False (and the caller
        closes it) when its browser died, it has served `MAX_TAB_EPISODES`, enough tabs are
        idle, or the scrub failed."""
        if (not self.is_current(tab.generation) or tab.page.is_closed() or tab.episodes >= MAX_TAB_EPISODES
                or sum(map(len, self._idle.values())) >= MAX_IDLE_TABS):
            return False
        try:
            await asyncio.wait_for(self._scrub(tab), timeout_s)
        except Exception:  # noqa: BLE001 - any failure: the tab is closed instead
            return False
        self._idle.setdefault(tab.key, []).append(tab)
        self.stats["recycled_tabs"] += 1
        return True

    async def _scrub(self, tab: BrowserTab) -> None:
        for page in tab.context.pages:
            if page is not tab.page:
                await page.close()
        await tab.page.goto("about:blank")
        await tab.page.evaluate(_BLANK_NAME_JS)
        await tab.context.clear_cookies()
        await tab.context.clear_permissions()
        if tab.cdp is None:
            tab.cdp = await tab.context.new_cdp_session(tab.page)
        origins, tab.origins = tab.origins, set()
        for origin in sorted(origins):
            await tab.cdp.send("Storage.clearDataForOrigin", {"origin": origin, "storageTypes": "all"})
        await tab.cdp.send("Page.resetNavigationHistory")

    def browser_pid(self) -> int | None:
        """Process id of the main Chromium process (None when not running)."""
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if self.marker.encode() in argv and not any(a.startswith(b"--type=") for a in argv):
                return int(entry)
        return None

    async def close(self) -> None:
        """Close the browser and the Playwright driver (a later use launches them again)."""
        self._closing = True
        try:
            if self._browser is not None:
                try:
                    await asyncio.wait_for(self._browser.close(), 10)
                except Exception:  # noqa: BLE001 - already dead is fine
                    pass
            if self._pw is not None:
                try:
                    await asyncio.wait_for(self._pw.stop(), 10)
                except Exception:  # noqa: BLE001
                    pass
        finally:
            self._browser = self._pw = None
            self._idle.clear()
            self._closing = False


def browser_host(executable_path: str | None = None) -> BrowserHost:
    """The `BrowserHost` of the running event loop (made on first use; launched lazily)."""
    loop = asyncio.get_running_loop()
    host = _HOSTS.get(loop)
    if host is None:
        host = _HOSTS[loop] = BrowserHost(find_chromium(executable_path))
    return host


async def shutdown_browser() -> None:
    """Close the running loop's browser, if any (call before the loop ends)."""
    host = _HOSTS.pop(asyncio.get_running_loop(), None)
    if host is not None:
        await host.close()
