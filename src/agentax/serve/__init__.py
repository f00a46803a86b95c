"""agentax.serve: an OpenAI-compatible chat-completions endpoint served by the engine.

* `ChatServer(engine, tokenizer)` — `POST /v1/chat/completions`, `GET /v1/models` on loopback,
  in the engine's own process and event loop (Starlette on uvicorn); `agentax serve` runs one.
* `Session` — one agent's conversation: continues its engine sequence across calls and records
  it token-exactly as a `Trajectory` (a history rewrite starts a new segment).
* `OpenAIAgentEnvironment` — trains an agent written against the `openai` SDK (or any program
  given OPENAI_BASE_URL / OPENAI_API_KEY) through the `Collector` / `Pipeline`; `Reward(x)` is
  what its `run` returns to give a reward (any other return value is its final answer).

See docs/openai.md.
"""

from agentax.serve._env import AGENT_OUTCOMES, OpenAIAgentEnvironment, Reward
from agentax.serve._server import ChatServer
from agentax.serve._session import Session, SessionLimits

__all__ = ["AGENT_OUTCOMES", "ChatServer", "OpenAIAgentEnvironment", "Reward", "Session", "SessionLimits"]
