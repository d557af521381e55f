"""TF-Agents' own distributed machinery (DQN agent, ``Learner``, ``Actor``s,
``PolicySaver``, Reverb replay) with varsync's drop-in ``ReverbVariableContainer``:
examples/tf_agents_distributed, four processes started in the worst order.

The trainer, collector and evaluator start first and wait for a server that is not up
(it needs the policy the trainer saves); the trainer is killed mid-run and started again.
The collector must follow the trainer's train step, never backwards, with exactly the
weights the trainer pushed at that step; the trainer must save its policies.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

pytest.importorskip("reverb")
pytest.importorskip("tf_agents")
pytest.importorskip("gym")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tf_agents_distributed"
STEPS = 300  # train steps of the whole run
KILL_AFTER = 60  # the first trainer is killed once it pushed at least this step
BUDGET = 170.0  # seconds for the whole test, on 2 busy cores

PUSHED = re.compile(r"^trainer: pushed train step (\d+) checksum (\S+)$", re.M)
ACTED = re.compile(r"^collector: acting with train step (\d+) checksum (\S+)$", re.M)


class Job:
    """One program of the example in its own process group; output in ``log``."""

    def __init__(self, name: str, script: str, args: List[str], folder: Path,
                 deadline: float) -> None:
        self.name = name
        self.log = folder / f"{name}.log"
        self.deadline = deadline
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PYTHONWARNINGS": "ignore",
            "TF_CPP_MIN_LOG_LEVEL": "2",
        }
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, str(EXAMPLE / script), *args],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, *, at_least: int = 0) -> int:
        """Wait until a line matches ``pattern`` (with a number group >= ``at_least``, if
        it has one); return that number (or 0)."""
        regex = re.compile(pattern, re.M)
        while True:
            for match in regex.finditer(self.text()):
                number = int(match.group(1)) if regex.groups else 0
                if number >= at_least:
                    return number
            self._fail_if(self.process.poll() is not None, f"exited ({self.process.returncode})"
                          f" before printing {pattern!r}")
            self._fail_if(time.monotonic() > self.deadline, f"never printed {pattern!r}")
            time.sleep(0.1)

    def wait_exit(self) -> int:
        left = self.deadline - time.monotonic()
        try:
            return self.process.wait(max(left, 1))
        except subprocess.TimeoutExpired:
            self._fail_if(True, "did not finish in time")
            raise

    def kill(self) -> None:
        """SIGKILL the whole process group (a no-op once it is gone)."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(30)

    def _fail_if(self, condition: bool, what: str) -> None:
        if condition:
            tail = "\n".join(self.text().splitlines()[-40:])
            pytest.fail(f"{self.name} {what}; its last lines:\n{tail}")


@pytest.fixture
def start_job(tmp_path: Path) -> Iterator:
    """``start(name, script, args)``: a :class:`Job`; every one is killed at teardown."""
    deadline = time.monotonic() + BUDGET
    started: List[Job] = []

    def start(name: str, script: str, args: List[str]) -> Job:
        job = Job(name, script, args, tmp_path, deadline)
        started.append(job)
        return job

    yield start
    for job in started:
        job.kill()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _pushes(*jobs: Job) -> Dict[Tuple[int, str], str]:
    return {(int(s), c): job.name for job in jobs for s, c in PUSHED.findall(job.text())}


def test_collector_follows_the_trainer_started_before_the_server_and_restarted(
    tmp_path: Path, start_job
) -> None:
    port = _free_port()
    address = f"localhost:{port}"
    root = tmp_path / "root"
    common = [f"--root_dir={root}", f"--server={address}", f"--max_train_steps={STEPS}"]
    trainer = start_job("trainer", "train.py", common)
    collector = start_job("collector", "collect.py", common)
    evaluator = start_job("evaluator", "evaluate.py", [*common, "--eval_interval=100"])

    # The worst order: everyone waits for a server that is not there yet.
    waiting = rf"waiting for the Reverb server at {re.escape(address)}"
    for job in (trainer, collector, evaluator):
        job.wait_for(waiting)
    start_job("server", "reverb_server.py", [f"--root_dir={root}", f"--port={port}"])

    # The trainer dies mid-run and comes back.
    killed_after = trainer.wait_for(PUSHED.pattern, at_least=KILL_AFTER)
    trainer.kill()
    restarted = start_job("trainer-restarted", "train.py", common)
    resumed_at = restarted.wait_for(r"^trainer: starts at train step (\d+)$")

    for job in (restarted, collector, evaluator):
        assert job.wait_exit() == 0, f"{job.name} failed:\n{job.text()[-3000:]}"

    # The collector followed the trainer's train step, never backwards, ending at the last.
    acted = [(int(s), c) for s, c in ACTED.findall(collector.text())]
    steps = [step for step, _ in acted]
    assert steps == sorted(steps), f"the collector's train step went backwards: {steps}"
    assert steps[-1] == STEPS
    assert any(step > killed_after for step in steps), "nothing from the restarted trainer"
    assert len(set(steps)) >= 5, steps
    # ...with exactly the weights the trainer pushed at each step.
    pushed = _pushes(trainer, restarted)
    assert all(state in pushed for state in acted), [s for s in acted if s not in pushed]
    # The restarted trainer went on from its checkpoint, not from step 0.
    assert killed_after - 5 <= resumed_at <= killed_after + 5, (killed_after, resumed_at)

    # The trainer saved its policies, and the evaluator ran the saved greedy one.
    policies = root / "policies"
    for which in ("collect_policy", "greedy_policy", "policy"):
        assert (policies / which / "saved_model.pb").is_file(), which
    checkpoints = sorted(p.name for p in (policies / "checkpoints").iterdir())
    assert f"policy_checkpoint_{STEPS:010d}" in checkpoints, checkpoints
    evaluations = re.findall(r"^evaluator: train step (\d+): average return", evaluator.text(),
                             re.M)
    assert len(evaluations) >= 2 and int(evaluations[-1]) == STEPS, evaluations
