"""The Reverb server: a replay table and the variables table, as TF-Agents' example makes
them (sac_reverb_server.py). It needs the specs of the trainer's saved collect policy, so
it starts serving only once the trainer has saved it: the trainer and actors wait for it.

    python examples/tf_agents_distributed/reverb_server.py --root_dir=/tmp/cartpole --port=8008
"""

from __future__ import annotations

import reverb
import tensorflow as tf
from absl import app, flags, logging
from tf_agents.replay_buffers import reverb_replay_buffer
from tf_agents.specs import tensor_spec
from tf_agents.train import learner
from tf_agents.train.utils import train_utils

import cartpole_dqn
from varsync.compat.tf_agents import DEFAULT_TABLE, POLICY_KEY, TRAIN_STEP_KEY

flags.DEFINE_integer("port", 8008, "Port to serve on.")
flags.DEFINE_integer("replay_capacity", 10_000, "Capacity of the replay table.")
flags.DEFINE_integer("min_replay_size", 64, "Items in the replay table before sampling.")
FLAGS = flags.FLAGS


def main(_: object) -> None:
    logging.set_verbosity(logging.INFO)
    collect_policy = train_utils.wait_for_policy(
        cartpole_dqn.policy_dir(FLAGS.root_dir, learner.COLLECT_POLICY_SAVED_MODEL_DIR),
        load_specs_from_pbtxt=True,
    )
    variables = {
        POLICY_KEY: collect_policy.variables(),
        TRAIN_STEP_KEY: train_utils.create_train_step(),
    }
    variables_signature = tf.nest.map_structure(
        lambda variable: tf.TensorSpec(variable.shape, dtype=variable.dtype), variables
    )
    replay_signature = tensor_spec.add_outer_dim(
        tensor_spec.from_spec(collect_policy.collect_data_spec)
    )
    server = reverb.Server(
        tables=[
            reverb.Table(
                name=reverb_replay_buffer.DEFAULT_TABLE,
                sampler=reverb.selectors.Uniform(),
                remover=reverb.selectors.Fifo(),
                rate_limiter=reverb.rate_limiters.MinSize(FLAGS.min_replay_size),
                max_size=FLAGS.replay_capacity,
                max_times_sampled=0,
                signature=replay_signature,
            ),
            reverb.Table(
                name=DEFAULT_TABLE,
                sampler=reverb.selectors.Uniform(),
                remover=reverb.selectors.Fifo(),
                rate_limiter=reverb.rate_limiters.MinSize(1),
                max_size=1,
                max_times_sampled=0,
                signature=variables_signature,
            ),
        ],
        port=FLAGS.port,
    )
    cartpole_dqn.say("server", f"serving on port {server.port}")
    server.wait()


if __name__ == "__main__":
    flags.mark_flags_as_required(["root_dir"])
    app.run(main)
