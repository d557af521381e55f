"""varsync.integrations.torchrl: TorchRL collectors take their policy weights from a
varsync URL, through TorchRL's own extension point (a WeightSyncScheme subclass).

Real collectors on TorchRL's PendulumEnv (pure torch, no gym): a single-process
``Collector`` receiving over memory://, and a ``MultiSyncCollector`` whose spawned
workers receive over shm:// and redis://. A policy's action is a linear function of the
observation, so each collected batch shows which weights produced it.
"""

from __future__ import annotations

import itertools
import logging
import os
import pathlib
import pickle
import re
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Callable, Iterator

import pytest

pytest.importorskip("torch", reason="the TorchRL integration needs torch")
pytest.importorskip(
    "torchrl", reason="the TorchRL integration needs torchrl (pip install torchrl)"
)

import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from tensordict.nn import TensorDictModule  # noqa: E402
from torchrl._utils import logger as torchrl_logger  # noqa: E402
from torchrl.collectors import Collector, MultiSyncCollector  # noqa: E402
from torchrl.envs import PendulumEnv  # noqa: E402

import varsync  # noqa: E402
from varsync.integrations.torchrl import VarsyncWeightSyncScheme  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "torchrl.md"


class Actor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(2, 1)

    def forward(self, th: torch.Tensor, thdot: torch.Tensor) -> torch.Tensor:
        return self.net(torch.stack([th, thdot], -1))


def make_policy(seed: int = 0) -> TensorDictModule:
    torch.manual_seed(seed)
    return TensorDictModule(Actor(), in_keys=["th", "thdot"], out_keys=["action"])


def train_step(policy: TensorDictModule, delta: float = 0.5) -> None:
    with torch.no_grad():
        policy.module.net.weight.add_(delta)
        policy.module.net.bias.sub_(delta)


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


def acted_by(policy: TensorDictModule, batch: Any) -> bool:
    """Every action in ``batch`` is what ``policy`` does on that step's observation."""
    with torch.no_grad():
        expected = policy.module(batch["th"], batch["thdot"])
    return torch.allclose(batch["action"], expected, atol=1e-6)


def each_step_acted_by_one_of(batch: Any, *policies: TensorDictModule) -> bool:
    with torch.no_grad():
        close = [
            torch.isclose(batch["action"], p.module(batch["th"], batch["thdot"]), atol=1e-6)
            for p in policies
        ]
    return bool(torch.stack(close).any(0).all())


def tensor_by_tensor_mixes(old: TensorDictModule, new: TensorDictModule) -> list[TensorDictModule]:
    """Every policy whose each tensor is ``old``'s or ``new``'s: what a worker runs while
    the background thread copies an update one tensor after another (the module doc)."""
    old_state, new_state = old.state_dict(), new.state_dict()
    mixes = []
    for choice in itertools.product((old_state, new_state), repeat=len(old_state)):
        mix = make_policy(0)
        mix.load_state_dict({k: state[k] for k, state in zip(old_state, choice)})
        mixes.append(mix)
    return mixes


