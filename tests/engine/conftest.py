"""Fixtures for the engine tests: one tiny model and one engine shape (compiled once).

JAX is imported inside the fixtures, so `test_scheduler.py` runs without it.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def model():
    from flax import nnx

    from agentax.models import ModelConfig, Transformer

    return Transformer(ModelConfig.tiny(), rngs=nnx.Rngs(0))


@pytest.fixture
def engine(model):
    from engine_helpers import CFG

    from agentax.engine import Engine

    eng = Engine(model, CFG)
    yield eng
    eng.shutdown()
