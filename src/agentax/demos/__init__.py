"""agentax.demos: record demonstrations for a warm start by running a scripted policy through
your own environment and agent (see docs/training.md, "Demonstrations for your own task").

    from agentax.demos import record_many
    convs = record_many(make_env, make_agent, train_tasks, policy)   # -> sft.demos
"""

from agentax.demos._record import (
           Demonstration,
           Reply,
           arecord,
           record,
           record_many,
           reply_text,
)
from agentax.demos._web import click_target

__all__ = ["Demonstration", "Reply", "arecord", "click_target", "record", "record_many",
           "reply_text"]
