"""agentax.cli: the `agentax` command and the typed run configuration behind it.

* `main(argv)` — `agentax train | sft | eval | show | doctor | export | serve | config`.
* `RunConfig` and its sections (`RunSection`, `InitConfig`, `EnvConfig`, `AgentConfig`,
  `TasksConfig`, `SFTConfig`, `EvalConfig`, `TracingConfig`; the rest are the library's own
  configs), `load_config(path, overrides)`, `parse_overrides`, `dump_config`.
* `config_reference()` — the Markdown of docs/config.md, generated from the dataclasses.
"""

from agentax.cli._config import (
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
