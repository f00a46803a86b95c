"""Fixtures for the endpoint tests: a tiny real engine (compiled once per module)."""

from __future__ import annotations

import pytest
from flax import nnx
from serve_helpers import MODEL, Recording

from agentax.engine import Engine, EngineConfig
from agentax.models import Transformer
from agentax.text import ByteTokenizer


@pytest.fixture(scope="module")
def tok():
    return ByteTokenizer()


@pytest.fixture(scope="module")
def engine(tok):
    eng = Engine(Transformer(MODEL, rngs=nnx.Rngs(0)),
                 EngineConfig(max_slots=8, max_seq_len=512, prefill_chunk=128, decode_steps_per_call=4),
                 eos_token_ids=tok.eos_token_ids, tokenizer=tok)
    yield eng
    eng.shutdown()


@pytest.fixture
def recording(engine):
    return Recording(engine)
