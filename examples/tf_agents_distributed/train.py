"""The trainer: a TF-Agents ``Learner`` on the replay table, pushing the policy's
variables and train step to the variables table after every few train steps.

    python examples/tf_agents_distributed/train.py --root_dir=/tmp/cartpole --server=localhost:8008

As in TF-Agents' sac_train.py, it saves its policies (``PolicySavedModelTrigger``) before
it connects, so it always starts before the server that needs them: the container's
constructor waits for the server. Unlike that example, it pushes only after the
``Learner`` restored its checkpoint (one every push), so a restarted trainer goes on from
the step it last published instead of publishing step 0 first.
"""

from __future__ import annotations

import time

import tensorflow as tf
from absl import app, flags, logging
from tf_agents.replay_buffers import reverb_replay_buffer
from tf_agents.train import learner, triggers
from tf_agents.train.utils import train_utils

import cartpole_dqn
from varsync.compat.tf_agents import DEFAULT_TABLE, POLICY_KEY, TRAIN_STEP_KEY
from varsync.compat.tf_agents import ReverbVariableContainer

flags.DEFINE_integer("steps_per_push", 5, "Train steps between two pushes (and checkpoints).")
flags.DEFINE_integer("batch_size", 32, "Transitions per train step.")
flags.DEFINE_integer("policy_save_interval", 100, "Train steps between policy checkpoints.")
flags.DEFINE_float("pause", 0.05, "Seconds to rest after each push (pacing, so actors keep up).")
FLAGS = flags.FLAGS


def main(_: object) -> None:
    logging.set_verbosity(logging.INFO)
    train_step = train_utils.create_train_step()
    agent = cartpole_dqn.create_agent(train_step, cartpole_dqn.environment())

    # Saves the initial policies now (unless there), then policy checkpoints.
    save_policies = triggers.PolicySavedModelTrigger(
        f"{FLAGS.root_dir}/{learner.POLICY_SAVED_MODEL_DIR}", agent, train_step,
        interval=FLAGS.policy_save_interval,
    )
    cartpole_dqn.say("trainer", "has its policies saved")

    variables = {POLICY_KEY: agent.collect_policy.variables(), TRAIN_STEP_KEY: train_step}
    container = ReverbVariableContainer(FLAGS.server, table_names=[DEFAULT_TABLE])
    replay = reverb_replay_buffer.ReverbReplayBuffer(
        agent.collect_data_spec, sequence_length=2, table_name=reverb_replay_buffer.DEFAULT_TABLE,
        server_address=FLAGS.server,
    )

    def experience_dataset_fn() -> tf.data.Dataset:
        return replay.as_dataset(sample_batch_size=FLAGS.batch_size, num_steps=2).prefetch(3)

    dqn_learner = learner.Learner(
        FLAGS.root_dir, train_step, agent, experience_dataset_fn,
        triggers=[save_policies], checkpoint_interval=FLAGS.steps_per_push,
    )
    cartpole_dqn.say("trainer", f"starts at train step {int(train_step.numpy())}")
    while True:
        container.push(variables)
        step = int(train_step.numpy())
        cartpole_dqn.say("trainer", f"pushed train step {step} checksum "
                         f"{cartpole_dqn.checksum(variables[POLICY_KEY])}")
        if step >= FLAGS.max_train_steps:
            break
        time.sleep(FLAGS.pause)
        dqn_learner.run(iterations=FLAGS.steps_per_push)
    save_policies(step, force_trigger=True)
    cartpole_dqn.say("trainer", f"done at train step {step}")


if __name__ == "__main__":
    flags.mark_flags_as_required(["root_dir"])
    app.run(main)
