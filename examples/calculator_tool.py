"""Multi-turn tool use, trained from Python with `agentax.run.train`: what `agentax train` does.

`RunConfig()`'s defaults are the embedded CPU demo: a tiny byte-level model learns to call a
calculator (Hermes `<tool_call>` JSON), read its result and answer. `train` warms it up with
SFT on demonstrations, evaluates it on held-out questions, runs async GRPO through the
pipeline, evaluates again and writes one run directory (config.yaml, metrics.jsonl, the trace,
checkpoints, transcripts, curves.png; `agentax show RUN_DIR` reads it). A `Hook` runs after
every N-th RL step with the step's metrics. The pieces it assembles (engine, collector,
trainer, pipeline) are shown one by one in math_single_turn.py.

Run: python examples/calculator_tool.py [--steps N]   (30: the full demo, two minutes or so on
a CPU; fewer RL steps shorten the evaluations with them, never the warm start). --quick: one RL
step after a 10-step warm start, a check of the wiring that learns nothing.
"""

import argparse

from agentax.run import Hook, RunConfig, train


def main(steps, quick=False):
    # --quick: a 10-step warm start, and every group trained on: the wiring, not the learning
    smoke = ["sft.steps=10", "pipeline.filters=[]"] if quick else []
    config = RunConfig()  # the embedded CPU demo; a recipe: train("frozen_lake"), a YAML path
    show = Hook(lambda s: print(f"step {s.step}: reward {s.metrics.get('reward', 0):.3f}"))
    result = train(config, hooks=[show],  # overrides as on the command line
                   overrides=[f"run.steps={steps}", f"tasks.num_eval={min(64, 8 * steps)}",
                              *smoke])
    before, after = result.eval_before, result.eval_after
    print(f"trained {result.steps} RL steps; held-out greedy success "
          f"{before['eval/greedy/success']:.2f} -> {after['eval/greedy/success']:.2f}; "
          f"run directory {result.run_dir}")
    assert result.steps == steps


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--quick", action="store_true",
                        help="one RL step after a 10-step warm start (the wiring, not the learning)")
    args = parser.parse_args()
    main(1 if args.quick else args.steps, args.quick)
