"""FrozenLake with a custom agent, trained from Python with the shipped `frozen_lake` recipe.

The recipe's parts (agentax/recipes/frozen_lake.py, named by import path in its YAML): every
task is one random 4x4 map; the environment wraps FrozenLake-v1 (GymnasiumEnvironment: a grid
formatter that shows the map ahead, a forgiving action parser); the agent is FrozenLakeAgent,
an Agent subclass that reads "left", "L", "0", "Action: left" alike, and a reply that names no
action comes back as feedback, never as a crash. `train` warms the tiny model up on a noisy
planner's demonstrations (SFT), then runs async GRPO on the maps and evaluates on held-out
ones, exactly as `agentax train frozen_lake`. Your own environment or agent plugs in the same
way: `env.factory=package.module:function` (see docs/quickstart.md).

Run: python examples/frozen_lake_agent.py [--steps N]   (40: the recipe's full run)
     python examples/frozen_lake_agent.py --quick   (one RL step after a 10-step warm start:
     a check of the wiring that learns nothing)
"""

import argparse

from agentax.run import Hook, train


def main(steps, quick=False):
    # --quick: a 10-step warm start, and every group trained on: the wiring, not the learning
    smoke = ["sft.steps=10", "pipeline.filters=[]"] if quick else []
    show = Hook(lambda s: print(f"step {s.step}: reward {s.metrics.get('reward', 0):.3f}, "
                                f"holes {s.metrics.get('hole', 0):.2f}"))
    result = train("frozen_lake", hooks=[show], overrides=[
        f"run.steps={steps}", f"tasks.num_eval={min(64, 8 * steps)}", "tracing.console=false",
        *smoke])
    before, after = result.eval_before, result.eval_after
    print(f"trained {result.steps} RL steps; held-out greedy success "
          f"{before['eval/greedy/success']:.2f} -> {after['eval/greedy/success']:.2f}; "
          f"run directory {result.run_dir}")
    assert result.steps == steps


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--quick", action="store_true",
                        help="one RL step after a 10-step warm start (the wiring, not the learning)")
    args = parser.parse_args()
    main(1 if args.quick else args.steps, args.quick)
