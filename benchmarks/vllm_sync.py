"""Trainer push → vLLM serving the new version, per RL step (``python -m benchmarks.vllm_sync``,
llm environment; ``make bench-vllm``).

Two Llama models built here from configs (nothing is downloaded): the tiny one of
``examples/llm_rl`` and one of ~1 GB in bf16 (hidden 2048, 8 layers, vocab 32000). The
trainer (this process, transformers, fp32 master weights) takes a real AdamW step at an
RL learning rate on synthetic tokens; then, taking turns (the order swapped every step),
two real ``vllm.LLM`` engines (CPU, bf16, each in a process of its own) serve it:

- ``varsync``: the trainer's ``WeightPublisher.push`` (bf16, element deltas on) to an
  shm:// or a redis:// store (a real redis-server), then the engine's ``update_llm``
  (varsync's weight-transfer engine: only what changed, whole versions only);
- ``reload_weights``, vLLM's own path: the trainer writes the bf16 state dict to a
  safetensors file (``safetensors.torch.save_file``), the engine calls
  ``llm.collective_rpc("reload_weights", kwargs={"weights_path": folder})``.

Time to serving is the push (or save) plus the engine's update (or reload), each timed
where it runs. Bytes moved: on redis://, the server's ``INFO stats`` (in plus out); on
shm://, the store's byte counters of the trainer's and the engine's backends; for the
baseline, the file's size written and read. After every sync the engine must serve the
trainer's weights: a fingerprint of its parameters (sum and sum of squares in float64,
which vLLM's fused ``qkv_proj``/``gate_up_proj`` do not change) equals the pushed state's
and differs from the previous version's, and its log-probabilities of a fixed prompt
changed. Read the medians and the ratios on a shared 2-core machine, not one row.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .harness import MB, ROOT, machine, paired_ratio, ratio_text, size_label, spread_text, summary

TABLE = "policy"
PROMPT = [1, 50, 60, 70, 80, 90, 100, 110, 120, 130]
ENGINE_START = 900.0  # seconds an engine may take to start (a 1 GB model on 2 busy cores)
ENGINE_CALL = 600.0  # seconds one engine call may take
SHM_COUNTERS = ("leaf_bytes_written", "patch_bytes_written", "leaf_bytes_read")


@dataclass(frozen=True)
class ModelPlan:
    """One model of the benchmark and its steps (per store). ``hidden`` 0: the tiny model
    of ``examples/llm_rl``; else a Llama of that width (head_dim 128), ``layers`` deep."""

    name: str
    steps: int
    hidden: int = 0
    layers: int = 0
    vocab: int = 32000

    def build(self, folder: Path) -> None:
        """Write the model's config and random bf16 weights into ``folder``."""
        if not self.hidden:
            sys.path.insert(0, str(ROOT / "examples" / "llm_rl"))
            import tiny_model  # type: ignore[import-not-found]

            tiny_model.build(folder, dtype="bfloat16")
            return
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            vocab_size=self.vocab,
            hidden_size=self.hidden,
            intermediate_size=self.hidden * 11 // 4,
            num_hidden_layers=self.layers,
            num_attention_heads=self.hidden // 128,
            num_key_value_heads=self.hidden // 256,
            max_position_embeddings=256,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=2,
        )
        torch.manual_seed(0)
        LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)


TINY = ModelPlan("tiny", steps=5)
LARGE = ModelPlan("1GB", steps=3, hidden=2048, layers=8)


# -- the engine process -----------------------------------------------------------------


def _store_bytes(worker: Any) -> int:
    """The bytes the worker's varsync store has read (shm:// counters; 0 elsewhere). The
    engine keeps its store private; a benchmark may look."""
    engine = worker.weight_transfer_engine
    details = engine._store.backend.details(TABLE)
    return sum(int(details.get(key, 0)) for key in SHM_COUNTERS)


