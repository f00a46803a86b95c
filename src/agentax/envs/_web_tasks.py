"""`web_tasks`: a small local shop app for multi-page browser tasks, scored from its state.

The app (`ShopApp`) is a stdlib HTTP server on 127.0.0.1 (one per process, started on first
use, a daemon thread). Each episode gets a session of its own under `/s/<session>/`, with a
catalog drawn from the task's seed. The flow is search -> open a result -> fill the order
form -> submit:

    /s/<sid>/                 search box
    /s/<sid>/search?q=...     results (links to the items whose name holds every word)
    /s/<sid>/item/<k>         the item, its price, and an order form (name, quantity)
    /s/<sid>/order (POST)     places the order, shows a confirmation

The task "Order 2 of the blue lamp for Alice." is scored from what the server recorded, not from
the page: reward 1.0 when the session's only order is the right item, quantity and name, else
0.0; the episode ends at the first order (or at `done`). Metrics: `success`, `found_item`
(the right item's page was opened), `ordered` (some order was placed).
"""

from __future__ import annotations

import html
import random
import threading
import urllib.parse
import uuid
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agentax.envs._browser import BrowserSite, register_browser_site
from agentax.records import Task

__all__ = ["ShopApp", "WebTasksSite", "shop_app", "web_task", "web_tasks"]

