"""MiniWoB++ tasks in `BrowserEnvironment`: the `miniwob` package's pages, scored by themselves.

The Farama `miniwob` package ships the MiniWoB++ task pages (HTML + JavaScript, 100+ tasks).
Only those files are used — its Selenium driver is not — so it installs with `--no-deps`
(`scripts/setup.sh` does). Pages load from file: URLs (no server); an episode seeds the page's
random generator (`Math.seedrandom(seed)`), so `miniwob:click-button` with seed 7 is the same
instance every time and held-out seeds are instances never trained on.

Rewards are the page's own (`WOB_RAW_REWARD_GLOBAL`, from -1 to 1, without MiniWoB's time
decay: an LLM's step takes longer than a human's); the episode ends when the page says it is
done (`WOB_DONE_GLOBAL`). `reward="success"` maps them to 1.0 (raw > 0) or 0.0. A `done` the
page did not ask for scores 0 (or the page's reward if it already finished). Each episode
reports `success` as a metric.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentax.envs._browser import BrowserSite, register_browser_site
from agentax.envs._browser_host import BrowserUnavailableError
from agentax.records import Task

__all__ = ["MINIWOB_TASKS", "MiniWoBSite", "miniwob_dir", "miniwob_task", "miniwob_tasks"]

MINIWOB_TASKS = (
    "click-button", "click-link", "click-dialog", "click-checkboxes", "click-option", "click-tab",
    "enter-text", "enter-text-2", "enter-password", "focus-text", "focus-text-2", "login-user",
    "choose-list", "click-button-sequence", "use-autocomplete", "search-engine",
)
"""MiniWoB++ tasks checked to work with the text view and actions (any other page of the
package can be named too: `miniwob:<page>`)."""

_START_JS = """
([seed, maxMs]) => {
  Math.seedrandom(String(seed));
  core.EPISODE_MAX_TIME = maxMs;
  core.startEpisodeReal();
  return core.getUtterance();
}
"""



def miniwob_dir() -> Path:
    """The folder of the MiniWoB++ pages (`html/miniwob`) inside the installed `miniwob` package.

    Raises:
      BrowserUnavailableError: the package is not installed (the message says how).
    """
    spec = importlib.util.find_spec("miniwob")  # located, not imported: its Selenium is not needed
    if spec is None or not spec.submodule_search_locations:
        raise BrowserUnavailableError(
            "MiniWoB++ tasks need the miniwob package's pages: pip install --no-deps 'miniwob==1.1.0'"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "html" / "miniwob"
    if not path.is_dir():
        raise BrowserUnavailableError(f"the miniwob package has no task pages at {path}; reinstall it")
    return path


class MiniWoBSite(BrowserSite):
    """The MiniWoB++ pages (`task.meta["page"]`, `task.meta["seed"]`).

    Args:
      reward: "raw" (the page's reward, -1..1) or "success" (1.0 if it is > 0, else 0.0).
      max_episode_ms: the page's own episode timer (MiniWoB's default 10 s is for humans).
    """

    skip = "#query, #reward-display, #click-canvas, #sync-task-cover"
    state_js = "() => [WOB_DONE_GLOBAL, WOB_RAW_REWARD_GLOBAL, WOB_REWARD_REASON]"

    def __init__(self, *, reward: str = "raw", max_episode_ms: int = 3_600_000) -> None:
        if reward not in ("raw", "success"):
            raise ValueError(f"reward must be 'raw' or 'success', got {reward!r}")
        self.reward = reward
        self.max_episode_ms = max_episode_ms
        self._dir = miniwob_dir()

    def start_url(self, task: Task) -> str:
        page = str(task.meta.get("page", ""))
        path = self._dir / f"{page}.html"
        if not path.is_file():
            raise ValueError(f"no MiniWoB++ page {page!r} (task {task.id!r}); see {self._dir}")
        return path.as_uri()

    async def setup(self, page: Any, task: Task) -> str:
        return await page.evaluate(_START_JS, [int(task.meta.get("seed", 0)), self.max_episode_ms])

    def _score(self, raw: float) -> float:
        return raw if self.reward == "raw" else float(raw > 0)

    async def check(self, page: Any, task: Task, state: Any) -> tuple[float, bool, Mapping[str, float]]:
        done, raw, _reason = state
        if not done:
            return 0.0, False, {}
        return self._score(float(raw)), True, {"success": float(raw > 0)}

    async def finish(self, page: Any, task: Task, answer: str) -> tuple[float, Mapping[str, float]]:
        done, raw, _reason = await page.evaluate(self.state_js)
        raw = float(raw) if done else 0.0
        return self._score(raw), {"success": float(raw > 0)}


register_browser_site("miniwob", MiniWoBSite)


def miniwob_task(name: str, seed: int = 0) -> Task:
    """The MiniWoB++ task `name` ("click-button" or "miniwob:click-button") with `seed`."""
    page = name.removeprefix("miniwob:")
    return Task(id=f"miniwob:{page}/{seed}", meta={"site": "miniwob", "page": page, "seed": int(seed)})


def miniwob_tasks(names: Sequence[str], seeds: Iterable[int]) -> list[Task]:
    """Every task in `names` at every seed (seeds are the instances: keep held-out ones apart)."""
    seeds = list(seeds)
    return [miniwob_task(n, s) for s in seeds for n in names]
