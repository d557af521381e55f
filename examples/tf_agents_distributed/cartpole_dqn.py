"""What the four programs of this example share: the task, the agent, the flags, logs.

A TF-Agents distributed DQN on CartPole, laid out like TF-Agents' own distributed SAC
example (tf_agents/experimental/distributed/examples/sac): a Reverb server, a trainer
(``Learner``), a collector and an evaluator (``Actor``s), each its own process, which
share the policy through a ``ReverbVariableContainer``. The one change from a TF-Agents
program is the import of that class, from ``varsync.compat.tf_agents``.

Networks and batches are tiny so that the whole job runs in a minute on two cores.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any, Sequence

import numpy as np
import tensorflow as tf
from absl import flags
from tf_agents.agents import tf_agent
from tf_agents.agents.dqn import dqn_agent
from tf_agents.environments import py_environment, suite_gym
from tf_agents.networks import q_network
from tf_agents.train import learner
from tf_agents.utils import common

ENVIRONMENT = "CartPole-v0"

flags.DEFINE_string("root_dir", None, "Folder shared by the jobs: saved policies, checkpoints.")
flags.DEFINE_string("server", "localhost:8008", "Address of the Reverb server (replay and variables).")
flags.DEFINE_integer("max_train_steps", 400, "Train steps after which every job ends.")
FLAGS = flags.FLAGS


def environment() -> py_environment.PyEnvironment:
    return suite_gym.load(ENVIRONMENT)


def create_agent(train_step: tf.Variable, env: py_environment.PyEnvironment,
                 learning_rate: float = 1e-3) -> tf_agent.TFAgent:
    """A DQN agent with one hidden layer of 16 units."""
    from tf_agents.train.utils import spec_utils

    observation_spec, action_spec, time_step_spec = spec_utils.get_tensor_specs(env)
    network = q_network.QNetwork(observation_spec, action_spec, fc_layer_params=(16,))
    agent = dqn_agent.DqnAgent(
        time_step_spec,
        action_spec,
        q_network=network,
        optimizer=tf.keras.optimizers.Adam(learning_rate=learning_rate),
        td_errors_loss_fn=common.element_wise_squared_loss,
        epsilon_greedy=0.2,
        target_update_period=10,
        train_step_counter=train_step,
    )
    agent.initialize()
    return agent


def policy_dir(root_dir: str, which: str) -> str:
    """Where the trainer's ``PolicySavedModelTrigger`` saves the ``which`` policy
    (``learner.COLLECT_POLICY_SAVED_MODEL_DIR`` or ``GREEDY_POLICY_SAVED_MODEL_DIR``)."""
    return os.path.join(root_dir, learner.POLICY_SAVED_MODEL_DIR, which)


def checksum(variables: Sequence[Any]) -> str:
    """The exact sum of every weight: equal on two processes exactly when (in practice)
    they hold the same weights, whatever the order of the variables."""
    flat = [np.asarray(v.numpy(), np.float64).ravel() for v in tf.nest.flatten(variables)]
    return repr(math.fsum(np.concatenate(flat)))


def say(role: str, message: str) -> None:
    """One line on stdout, at once (the logs the test and a user read)."""
    print(f"{role}: {message}", flush=True)
    sys.stdout.flush()