_COLORS = ("red", "blue", "green", "black", "white", "yellow", "grey", "pink")
_THINGS = ("lamp", "chair", "mug", "desk", "shelf", "clock", "rug", "vase", "kettle", "sofa")
_NAMES = ("Alice", "Bob", "Carol", "Dan", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy")


def shop_catalog(seed: int, n: int = 12) -> list[dict[str, Any]]:
    """The catalog of a session: `n` distinct items (name, price) drawn from `seed`."""
    rng = random.Random(seed)
    pairs = rng.sample([(c, t) for c in _COLORS for t in _THINGS], n)
    return [{"name": f"{c} {t}", "price": rng.randrange(5, 200)} for c, t in pairs]


def _page(title: str, body: str) -> bytes:
    return (f"<!doctype html><html><head><title>{html.escape(title)}</title></head>"
            f"<body><h3>{html.escape(title)}</h3>{body}</body></html>").encode()


class ShopApp:
    """The shop server and its per-session state (`sessions[sid]`: catalog, visited, orders)."""

    def __init__(self) -> None:
        self.sessions: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        app = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                return None

            def do_GET(self) -> None:
                app._serve(self, "GET")

            def do_POST(self) -> None:
                app._serve(self, "POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="agentax-shop", daemon=True)
        self._thread.start()

    def open_session(self, seed: int) -> str:
        """A new session with the catalog of `seed`; returns its id."""
        sid = uuid.uuid4().hex[:12]
        with self.lock:
            self.sessions[sid] = {"catalog": shop_catalog(seed), "visited": set(), "orders": []}
        return sid

    def state(self, sid: str) -> dict[str, Any]:
        """A copy of the session's state (empty if it is gone)."""
        with self.lock:
            s = self.sessions.get(sid)
            return {} if s is None else {"catalog": s["catalog"], "visited": set(s["visited"]),
                                         "orders": list(s["orders"])}

    def close_session(self, sid: str) -> None:
        with self.lock:
            self.sessions.pop(sid, None)

    def _serve(self, req: BaseHTTPRequestHandler, method: str) -> None:
        parts = urllib.parse.urlsplit(req.path)
        segs = [s for s in parts.path.split("/") if s]
        with self.lock:
            session = self.sessions.get(segs[1]) if len(segs) >= 2 and segs[0] == "s" else None
        if session is None:
            return self._send(req, 404, _page("Not found", "<p>No such page.</p>"))
        base, rest = f"/s/{segs[1]}", segs[2:]
        catalog = session["catalog"]
        if not rest:
            body = (f'<form action="{base}/search" method="get"><input type="text" name="q" '
                    'placeholder="Search"> <button type="submit">Search</button></form>')
            return self._send(req, 200, _page("Shop", body))
        if rest == ["search"]:
            q = urllib.parse.parse_qs(parts.query).get("q", [""])[0].lower().split()
            hits = [(k, it) for k, it in enumerate(catalog) if q and all(w in it["name"] for w in q)]
            items = "".join(f'<li><a href="{base}/item/{k}">{html.escape(it["name"])}</a></li>' for k, it in hits)
            body = f"<p>{len(hits)} results</p><ul>{items}</ul><a href=\"{base}/\">New search</a>"
            return self._send(req, 200, _page("Results", body))
        if len(rest) == 2 and rest[0] == "item" and rest[1].isdigit() and int(rest[1]) < len(catalog):
            k = int(rest[1])
            it = catalog[k]
            with self.lock:
                session["visited"].add(k)
            opts = "".join(f"<option>{n}</option>" for n in range(1, 6))
            body = (f"<p>Price: ${it['price']}</p><form action=\"{base}/order\" method=\"post\">"
                    f'<input type="hidden" name="item" value="{k}">'
                    '<label>Name <input type="text" name="name"></label> '
                    f'<label>Quantity <select name="qty">{opts}</select></label> '
                    '<button type="submit">Order</button></form>')
            return self._send(req, 200, _page(it["name"], body))
        if rest == ["order"] and method == "POST":
            n = int(req.headers.get("Content-Length") or 0)
            form = urllib.parse.parse_qs(req.rfile.read(min(n, 10_000)).decode(errors="replace"))
            try:
                order = {"item": int(form["item"][0]), "qty": int(form.get("qty", ["1"])[0]),
                         "name": form.get("name", [""])[0].strip()}
            except (KeyError, ValueError):
                return self._send(req, 400, _page("Error", "<p>Bad order.</p>"))
            with self.lock:
                session["orders"].append(order)
            return self._send(req, 200, _page("Order placed", "<p>Thank you for your order.</p>"))
        return self._send(req, 404, _page("Not found", "<p>No such page.</p>"))

    @staticmethod
    def _send(req: BaseHTTPRequestHandler, code: int, body: bytes) -> None:
        req.send_response(code)
        req.send_header("Content-Type", "text/html; charset=utf-8")
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


_APP: ShopApp | None = None
_APP_LOCK = threading.Lock()


def shop_app() -> ShopApp:
    """This process's shop server (started on first use)."""
    global _APP
    with _APP_LOCK:
        if _APP is None:
            _APP = ShopApp()
        return _APP


class WebTasksSite(BrowserSite):
    """The `web_tasks` site: order tasks in the local shop (`task.meta["seed"]`)."""

    def __init__(self) -> None:
        self.app = shop_app()
        self._sessions: dict[str, str] = {}

    def _sid(self, task: Task) -> str:
        key = f"{task.id}#{id(task)}"
        if key not in self._sessions:
            self._sessions[key] = self.app.open_session(int(task.meta.get("seed", 0)))
        return self._sessions[key]

    def start_url(self, task: Task) -> str:
        return f"{self.app.url}/s/{self._sid(task)}/"

    async def setup(self, page: Any, task: Task) -> str:
        return task.prompt

    def _score(self, task: Task) -> tuple[float, bool, dict[str, float]]:
        st = self.app.state(self._sid(task))
        want = task.meta["order"]
        orders = st.get("orders", [])
        ok = len(orders) == 1 and orders[0] == want
        metrics = {"success": float(ok), "found_item": float(want["item"] in st.get("visited", ())),
                   "ordered": float(bool(orders))}
        return float(ok), bool(orders), metrics

    async def check(self, page: Any, task: Task, state: Any) -> tuple[float, bool, Mapping[str, float]]:
        reward, done, metrics = self._score(task)
        return (reward, True, metrics) if done else (0.0, False, {})

    async def finish(self, page: Any, task: Task, answer: str) -> tuple[float, Mapping[str, float]]:
        reward, _done, metrics = self._score(task)
        return reward, metrics

    async def release(self, task: Task) -> None:
        sid = self._sessions.pop(f"{task.id}#{id(task)}", None)
        if sid is not None:
            self.app.close_session(sid)


register_browser_site("web_tasks", WebTasksSite)


def web_task(seed: int) -> Task:
    """The shop order task of `seed`: one item of its catalog, a quantity and a name."""
    rng = random.Random(f"web_tasks/{seed}")
    catalog = shop_catalog(seed)
    k, qty, name = rng.randrange(len(catalog)), rng.randrange(1, 6), rng.choice(_NAMES)
    prompt = f"Order {qty} of the {catalog[k]['name']} for {name}."
    return Task(id=f"web_tasks:order/{seed}", prompt=prompt,
                meta={"site": "web_tasks", "seed": int(seed), "order": {"item": k, "qty": qty, "name": name}})


def web_tasks(seeds: Iterable[int]) -> list[Task]:
    """`web_task(seed)` for each seed."""
    return [web_task(s) for s in seeds]
