"""The evaluator: an ``Actor`` running the trainer's greedy policy for whole episodes
whenever the train step has moved on by ``eval_interval``, as TF-Agents' eval_job.py.

    python examples/tf_agents_distributed/evaluate.py --root_dir=/tmp/cartpole --server=localhost:8008
"""

from __future__ import annotations

import time

from absl import app, flags, logging
from tf_agents.metrics import py_metrics
from tf_agents.train import actor, learner
from tf_agents.train.utils import train_utils

import cartpole_dqn
from varsync.compat.tf_agents import DEFAULT_TABLE, POLICY_KEY, TRAIN_STEP_KEY
from varsync.compat.tf_agents import ReverbVariableContainer

flags.DEFINE_integer("eval_interval", 100, "Train steps between two evaluations.")
flags.DEFINE_integer("eval_episodes", 2, "Episodes per evaluation.")
flags.DEFINE_float("poll", 0.2, "Seconds between two looks at the train step.")
FLAGS = flags.FLAGS


def main(_: object) -> None:
    logging.set_verbosity(logging.INFO)
    policy = train_utils.wait_for_policy(
        cartpole_dqn.policy_dir(FLAGS.root_dir, learner.GREEDY_POLICY_SAVED_MODEL_DIR),
        load_specs_from_pbtxt=True,
    )
    container = ReverbVariableContainer(FLAGS.server, table_names=[DEFAULT_TABLE])
    train_step = train_utils.create_train_step()
    variables = {POLICY_KEY: policy.variables(), TRAIN_STEP_KEY: train_step}
    average_return = py_metrics.AverageReturnMetric(buffer_size=FLAGS.eval_episodes)
    eval_actor = actor.Actor(cartpole_dqn.environment(), policy, train_step,
                             episodes_per_run=FLAGS.eval_episodes, metrics=[average_return],
                             name="eval_actor")
    last_eval = None
    while True:
        container.update(variables)
        step = int(train_step.numpy())
        if last_eval is None or step >= last_eval + FLAGS.eval_interval or (
            step >= FLAGS.max_train_steps
        ):
            eval_actor.run()
            cartpole_dqn.say("evaluator", f"train step {step}: average return "
                             f"{float(average_return.result()):.1f}")
            last_eval = step
        if step >= FLAGS.max_train_steps:
            break
        time.sleep(FLAGS.poll)
    cartpole_dqn.say("evaluator", f"done at train step {step}")


if __name__ == "__main__":
    flags.mark_flags_as_required(["root_dir"])
    app.run(main)
