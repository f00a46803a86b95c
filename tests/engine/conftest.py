"""Fixtures for the engine tests: one tiny model and one engine shape (compiled once)."""

from __future__ import annotations

import pytest
from engine_helpers import CFG
from flax import nnx

from agentax.engine import Engine
from agentax.models import ModelConfig, Transformer


@pytest.fixture(scope="session")
def model() -> Transformer:
    return Transformer(ModelConfig.tiny(), rngs=nnx.Rngs(0))


@pytest.fixture
def engine(model):
    eng = Engine(model, CFG)
    yield eng
    eng.shutdown()
