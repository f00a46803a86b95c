"""`SnapshotPolicy`: a role played by a frozen snapshot of the trained policy.

Self-play against an earlier version of oneself (e.g. the policy of at most 4 steps ago)
keeps the opponent from moving every step. The snapshot needs weights, not a trainer: it
samples from an inference engine of its own that holds one extra copy of the parameters (in
the model's dtype, no optimizer state, no gradients) and its own KV cache; every `every` RL
steps, right after the trainer's weights are published to the main engine, the trainer's
current parameters are copied into it (`params_for_engine()`, fresh buffers the next train
step does not touch). The main engine never holds two versions, so its batches stay one
kernel over one set of weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentax.records import Completion, SamplingParams

__all__ = ["SnapshotPolicy"]


class SnapshotPolicy:
    """A `GenerateFn` answering from a frozen snapshot of the trained policy.

    Args:
      engine: the engine that holds the snapshot's weights (an `agentax.engine.Engine`
        built from the trainer's current model, e.g. `Engine(trainer.export_model(), ...)`,
        or anything with generate/release/update_weights(state, version)).
      every: RL steps between two advances: at step k*every the snapshot becomes the
        policy of that step, so it lags the trained policy by 0 to every-1 versions.

    Use it as `RolePolicy(engine=snapshot, trained=False)` and wrap the pipeline's publish so
    it advances: `pipeline.publish_fn = snapshot.publisher(pipeline.publish_fn)`. Its tokens carry
    the snapshot's policy version and are never trained on.
    """

    def __init__(self, engine: Any, every: int) -> None:
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"SnapshotPolicy.every must be a positive int, got {every!r}")
        for name in ("generate", "release", "update_weights"):
            if not callable(getattr(engine, name, None)):
                raise TypeError(f"SnapshotPolicy's engine needs {name}(); "
                                f"{type(engine).__name__} has none")
        self.engine = engine
        self.every = every
        self.advances = 0
        self.calls = 0

    @property
    def version(self) -> int:
        """The policy version of the snapshot (the step it was taken at)."""
        return int(getattr(self.engine, "policy_version", -1))

    async def generate(self, prompt_ids: Any, params: SamplingParams, *,
                       sequence_id: int | None = None) -> Completion:
        """The snapshot's completion (tokens tagged with the snapshot's version)."""
        self.calls += 1
        return await self.engine.generate(prompt_ids, params, sequence_id=sequence_id)

    def release(self, sequence_id: int) -> None:
        """Frees a sequence of the snapshot's engine."""
        self.engine.release(sequence_id)

    def advance(self, trainer: Any, version: int) -> bool:
        """At a multiple of `every`, the trainer's current weights become the snapshot
        (version `version`); True when it advanced. Call it where no train step runs (the
        pipeline's publish does)."""
        if version % self.every:
            return False
        self.engine.update_weights(trainer.params_for_engine(), version)
        self.advances += 1
        return True

    def publisher(self, publish: Callable[[Any, Any, int], None]) -> Callable[[Any, Any, int], None]:
        """`publish(trainer, engine, version)` for `Pipeline` that also advances the snapshot."""
        def publish_and_advance(trainer: Any, engine: Any, version: int) -> None:
            publish(trainer, engine, version)
            self.advance(trainer, version)
        return publish_and_advance

    def shutdown(self) -> None:
        """Shuts the snapshot's engine down (when it has `shutdown`)."""
        stop = getattr(self.engine, "shutdown", None)
        if callable(stop):
            stop()
