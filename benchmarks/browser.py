"""Browser environment throughput: 8 concurrent episodes in one Chromium vs 1, and page-view cost.

Workload: MiniWoB++ `enter-text` (a real task page from the `miniwob` package, loaded from
file:), each episode typing into the text field step after step (every step = one `type`
action, the page's reward check, and a fresh text view), so episodes never end early. The same
run measures 1 episode at a time and 8 at once in one browser (each in its own context):

* `browser_steps_per_s_1_context`, `browser_steps_per_s_8_contexts`: environment steps a second.
* `browser_contexts_8_over_1`: their ratio (the issue's goal: >= 3 on 2 cores) — what sharing
  one browser among concurrent episodes buys while each waits on page work.
* `observation_ms_p50`: median time of building one text view of a MiniWoB page (`observe_s`).
* `reset_ms_p50`: median episode start (a recycled page, page load, seeding).

A second workload is the shape of an RL step on a small page: episodes of one reset and one
click on a local page of three buttons, 8 at a time, each in a new `BrowserEnvironment` (as the
collector makes them), once with pages recycled between episodes (`reuse_pages=True`, the
default) and once with a fresh context each (`reuse_pages=False`), interleaved in rounds:

* `short_episodes_per_s_recycled`, `short_episodes_per_s_fresh`, and their ratio
  `short_episode_recycled_over_fresh`;
* `short_episode_cpu_ms_recycled`, `short_episode_cpu_ms_fresh`: the host's CPU time (all
  processes: Python, the Playwright driver, Chromium) per episode, from /proc/stat.

    python benchmarks/browser.py            # full run, writes benchmarks/results/browser.json
    python benchmarks/browser.py --quick    # < 60 s

The web recipe's held-out figures come from a run of `agentax train web` (minutes; see
docs/recipes.md): `--recipe-run RUN_DIR` adds that run's `web_recipe_success_before` /
`web_recipe_success_after` (sampled at temperature 1, the issue's measure) and the greedy
ones (`web_recipe_greedy_success_before` / `_after`) from its summary.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

import tempfile

from agentax.envs import BrowserEnvironment, miniwob_task, shutdown_browser
from agentax.records import Action, Task

_BUTTONS = """<!doctype html><html><body><script>
for (const label of new URLSearchParams(location.search).get("labels").split(",")) {
  const b = document.createElement("button");
  b.textContent = label;
  b.onclick = () => { document.body.dataset.clicked = label; };
  document.body.append(b);
}
</script></body></html>"""


async def _episode(env: BrowserEnvironment, seed: int, steps: int, obs_s: list[float],
                   reset_s: list[float]) -> int:
    t0 = time.perf_counter()
    obs = await env.reset(miniwob_task("enter-text", seed))
    reset_s.append(time.perf_counter() - t0)
    field = next(ln for ln in obs.content.splitlines() if "input text" in ln)
    target = int(field[1 : field.index("]")])
    done = 0
    for i in range(steps):
        r = await env.step(Action(text=f'type {target} "word{i}"'))
        obs_s.append(r.observation.info["observe_s"])
        done += 1
    return done


async def _rate(n: int, steps: int, rounds: int, obs_s: list[float], reset_s: list[float]) -> float:
    envs = [BrowserEnvironment(max_steps=steps + 1) for _ in range(n)]
    await _episode(envs[0], 0, 2, [], [])  # warm: browser launched, page cached
    t0 = time.perf_counter()
    total = 0
    for r in range(rounds):
        counts = await asyncio.gather(*(_episode(e, r * n + i, steps, obs_s, reset_s)
                                        for i, e in enumerate(envs)))
        total += sum(counts)
    elapsed = time.perf_counter() - t0
    for e in envs:
        await e.close()
    return total / elapsed


def _host_cpu_s() -> float:
    """CPU seconds the whole host has spent (user + system, all processes)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


async def _short_episodes(url: str, reuse: bool, n: int, first: int) -> None:
    async def one(i: int) -> None:
        env = BrowserEnvironment(reuse_pages=reuse, max_steps=2)
        obs = await env.reset(Task(id=f"b{i}", meta={"url": f"{url}?labels=Red,Green,{i}"}))
        target = next(ln for ln in obs.content.splitlines() if ln.startswith("[") and "Red" in ln)
        await env.step(Action(text=f"click {target[1:target.index(']')]}"))
        await env.close()

    await asyncio.gather(*(one(first + i) for i in range(n)))


async def _short(rounds: int) -> dict[str, float]:
    page = Path(tempfile.mkdtemp()) / "buttons.html"
    page.write_text(_BUTTONS)
    url = page.as_uri()
    for reuse in (True, False):  # warm both paths
        await _short_episodes(url, reuse, 8, 0)
    wall = {True: 0.0, False: 0.0}
    cpu = {True: 0.0, False: 0.0}
    for r in range(rounds):
        for reuse in ((True, False) if r % 2 == 0 else (False, True)):
            c0, t0 = _host_cpu_s(), time.perf_counter()
            await _short_episodes(url, reuse, 8, 8 * r)
            wall[reuse] += time.perf_counter() - t0
            cpu[reuse] += _host_cpu_s() - c0
    episodes = 8 * rounds
    return {
        "short_episodes_per_s_recycled": round(episodes / wall[True], 1),
        "short_episodes_per_s_fresh": round(episodes / wall[False], 1),
        "short_episode_recycled_over_fresh": round(wall[False] / wall[True], 2),
        "short_episode_cpu_ms_recycled": round(1000 * cpu[True] / episodes, 1),
        "short_episode_cpu_ms_fresh": round(1000 * cpu[False] / episodes, 1),
    }


async def main(quick: bool) -> dict[str, float]:
    steps, rounds = (10, 2) if quick else (20, 4)
    obs_s: list[float] = []
    reset_s: list[float] = []
    try:
        one = await _rate(1, steps, rounds * 2, obs_s, reset_s)
        eight = await _rate(8, steps, rounds, [], [])
        short = await _short(10 if quick else 40)
    finally:
        await shutdown_browser()
    return {
        "browser_steps_per_s_1_context": round(one, 2),
        "browser_steps_per_s_8_contexts": round(eight, 2),
        "browser_contexts_8_over_1": round(eight / one, 2),
        "observation_ms_p50": round(1000 * statistics.median(obs_s), 2),
        "reset_ms_p50": round(1000 * statistics.median(reset_s), 1),
        **short,
    }


def recipe_figures(run_dir: Path) -> dict[str, float]:
    """Held-out success before and after RL from an `agentax train web` run's summary.json."""
    summary = json.loads((run_dir / "summary.json").read_text())
    out = {}
    for when in ("before", "after"):
        ev = summary[f"eval_{when}"]
        out[f"web_recipe_success_{when}"] = round(ev["eval/sampled/success"], 4)
        out[f"web_recipe_greedy_success_{when}"] = round(ev["eval/greedy/success"], 4)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller run (< 60 s)")
    parser.add_argument("--recipe-run", type=Path, default=None,
                        help="an `agentax train web` run directory whose held-out figures to add")
    args = parser.parse_args()
    figures = asyncio.run(main(args.quick))
    if args.recipe_run is not None:
        figures.update(recipe_figures(args.recipe_run))
    if not args.quick:
        out = Path(__file__).parent / "results" / "browser.json"
        out.parent.mkdir(exist_ok=True)
        # The recipe's figures come from another (long) run: a run without --recipe-run keeps them.
        kept = json.loads(out.read_text()) if out.exists() else {}
        out.write_text(json.dumps({**kept, **figures}, indent=2) + "\n")
    print(json.dumps(figures))