def serve_engine(connection: Any, folder: str, varsync_engine: bool) -> None:
    """A ``vllm.LLM`` on CPU in this process, driven by (command, arguments) messages:
    ``init``, ``update``, ``reload``, ``stop``. Each answer carries the command's seconds,
    and the engine's log-probabilities of :data:`PROMPT`."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # the figures, not vLLM's log
    try:
        from vllm import LLM, SamplingParams

        from varsync.integrations.vllm import last_update, update_llm

        llm = LLM(
            model=folder,
            dtype="bfloat16",
            distributed_executor_backend="uni",
            enforce_eager=True,
            max_model_len=64,
            max_num_seqs=2,
            enable_prefix_caching=False,
            skip_tokenizer_init=True,
            weight_transfer_config={"backend": "varsync"} if varsync_engine else None,
        )
        sampling = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0, detokenize=False)

        def served() -> dict[str, Any]:
            out = llm.generate([{"prompt_token_ids": PROMPT}], sampling, use_tqdm=False)[0]
            logprobs = [p[t].logprob for p, t in zip(out.prompt_logprobs[1:], PROMPT[1:])]
            return {"logprobs": logprobs}

        connection.send(served())
        while True:
            command, arguments = connection.recv()
            if command == "stop":
                if varsync_engine:
                    llm.collective_rpc("shutdown_weight_transfer_engine")
                return
            started = time.perf_counter()
            if command == "init":
                info = {"table": TABLE, "timeout": ENGINE_CALL, **arguments}
                llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": info})
            elif command == "update":
                update_llm(llm, min_version=arguments["version"], timeout=ENGINE_CALL)
            elif command == "reload":
                llm.collective_rpc("reload_weights", kwargs=arguments)
            seconds = time.perf_counter() - started
            answer = {"seconds": seconds, **served()}
            if varsync_engine and command != "reload":
                answer["store_bytes"] = llm.collective_rpc(_store_bytes)[0]
                answer["last_update"] = llm.collective_rpc(last_update)[0]
            connection.send(answer)
    except BaseException:
        connection.send({"error": traceback.format_exc()})
        raise


class Engine:
    """A :func:`serve_engine` process and its end of the pipe; every wait is bounded."""

    def __init__(self, folder: Path, varsync_engine: bool) -> None:
        self.name = "varsync" if varsync_engine else "reload_weights"
        context = multiprocessing.get_context("spawn")
        self.connection, child = context.Pipe()
        self.process = context.Process(
            target=serve_engine, args=(child, str(folder), varsync_engine), name=self.name
        )
        self.process.start()
        child.close()
        self.state: dict[str, Any] | None = None  # what it served last

    def ready(self) -> dict[str, Any]:
        self.state = self._answer(ENGINE_START)
        return self.state

    def call(self, command: str, **arguments: Any) -> dict[str, Any]:
        self.connection.send((command, arguments))
        self.state = self._answer(ENGINE_CALL)
        return self.state

    def _answer(self, timeout: float) -> dict[str, Any]:
        if not self.connection.poll(timeout):
            raise TimeoutError(f"the {self.name} engine did not answer within {timeout:g} s")
        answer: dict[str, Any] = self.connection.recv()
        if "error" in answer:
            raise RuntimeError(f"the {self.name} engine failed:\n{answer['error']}")
        return answer

    def stop(self) -> None:
        if self.process.is_alive():
            with suppress(OSError):  # it has exited already
                self.connection.send(("stop", {}))
            self.process.join(60)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(30)
        self.connection.close()


# -- the trainer ------------------------------------------------------------------------


class Trainer:
    """The model of ``folder`` in fp32 (master weights), AdamW at ``lr`` on synthetic
    tokens."""

    def __init__(self, folder: Path, lr: float, tokens: int = 32) -> None:
        import torch
        from transformers import LlamaForCausalLM

        self.model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
        self.vocab, self.tokens = int(self.model.config.vocab_size), tokens
        # foreach=False: no full-size temporaries beside 8 bytes of state per parameter
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=lr, weight_decay=0.01, foreach=False
        )
        self.generator = torch.Generator().manual_seed(1)

    def step(self) -> None:
        import torch

        tokens = torch.randint(0, self.vocab, (1, self.tokens), generator=self.generator)
        self.model(tokens, labels=tokens).loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()

    def bf16(self) -> dict[str, Any]:
        import torch

        return {k: v.to(torch.bfloat16).contiguous() for k, v in self.model.state_dict().items()}


# -- the contenders ---------------------------------------------------------------------


@contextmanager
def store(name: str) -> Iterator[tuple[str, Any]]:
    """A fresh store's URL and, for redis://, its server's byte counter (shm and redis:
    the engine runs in its own process)."""
    if name not in ("shm", "redis"):
        raise SystemExit(f"--backends: {name!r} is not one of shm, redis")
    from .delta import fresh_store

    with fresh_store(name, "bench-vllm") as found:
        yield found


def _timed(call: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = call()
    return time.perf_counter() - started, result


class VarsyncSync:
    """Push to the store, then the varsync engine's update. ``element_deltas`` ``False``:
    changed leaves go whole (``configure_table``), else the elements that changed."""

    name = "varsync"

    def __init__(self, engine: Engine, url: str, server: Any, element_deltas: bool) -> None:
        import torch

        from varsync.integrations.vllm import WeightPublisher

        self.engine, self.server = engine, server
        self.element_deltas = element_deltas
        self.publisher = WeightPublisher(url, TABLE, timeout=ENGINE_CALL, dtype=torch.bfloat16)
        engine.call("init", url=url, reader="bench-engine")

    def _pushed_bytes(self) -> int:
        details = self.publisher.store.backend.details(TABLE)
        return sum(int(details.get(key, 0)) for key in SHM_COUNTERS)

    def sync(self, trainer: Trainer) -> dict[str, Any]:
        before = self.server.reading() if self.server else self._pushed_bytes()
        read_before = (self.engine.state or {}).get("store_bytes", 0)
        push_s, version = _timed(lambda: self.publisher.push(trainer.model))
        if not self.element_deltas and version == 1:  # the table exists from the first push
            self.publisher.store.configure_table(TABLE, element_deltas=False)
        middle = self.server.reading() if self.server else self._pushed_bytes()
        answer = self.engine.call("update", version=version)
        if self.server:
            push_b = middle - before - self.server.overhead
            serve_b = self.server.since(middle)
        else:
            push_b, serve_b = middle - before, answer["store_bytes"] - read_before
        inside = answer["last_update"]  # the engine's own fetch and load seconds
        return {
            "push_s": push_s,
            "serve_s": answer["seconds"],
            "bytes": push_b + serve_b,
            "fetch_s": inside["fetch_s"],
            "load_s": inside["load_s"],
        }

    def close(self) -> None:
        self.publisher.close()


class ReloadSync:
    """vLLM's own path: save a safetensors file, then ``reload_weights`` from its folder."""

    name = "reload_weights"

    def __init__(self, engine: Engine, folder: Path) -> None:
        self.engine, self.folder = engine, folder

    def sync(self, trainer: Trainer) -> dict[str, Any]:
        from safetensors.torch import save_file

        path = self.folder / "model.safetensors"
        push_s, _ = _timed(lambda: save_file(trainer.bf16(), str(path)))
        answer = self.engine.call(
            "reload", weights_path=str(self.folder), is_checkpoint_format=True
        )
        size = path.stat().st_size
        return {"push_s": push_s, "serve_s": answer["seconds"], "bytes": 2 * size}

    def close(self) -> None:
        pass


