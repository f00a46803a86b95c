"""agentax.agents: map observations to chat messages and model replies to actions.

Agents hold the conversation and never call a model; `TrajectoryBuilder` assembles an episode
as one token-exact stream for training. See docs/agents.md.
"""

from agentax.agents._base import Agent, ModelAgent
from agentax.agents._frozen_lake import FrozenLakeAgent
from agentax.agents._swe import SWEAgent
from agentax.agents._tool import ToolAgent, tool_schemas
from agentax.agents._trajectory import TrajectoryBuilder
from agentax.agents._web import CompactWebAgent, compact_view, page_controls

__all__ = [
    "Agent",
    "CompactWebAgent",
    "FrozenLakeAgent",
    "ModelAgent",
    "SWEAgent",
    "ToolAgent",
    "TrajectoryBuilder",
    "compact_view",
    "page_controls",
    "tool_schemas",
]
