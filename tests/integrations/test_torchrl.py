"""varsync.integrations.torchrl: TorchRL collectors take their policy weights from a
varsync URL, through TorchRL's own extension point (a WeightSyncScheme subclass).

Real collectors on TorchRL's PendulumEnv (pure torch, no gym): single-process
``Collector``s receiving over memory://, and ``MultiSyncCollector`` and
``MultiAsyncCollector`` whose spawned workers receive over shm:// and redis://. A policy's
action is a linear function of the observation, or (tests/integrations/torchrl_helpers.py) a constant
that names the version of its weights, so each collected frame shows which weights
produced it.
"""

from __future__ import annotations

import gc
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
from torchrl.collectors import Collector, MultiAsyncCollector, MultiSyncCollector  # noqa: E402
from torchrl.envs import PendulumEnv  # noqa: E402
from torchrl_helpers import (  # noqa: E402
    acted_versions,
    make_version_policy,
    old_then_new,
    set_version,
    stale_frames,
)

import varsync  # noqa: E402
from varsync.integrations.torchrl import VarsyncWeightSyncScheme  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
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


def eventually(check: Callable[[], bool], within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def publisher_for(
    url: str, policy: torch.nn.Module, workers: int = 0, **options: Any
) -> VarsyncWeightSyncScheme:
    scheme = VarsyncWeightSyncScheme(url, "policy", **options)
    scheme.init_on_sender(model=policy, num_workers=workers)
    scheme.connect()
    return scheme


def collector_for(
    url: str, policy: TensorDictModule, worker_idx: Any = None, **options: Any
) -> Collector:
    return Collector(
        PendulumEnv(), policy, frames_per_batch=8, total_frames=-1, worker_idx=worker_idx,
        track_policy_version=True,
        weight_recv_schemes={"policy": VarsyncWeightSyncScheme(url, "policy", **options)},
    )


def shut(*collectors: Any) -> None:
    """Collectors, then their receiving schemes (Collector.shutdown leaves them running)."""
    for collector in collectors:
        collector.shutdown()
        for scheme in getattr(collector, "_receiver_schemes", {}).values():
            scheme.shutdown()


def frame_versions(batch: Any) -> torch.Tensor:
    """The policy version each frame was tagged with (the collector's PolicyVersion)."""
    return batch["next", "policy_version"]


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


# -- confirmed sends (TorchRL's default): in one process, receivers as workers 0 and 1 -----


def test_send_returns_once_every_worker_applied_the_version() -> None:
    url = memory_url()
    trainer = make_version_policy(0)
    publisher = publisher_for(url, trainer, workers=2)
    actors = [make_version_policy(9), make_version_policy(9)]
    collectors = [collector_for(url, actor, worker_idx=i) for i, actor in enumerate(actors)]
    try:
        for version in range(1, 6):
            set_version(trainer, version)
            assert publisher.send() == version + 1  # table version 1: the first weights
            # no waiting here: send returned after both workers applied it
            assert all(same_weights(actor, trainer) for actor in actors)
            for collector in collectors:
                batch = next(iter(collector))
                assert stale_frames(batch, version) == 0
                # the collector's policy version was bumped before the worker reported
                assert (frame_versions(batch) == version).all()
        with varsync.connect(url) as store:
            held = {r.reader: r.version for r in store.readers("policy")}
        assert held == {"policy-worker-0": 6, "policy-worker-1": 6}
    finally:
        shut(*collectors)
        publisher.shutdown()


def test_a_worker_that_does_not_confirm_is_named_when_send_times_out() -> None:
    url = memory_url()
    trainer = make_version_policy(0)
    publisher = publisher_for(url, trainer, workers=2, timeout=1.0)
    actor = make_version_policy(9)
    present = collector_for(url, actor, worker_idx=0)
    stranger = collector_for(url, make_version_policy(9))  # reports, but is no worker of it
    try:
        set_version(trainer, 1)
        with pytest.raises(varsync.PullTimeoutError) as raised:
            publisher.send()
        message = str(raised.value)
        assert "1 of the 2 workers did not confirm version 2" in message
        assert "policy-worker-1 (no report)" in message
        assert "policy-worker-0" not in message
        assert "sync=False" in message
        with varsync.connect(url) as store:
            assert store.version("policy") == 2  # published all the same
        assert same_weights(actor, trainer)
    finally:
        shut(present, stranger)
        publisher.shutdown()


def test_without_sync_send_returns_once_the_push_is_stored() -> None:
    url = memory_url()
    trainer = make_version_policy(0)
    # two workers announced, none there: a confirmed send would time out after 30 s
    publisher = publisher_for(url, trainer, workers=2, sync=False)
    try:
        set_version(trainer, 1)
        assert publisher.send() == 2
        with varsync.connect(url) as store:
            assert store.version("policy") == 2
    finally:
        publisher.shutdown()


def test_confirmed_sends_that_could_never_be_confirmed_are_refused() -> None:
    class TwoWorkerCollector:  # what the scheme reads of a multi-process collector
        num_workers = 2
        policy = make_version_policy(0)

    scheme = VarsyncWeightSyncScheme(memory_url(), "policy", background=False)
    with pytest.raises(varsync.ConfigurationError, match="sync=False with background=False"):
        scheme.init_on_sender(model_id="policy", context=TwoWorkerCollector())
    VarsyncWeightSyncScheme(memory_url(), "policy", background=False, sync=False).init_on_sender(
        model_id="policy", context=TwoWorkerCollector())


# -- what the sender is given ----------------------------------------------------------------


def test_the_sender_keeps_the_model_it_was_given() -> None:
    url = memory_url()
    scheme = VarsyncWeightSyncScheme(url, "policy")
    scheme.init_on_sender(model=make_version_policy(3), model_id="policy")
    gc.collect()  # TorchRL's base class holds the model by weak reference only
    scheme.connect()
    try:
        assert scheme.send() == 2
        with varsync.connect(url) as store:
            pulled = store.pull("policy")
        assert float(pulled["module.weight"][0]) == pytest.approx(0.03)
    finally:
        scheme.shutdown()


def test_weights_per_worker_are_refused_saying_what_to_do_instead() -> None:
    url = memory_url()
    trainer = make_version_policy(0)
    publisher = publisher_for(url, trainer)
    try:
        with pytest.raises(varsync.ConfigurationError, match=r"weights per worker.*\[0, 1\].*"
                           "one set of weights for all of them"):
            publisher.send({0: trainer.state_dict(), 1: trainer.state_dict()})
        with pytest.raises(varsync.ConfigurationError, match="params_map"):
            VarsyncWeightSyncScheme(url, "policy").init_on_sender(
                params_map={0: TensorDict.from_module(trainer)})

        class TwoFactories:  # a collector given one policy factory per worker
            num_workers = 2
            policy = None
            policy_factory = [make_version_policy, lambda: make_version_policy(1)]

        with pytest.raises(varsync.ConfigurationError, match="2 factories"):
            VarsyncWeightSyncScheme(memory_url(), "policy").init_on_sender(
                model_id="policy", context=TwoFactories())
    finally:
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


# -- several processes: the spawned workers of MultiSync and MultiAsync collectors ----------
#
# Each test starts two workers (about 10 s on 2 cores), so each checks several things.
# The policy acts weight + offset (a parameter and a buffer): every frame names the
# version that acted, and a frame acted between two versions' tensors names none.

FRAMES = 200  # per batch, 100 per worker: the reproduction of issue 37


@pytest.fixture(params=["shm", "redis"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "shm":
        return shm_url(tmp_path)
    return request.getfixturevalue("redis_namespace")()


def shm_url(tmp_path: Any) -> str:
    pytest.importorskip("varsync_shm", reason="shm:// needs varsync_shm")
    # under the test's own directory, removed with it (not a store left in /dev/shm)
    return f"shm://torchrl-{uuid.uuid4().hex[:12]}?root={tmp_path}"


def test_after_a_confirmed_update_the_next_batch_holds_no_stale_frame(shared_url: str) -> None:
    trainer = make_version_policy(0)
    scheme = VarsyncWeightSyncScheme(shared_url, "policy")
    collector = MultiSyncCollector(
        [PendulumEnv] * 2, trainer, frames_per_batch=FRAMES, total_frames=-1,
        track_policy_version=True, weight_sync_schemes={"policy": scheme},
    )
    try:
        batches = iter(collector)
        assert stale_frames(next(batches), 0) == 0  # the stateless workers got version 1
        for version in range(1, 6):
            set_version(trainer, version)
            collector.update_policy_weights_(trainer)  # returns once both workers applied it
            batch = next(batches)
            assert batch.numel() == FRAMES
            assert stale_frames(batch, version) == 0, acted_versions(batch, range(version + 1))
            assert (frame_versions(batch) == version).all()  # each worker bumped once
        # the workers' policy versions (and policies) as saved, restored after an update
        saved = collector.state_dict()
        assert [saved[f"worker{i}"]["policy_version"] for i in range(2)] == [5, 5]
        set_version(trainer, 6)
        collector.update_policy_weights_(trainer)
        assert (frame_versions(next(batches)) == 6).all()
        collector.load_state_dict(saved)
        batch = next(batches)
        assert (frame_versions(batch) == 5).all() and stale_frames(batch, 5) == 0
        set_version(trainer, 7)
        collector.update_policy_weights_(trainer)
        batch = next(batches)
        assert (frame_versions(batch) == 6).all() and stale_frames(batch, 7) == 0
    finally:
        collector.shutdown()
        scheme.shutdown()


def test_a_multi_async_collector_made_by_a_policy_factory_follows_confirmed_updates(
    tmp_path: Any,
) -> None:
    url = shm_url(tmp_path)
    trainer = make_version_policy(0)
    scheme = VarsyncWeightSyncScheme(url, "policy")
    collector = MultiAsyncCollector(  # no policy: the scheme publishes one of the factory's
        [PendulumEnv] * 2, policy_factory=make_version_policy, frames_per_batch=FRAMES // 2,
        total_frames=-1, weight_sync_schemes={"policy": scheme},
    )
    try:
        batches = iter(collector)
        assert stale_frames(next(batches), 0) == 0
        for version in range(1, 4):
            set_version(trainer, version)
            collector.update_policy_weights_(trainer)
            # Per worker (a worker's frames carry one trajectory id: Pendulum never ends
            # one), the batch it was collecting when the update was confirmed, or had
            # queued, may begin with frames of the version before (at first, the factory's
            # policy: version 0's weights); every batch it starts after is of this one.
            delivered: dict[int, int] = {}
            for _ in range(40):
                batch = next(batches)
                worker = int(batch["collector", "traj_ids"].flatten()[0])
                delivered[worker] = delivered.get(worker, 0) + 1
                acted = acted_versions(batch, [version - 1, version])
                if delivered[worker] == 1:
                    assert old_then_new(acted, version - 1, version), acted
                else:
                    assert (acted == version).all(), acted
                if len(delivered) == 2 and min(delivered.values()) == 2:
                    break
            else:
                pytest.fail(f"in 40 batches, the workers delivered {delivered} since the update")
    finally:
        collector.shutdown()
        scheme.shutdown()


def test_without_background_workers_apply_newer_weights_before_each_batch(
    tmp_path: Any,
) -> None:
    url = shm_url(tmp_path)
    trainer = make_version_policy(0)
    scheme = VarsyncWeightSyncScheme(url, "policy", background=False, sync=False)
    collector = MultiSyncCollector(
        [PendulumEnv] * 2, trainer, frames_per_batch=FRAMES, total_frames=-1,
        track_policy_version=True, weight_sync_schemes={"policy": scheme},
    )
    try:
        batches = iter(collector)
        assert stale_frames(next(batches), 0) == 0
        for version in range(1, 6):
            set_version(trainer, version)
            collector.update_policy_weights_(trainer)  # stored; applied as a batch starts
            batch = next(batches)
            assert stale_frames(batch, version) == 0, acted_versions(batch, range(version + 1))
            assert (frame_versions(batch) == version).all()
        assert stale_frames(next(batches), 5) == 0  # nothing newer: the weights it has
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
