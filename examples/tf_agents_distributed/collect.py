"""The collector: an ``Actor`` stepping CartPole with the trainer's collect policy and
writing its experience to the replay table, its weights updated from the variables table.

    python examples/tf_agents_distributed/collect.py --root_dir=/tmp/cartpole --server=localhost:8008

As in TF-Agents' sac_collect.py: it loads the collect policy the trainer saved, then
connects (waiting for the server) and updates the policy (waiting for the first push).
"""

from __future__ import annotations

import reverb
from absl import app, flags, logging
from tf_agents.policies import random_py_policy
from tf_agents.replay_buffers import reverb_replay_buffer, reverb_utils
from tf_agents.train import actor, learner
from tf_agents.train.utils import train_utils

import cartpole_dqn
from varsync.compat.tf_agents import DEFAULT_TABLE, POLICY_KEY, TRAIN_STEP_KEY
from varsync.compat.tf_agents import ReverbVariableContainer

flags.DEFINE_integer("initial_collect_steps", 100, "Random steps before the first policy step.")
flags.DEFINE_integer("steps_per_update", 10, "Environment steps between two policy updates.")
FLAGS = flags.FLAGS


def main(_: object) -> None:
    logging.set_verbosity(logging.INFO)
    policy = train_utils.wait_for_policy(
        cartpole_dqn.policy_dir(FLAGS.root_dir, learner.COLLECT_POLICY_SAVED_MODEL_DIR),
        load_specs_from_pbtxt=True,
    )
    env = cartpole_dqn.environment()
    train_step = train_utils.create_train_step()
    variables = {POLICY_KEY: policy.variables(), TRAIN_STEP_KEY: train_step}
    container = ReverbVariableContainer(FLAGS.server, table_names=[DEFAULT_TABLE])
    container.update(variables)

    observer = reverb_utils.ReverbAddTrajectoryObserver(
        reverb.Client(FLAGS.server), table_name=reverb_replay_buffer.DEFAULT_TABLE,
        sequence_length=2, stride_length=1,
    )
    random_policy = random_py_policy.RandomPyPolicy(env.time_step_spec(), env.action_spec())
    actor.Actor(env, random_policy, train_step, steps_per_run=FLAGS.initial_collect_steps,
                observers=[observer]).run()
    collect_actor = actor.Actor(env, policy, train_step, steps_per_run=FLAGS.steps_per_update,
                                observers=[observer])
    acting_with = None
    while True:
        step = int(train_step.numpy())
        if step != acting_with:
            cartpole_dqn.say("collector", f"acting with train step {step} checksum "
                             f"{cartpole_dqn.checksum(variables[POLICY_KEY])}")
            acting_with = step
        if step >= FLAGS.max_train_steps:
            break
        collect_actor.run()
        container.update(variables)
    observer.close()
    cartpole_dqn.say("collector", f"done at train step {step}")


if __name__ == "__main__":
    flags.mark_flags_as_required(["root_dir"])
    app.run(main)