def check_served(engines: list[Engine], previous: list[float] | None = None) -> list[float]:
    """Both engines serve the trainer's weights: the same log-probabilities to the bit
    (the same bf16 weights through the same kernels, one loaded by varsync, one by vLLM
    from the trainer's file), and not ``previous`` (the version before). Returns them."""
    served = [(engine.state or {})["logprobs"] for engine in engines]
    if served[0] != served[1]:
        raise AssertionError(
            f"the engines serve different weights: {engines[0].name} {served[0]}, "
            f"{engines[1].name} {served[1]}"
        )
    if previous is not None and served[0] == previous:
        raise AssertionError(f"the engines still serve the previous version: {previous}")
    return served[0]


# -- the run ----------------------------------------------------------------------------


def run_model(
    plan: ModelPlan,
    backends: list[str],
    lr: float,
    element_deltas: bool,
    note: Callable[[str], None],
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Per backend: ``plan.steps`` trainer steps, each synced by both contenders."""
    rows: list[dict[str, Any]] = []
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-vllm-")))
        folder, saved = scratch / "model", scratch / "reload"
        folder.mkdir()
        started = time.perf_counter()
        plan.build(folder)
        trainer = Trainer(folder, lr)
        size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
        built = time.perf_counter() - started
        note(f"{plan.name}: {size_label(size)} in bf16, built in {built:.0f} s")
        engines = [Engine(folder, varsync_engine=True), Engine(folder, varsync_engine=False)]
        for engine in engines:
            stack.callback(engine.stop)
        for engine in engines:
            engine.ready()
        check_served(engines)
        note(f"{plan.name}: engines ready {time.perf_counter() - started:.0f} s after the start")
        saved.mkdir()
        (saved / "config.json").write_bytes((folder / "config.json").read_bytes())
        for backend in backends:
            with store(backend) as (url, server), ExitStack() as syncs:
                contenders: list[Any] = [
                    syncs.enter_context(
                        _closing(VarsyncSync(engines[0], url, server, element_deltas))
                    ),
                    syncs.enter_context(_closing(ReloadSync(engines[1], saved))),
                ]
                for contender in contenders:  # untimed: the engines take a first version whole
                    contender.sync(trainer)
                served = check_served(engines)
                for step in range(1, plan.steps + 1):
                    trainer.step()
                    for contender in contenders if step % 2 else contenders[::-1]:
                        row = contender.sync(trainer)
                        row.update(model=plan.name, store=backend, step=step, who=contender.name)
                        row["serving_s"] = row["push_s"] + row["serve_s"]
                        log(row_text(row))
                        rows.append(row)
                    served = check_served(engines, served)
    return rows


def row_printer(line: str) -> None:
    print(line, flush=True)


def progress(line: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


@contextmanager
def _closing(contender: Any) -> Iterator[Any]:
    try:
        yield contender
    finally:
        contender.close()


def row_text(row: dict[str, Any]) -> str:
    inside = ""
    if "fetch_s" in row:
        inside = f" (fetch {row['fetch_s'] * 1e3:.0f} + load {row['load_s'] * 1e3:.0f})"
    return (
        f"| {row['model']} | {row['store']} | {row['step']} | {row['who']} | "
        f"{row['push_s'] * 1e3:.0f} ms | {row['serve_s'] * 1e3:.0f} ms{inside} | "
        f"**{row['serving_s'] * 1e3:.0f} ms** | {row['bytes'] / MB:.1f} MB |"
    )


def summary_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per model and store: medians (quartiles) of both contenders, their paired ratio."""
    lines = [
        "| model | store | varsync: push + update | reload_weights: save + reload | "
        "varsync / reload_weights | bytes: varsync | bytes: reload_weights |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in dict.fromkeys((r["model"], r["store"]) for r in rows):
        mine = [r for r in rows if (r["model"], r["store"]) == key and r["who"] == "varsync"]
        base = [r for r in rows if (r["model"], r["store"]) == key and r["who"] != "varsync"]
        ratio = paired_ratio([r["serving_s"] for r in mine], [r["serving_s"] for r in base])
        lines.append(
            f"| {key[0]} | {key[1]} | {spread_text(summary([r['serving_s'] for r in mine]))} | "
            f"{spread_text(summary([r['serving_s'] for r in base]))} | {ratio_text(ratio)} | "
            f"{size_label(summary([r['bytes'] for r in mine])['median'])} | "
            f"{size_label(summary([r['bytes'] for r in base])['median'])} |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,1GB", help="tiny and/or 1GB")
    parser.add_argument("--backends", default="shm,redis")
    parser.add_argument("--lr", type=float, default=1e-5, help="AdamW's learning rate")
    parser.add_argument("--steps", type=int, default=None, help="steps per model and store")
    parser.add_argument(
        "--whole-leaves", action="store_true", help="varsync pushes changed leaves whole"
    )
    parser.add_argument("--smoke", action="store_true", help="the tiny model, 2 steps")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    plans = {p.name: p for p in (TINY, LARGE)}
    chosen = [plans[name] for name in args.models.split(",")]
    if args.smoke:
        chosen = [TINY]
    steps = 2 if args.smoke else args.steps
    if steps is not None:
        chosen = [ModelPlan(**{**p.__dict__, "steps": steps}) for p in chosen]
    about = machine()
    print(f"machine: {about['cpu']}, {about['cores']} cores, load {about['load_average']}")
    pushes = "changed leaves whole" if args.whole_leaves else "element deltas (the default)"
    print(f"commit {about['tree']['commit']}, AdamW lr {args.lr:g}, engines in bf16 on CPU")
    print(f"varsync pushes: {pushes}\n")
    print(
        "| model | store | step | contender | push / save | update / reload | to serving | bytes |"
    )
    print("|---|---|---|---|---|---|---|---|")
    rows: list[dict[str, Any]] = []
    for plan in chosen:
        rows += run_model(
            plan, args.backends.split(","), args.lr, not args.whole_leaves, progress, row_printer
        )
    print()
    print("\n".join(summary_lines(rows)))
    print(f"\nload average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