def eventually(check: Callable[[], bool], within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def publisher_for(url: str, policy: torch.nn.Module, **options: Any) -> VarsyncWeightSyncScheme:
    scheme = VarsyncWeightSyncScheme(url, "policy", **options)
    scheme.init_on_sender(model=policy)
    scheme.connect()
    return scheme


def collector_for(url: str, policy: TensorDictModule, **options: Any) -> Collector:
    return Collector(
        PendulumEnv(), policy, frames_per_batch=8, total_frames=-1,
        weight_recv_schemes={"policy": VarsyncWeightSyncScheme(url, "policy", **options)},
    )


def memory_url() -> str:
    return f"memory://torchrl-{uuid.uuid4().hex[:12]}"


# -- the documented example --------------------------------------------------------------


def test_the_docs_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1, "docs/torchrl.md has one python example, run here"
    exec(compile(blocks[0], str(DOC), "exec"), {"__name__": "torchrl_doc_example"})


def test_import_varsync_does_not_import_torchrl() -> None:
    code = (
        "import sys, varsync; "
        "bad = [m for m in ('torchrl', 'tensordict', 'varsync.integrations') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# -- one process: a Collector receiving over memory:// ---------------------------------


def test_a_collector_follows_the_published_weights_in_the_background() -> None:
    url = memory_url()
    trainer = make_policy(0)
    publisher = publisher_for(url, trainer)
    actor = make_policy(1)
    assert not same_weights(actor, trainer)
    parameters = [id(p) for p in actor.parameters()]
    collector = collector_for(url, actor)
    try:
        assert same_weights(actor, trainer)  # version 1, loaded at start-up
        assert acted_by(trainer, next(iter(collector)))
        for version in (2, 3):
            train_step(trainer)
            assert publisher.send() == version
            assert eventually(lambda: same_weights(actor, trainer))
            assert eventually(lambda v=version: collector._receiver_schemes["policy"].version == v)
            assert acted_by(trainer, next(iter(collector)))
        assert [id(p) for p in actor.parameters()] == parameters  # in place
        assert all(p.requires_grad for p in actor.parameters())
    finally:
        collector.shutdown()
        publisher.shutdown()


def test_without_background_the_weights_change_only_when_received() -> None:
    url = memory_url()
    trainer = make_policy(0)
    publisher = publisher_for(url, trainer)
    actor = make_policy(1)
    collector = collector_for(url, actor, background=False)
    scheme = collector._receiver_schemes["policy"]
    try:
        train_step(trainer)
        publisher.send()
        time.sleep(0.2)
        assert not same_weights(actor, trainer)
        assert not acted_by(trainer, next(iter(collector)))
        collector.receive_weights()
        assert same_weights(actor, trainer) and scheme.version == 2
        assert acted_by(trainer, next(iter(collector)))
        assert scheme.receive() is None  # nothing newer: nothing applied
        started = time.monotonic()
        assert scheme.receive(timeout=0.3) is None
        assert 0.25 < time.monotonic() - started < 5
        train_step(trainer)
        publisher.send()
        received = scheme.receive(timeout=5)
        assert received is not None and scheme.version == 3
        assert torch.equal(received["module", "net", "weight"], trainer.module.net.weight)
    finally:
        collector.shutdown()
        publisher.shutdown()


def test_send_takes_a_module_a_tensordict_or_a_state_dict() -> None:
    url = memory_url()
    trainer = make_policy(0)
    publisher = publisher_for(url, trainer)
    store = varsync.connect(url)
    try:
        train_step(trainer)
        assert publisher.send(TensorDict.from_module(trainer)) == 2
        train_step(trainer)
        assert publisher.send(trainer.state_dict()) == 3
        other = make_policy(1)
        assert publisher.send(other) == 4
        pulled = store.pull("policy", like=other)
        assert all(torch.equal(pulled[k], v) for k, v in other.state_dict().items())
        with pytest.raises(varsync.SignatureError, match="missing .*unexpected"):
            publisher.send({"module.net.weight": trainer.module.net.weight, "extra": 1.0})
        with pytest.raises(ValueError, match="every worker"):
            publisher.send(worker_ids=[0])
        assert store.version("policy") == 4
    finally:
        store.close()
        publisher.shutdown()


# -- timeouts and misuse -------------------------------------------------------------------


def test_a_receiver_without_a_table_times_out() -> None:
    started = time.monotonic()
    with pytest.raises(varsync.PullTimeoutError, match="no table 'policy'"):
        collector_for(memory_url(), make_policy(), timeout=0.3)
    assert time.monotonic() - started < 10


def test_a_receiver_of_an_empty_table_times_out() -> None:
    url = memory_url()
    with varsync.connect(url) as store:
        store.create_table("policy", make_policy())
        with pytest.raises(varsync.PullTimeoutError, match="has no weights after 0.3 s"):
            collector_for(url, make_policy(), timeout=0.3)


def test_memory_urls_are_refused_in_another_process() -> None:
    url = memory_url()
    sender = publisher_for(url, make_policy())
    worker_copy = pickle.loads(pickle.dumps(sender))  # what a spawned worker gets
    worker_copy._sender_pid = os.getpid() + 1  # as if unpickled in another process
    with pytest.raises(varsync.ConfigurationError, match="shm://NAME or redis://"):
        worker_copy.init_on_receiver(model_id="policy", model=make_policy(), worker_idx=0)
    sender.shutdown()


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(varsync.ConfigurationError):
        VarsyncWeightSyncScheme("not-a-url")
    with pytest.raises(varsync.ConfigurationError):
        VarsyncWeightSyncScheme("memory://x", "")
    with pytest.raises(varsync.ConfigurationError):
        VarsyncWeightSyncScheme("memory://x", timeout=0)


# -- several processes: a MultiSyncCollector's spawned workers ------------------------------


@pytest.fixture(params=["shm", "redis"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "shm":
        pytest.importorskip("varsync_shm", reason="shm:// needs varsync_shm")
        # under the test's own directory, removed with it (not a store left in /dev/shm)
        return f"shm://torchrl-{uuid.uuid4().hex[:12]}?root={tmp_path}"
    return request.getfixturevalue("redis_namespace")()


def test_a_multiprocess_collector_follows_the_trainer(shared_url: str) -> None:
    # shm://: two workers read one push; redis://: one worker (spawning one costs ~15 s).
    workers = 2 if shared_url.startswith("shm://") else 1
    trainer = make_policy(0)
    scheme = VarsyncWeightSyncScheme(shared_url, "policy")
    collector = MultiSyncCollector(
        [PendulumEnv] * workers, trainer, frames_per_batch=8 * workers, total_frames=-1,
        weight_sync_schemes={"policy": scheme},
    )
    try:
        batches = iter(collector)
        assert scheme.version == 1  # published before the workers started
        assert acted_by(trainer, next(batches))  # stateless workers got version 1
        before = make_policy(0)
        train_step(trainer)
        collector.update_policy_weights_(trainer)
        assert scheme.version == 2
        with varsync.connect(shared_url) as store:
            assert store.version("policy") == 2
        # Batches collected before the workers applied version 2 may still come.
        for _ in range(50):
            batch = next(batches)
            if acted_by(trainer, batch):
                break
            # each step ran old or new weights, tensor by tensor (a step between the
            # weight's copy and the bias's runs one of each)
            assert each_step_acted_by_one_of(batch, *tensor_by_tensor_mixes(before, trainer))
        else:
            pytest.fail("the workers never collected with the published weights")
        assert all(acted_by(trainer, next(batches)) for _ in range(2))
    finally:
        collector.shutdown()
        scheme.shutdown()


# -- a new history: Redis restarted without persistence ------------------------------------


class Records(logging.Handler):
    """The messages TorchRL's logger (which does not propagate to the root) emits."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def torchrl_warnings() -> Iterator[list[str]]:
    records = Records()
    torchrl_logger.addHandler(records)
    yield records.messages
    torchrl_logger.removeHandler(records)


# Versions the trainer publishes in the new history: below the 3 the actor held, equal to
# it (same number, another value), and past it.
NEW_HISTORY = pytest.mark.parametrize("pushes", [1, 3, 5], ids=["below", "same", "past"])


@NEW_HISTORY
def test_a_collector_follows_the_trainer_into_a_new_history_after_a_redis_restart(
    redis_servers: Callable[..., Any], torchrl_warnings: list[str], pushes: int
) -> None:
    server = redis_servers()  # no persistence: a restart empties it
    trainer = make_policy(0)
    publisher = publisher_for(server.url, trainer)
    actor = make_policy(1)
    collector = collector_for(server.url, actor, poll_interval=0.2)
    scheme = collector._receiver_schemes["policy"]
    try:
        for _ in range(2):
            train_step(trainer)
            publisher.send()
        assert eventually(lambda: scheme.version == 3 and same_weights(actor, trainer), 30)
        server.restart()
        for _ in range(pushes):
            train_step(trainer, delta=-2.0)  # weights the old history never had
            publisher.send()
        assert publisher.version == pushes  # the trainer's push made the table again
        assert eventually(
            lambda: scheme.version == pushes and same_weights(actor, trainer), 30
        ), f"the actor holds v{scheme.version}; warnings: {torchrl_warnings}"
        assert acted_by(trainer, next(iter(collector)))
        resets = [m for m in torchrl_warnings if "new history" in m]
        assert len(resets) == 1, torchrl_warnings  # once, not every poll
    finally:
        collector.shutdown()
        scheme.shutdown()  # its thread: Collector.shutdown leaves receiver schemes running
        publisher.shutdown()


@NEW_HISTORY
def test_receive_loads_a_new_history_after_a_redis_restart(
    redis_servers: Callable[..., Any], torchrl_warnings: list[str], pushes: int
) -> None:
    server = redis_servers()
    trainer = make_policy(0)
    publisher = publisher_for(server.url, trainer)
    actor = make_policy(1)
    collector = collector_for(server.url, actor, background=False)
    scheme = collector._receiver_schemes["policy"]
    try:
        for _ in range(2):
            train_step(trainer)
            publisher.send()
        assert scheme.receive() is not None and scheme.version == 3
        server.restart()
        for _ in range(pushes):
            train_step(trainer, delta=-2.0)
            publisher.send()
        received = scheme.receive()  # the pushes are stored: no wait needed
        assert received is not None and scheme.version == pushes
        assert same_weights(actor, trainer)
        assert acted_by(trainer, next(iter(collector)))
        assert scheme.receive() is None  # nothing newer in the new history
        assert len([m for m in torchrl_warnings if "new history" in m]) == 1, torchrl_warnings
    finally:
        collector.shutdown()
        scheme.shutdown()
        publisher.shutdown()


def test_receive_keeps_the_weights_until_the_trainer_pushes_after_a_redis_restart(
    redis_servers: Callable[..., Any],
) -> None:
    server = redis_servers()
    trainer = make_policy(0)
    publisher = publisher_for(server.url, trainer)
    actor = make_policy(1)
    collector = collector_for(server.url, actor, background=False)
    scheme = collector._receiver_schemes["policy"]
    try:
        train_step(trainer)
        publisher.send()
        assert scheme.receive() is not None and scheme.version == 2
        server.restart()
        assert scheme.receive() is None  # the table is gone until the trainer pushes
        assert scheme.receive(timeout=0.3) is None
        assert same_weights(actor, trainer)  # the weights it had, kept
        train_step(trainer, delta=-2.0)
        pusher = threading.Thread(target=publisher.send)
        pusher.start()  # while receive waits
        received = scheme.receive(timeout=30)
        pusher.join(30)
        assert received is not None and scheme.version == 1
        assert same_weights(actor, trainer)
    finally:
        collector.shutdown()
        scheme.shutdown()
        publisher.shutdown()
