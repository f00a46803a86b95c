"""agentax.cli: the `agentax` command, argument parsing over `agentax.run`.

* `main(argv)` — `agentax train | sft | eval | show | doctor | export | serve | config`;
  `train`, `sft` and `eval` call `agentax.run.train`, `sft` and `evaluate`.
* `RunConfig`, its sections, `load_config`, `parse_overrides`, `dump_config` — re-exported
  from `agentax.run`, where they live.
* `config_reference()` — the Markdown of docs/config.md, generated from the dataclasses.
"""

from agentax.run import (
    AgentConfig,
    EnvConfig,
    EvalConfig,
    InitConfig,
    RunConfig,
    RunSection,
    SFTConfig,
    TasksConfig,
    TracingConfig,
    dump_config,
    load_config,
    parse_overrides,
)
from agentax.cli._docs import config_reference
from agentax.cli._main import main

__all__ = [
    "AgentConfig",
    "EnvConfig",
    "EvalConfig",
    "InitConfig",
    "RunConfig",
    "RunSection",
    "SFTConfig",
    "TasksConfig",
    "TracingConfig",
    "config_reference",
    "dump_config",
    "load_config",
    "main",
    "parse_overrides",
]
