"""Element patches on a real model (``python -m benchmarks.elements``, modern environment).

A Llama-like decoder in plain PyTorch (embedding, blocks of RMSNorm + attention + SwiGLU
MLP, lm head; random init, fp32 master weights) is trained a few AdamW steps on
synthetic tokens at RL-like learning rates (1e-6, 1e-5), then one step at 1e-2 and one
push of random bits (every element changed); last, one 200 MB leaf with 1 % changed at
random, with the compiled scan and with numpy's. What a learner pushes is the bf16 cast of
the weights, as RL trainers push; after every step each bf16 leaf is diffed against the
previous push with ``varsync._elements``. Per step: the share of elements changed
(bitwise), whole-leaf bytes, each encoding's bytes over the model and the chosen
patches', the time to find the changed elements (the exact scan alone), to diff (scan,
encode, choose) and to apply (medians over rounds, each round with ``np.copyto`` of the
same bytes as the baseline), every patch applied and checked bit for bit.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from varsync import _elements as elements

from .harness import MB, machine, summary


@dataclass
class Config:
    vocab: int = 32000
    hidden: int = 1024
    layers: int = 8
    heads: int = 16
    mlp: int = 2816
    tokens: int = 128
    batch: int = 1


def build_model(config: Config) -> Any:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            h = config.hidden
            self.attn_norm, self.mlp_norm = nn.RMSNorm(h), nn.RMSNorm(h)
            self.qkv, self.out = nn.Linear(h, 3 * h, bias=False), nn.Linear(h, h, bias=False)
            self.gate_up = nn.Linear(h, 2 * config.mlp, bias=False)
            self.down = nn.Linear(config.mlp, h, bias=False)

        def forward(self, x: Any) -> Any:
            b, t, h = x.shape
            q, k, v = self.qkv(self.attn_norm(x)).split(h, dim=-1)
            q, k, v = (z.view(b, t, config.heads, -1).transpose(1, 2) for z in (q, k, v))
            a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out(a.transpose(1, 2).reshape(b, t, h))
            gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
            return x + self.down(nn.functional.silu(gate) * up)

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(config.vocab, config.hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(config.layers))
            self.norm = nn.RMSNorm(config.hidden)
            self.head = nn.Linear(config.hidden, config.vocab, bias=False)
            for p in self.parameters():
                if p.dim() > 1:
                    nn.init.normal_(p, std=0.02)

        def forward(self, tokens: Any) -> Any:
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    torch.manual_seed(0)
    return Decoder()


def bf16_leaves(model: Any) -> dict[str, np.ndarray]:
    """What the learner pushes: each parameter cast to bf16, as numpy (ml_dtypes)."""
    import ml_dtypes
    import torch

    with torch.no_grad():
        return {
            name: p.detach().to(torch.bfloat16).view(torch.int16).numpy().view(ml_dtypes.bfloat16)
            for name, p in model.named_parameters()
        }


def median_seconds(
    fn: Callable[[], Any], baseline: Callable[[], Any], rounds: int
) -> tuple[float, float]:
    """Median seconds of ``fn`` and of ``baseline``, taking turns in the same rounds."""
    mine: list[float] = []
    base: list[float] = []
    for number in range(rounds):
        for call, into in ((fn, mine), (baseline, base))[:: 1 if number % 2 else -1]:
            started = time.perf_counter()
            call()
            into.append(time.perf_counter() - started)
    return statistics.median(mine), statistics.median(base)


def measure(old: dict[str, np.ndarray], new: dict[str, np.ndarray], rounds: int) -> dict:
    """One push: every leaf's patch forms, the chosen one, times against np.copyto."""
    row: dict[str, Any] = {"elements": 0, "changed": 0, "whole": 0, "chosen": 0, "forms": {}}
    row.update(diff=0.0, diff_copy=0.0, apply=0.0, apply_copy=0.0, zstd_diff=0.0)
    row.update(find=0.0, find_copy=0.0)
    for name, before in old.items():
        after = new[name]
        count = elements.changed_count(before, after)
        row["elements"] += before.size
        row["changed"] += count
        row["whole"] += before.nbytes
        forms = elements.candidates(before, after, compress=True)
        for form in forms:
            row["forms"][form.name] = row["forms"].get(form.name, 0) + form.nbytes
        row["forms"]["ideal"] = row["forms"].get("ideal", 0) + count * (before.itemsize + 4)
        sink = before.copy()  # pages faulted in: the copy baseline is a warm copy
        patch = elements.diff(before, after)
        diff_s, copy_s = median_seconds(
            partial(elements.diff, before, after), partial(np.copyto, sink, after), rounds
        )
        row["diff"] += diff_s
        row["diff_copy"] += copy_s
        find_s, find_copy_s = median_seconds(
            partial(elements.changed_positions, before, after),
            partial(np.copyto, sink, after),
            rounds,
        )
        row["find"] += find_s
        row["find_copy"] += find_copy_s
        started = time.perf_counter()
        elements.diff(before, after, compress=True)
        row["zstd_diff"] += time.perf_counter() - started
        if patch is None:
            row["chosen"] += before.nbytes
            continue
        row["chosen"] += patch.nbytes
        scratch = before.copy()
        elements.apply(scratch, patch)
        if scratch.tobytes() != after.tobytes():
            raise AssertionError(f"{name}: the patch did not give the new value bit for bit")
        samples = []
        for _ in range(rounds):
            np.copyto(scratch, before)
            started = time.perf_counter()
            elements.apply(scratch, patch)
            samples.append(time.perf_counter() - started)
        row["apply"] += statistics.median(samples)
        row["apply_copy"] += copy_s
    return row


def train(config: Config, lr: float, steps: int, rounds: int, log: Callable) -> list[dict]:
    import torch

    model = build_model(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    generator = torch.Generator().manual_seed(1)
    pushed = bf16_leaves(model)
    rows = []
    for step in range(1, steps + 1):
        tokens = torch.randint(
            0, config.vocab, (config.batch, config.tokens + 1), generator=generator
        )
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        current = bf16_leaves(model)
        row = measure(pushed, current, rounds)
        row.update(lr=lr, step=step)
        log(row)
        rows.append(row)
        pushed = {k: v.copy() for k, v in current.items()}
    return rows


def random_bits(config: Config, rounds: int, log: Callable) -> dict:
    old = bf16_leaves(build_model(config))
    rng = np.random.default_rng(2)
    new = {
        k: rng.integers(0, 1 << 16, v.size, np.uint16).view(v.dtype).reshape(v.shape)
        for k, v in old.items()
    }
    row = measure(old, new, rounds)
    row.update(lr="random bits", step=1)
    log(row)
    return row


def one_leaf(rounds: int, log: Callable) -> list[dict]:
    """One 200 MB bf16 leaf with 1 % of its elements changed at random, diffed by the
    compiled scan and again by numpy's (the fallback where no C compiler was): the scan
    at its best, a leaf large enough for its threads."""
    import ml_dtypes

    rng = np.random.default_rng(3)
    old = rng.integers(0, 1 << 16, 100_000_000, np.uint16).view(ml_dtypes.bfloat16)
    new = old.copy()
    new.view(np.uint16)[rng.choice(old.size, old.size // 100, replace=False)] ^= 1
    rows = []
    compiled = elements._compiled
    for scanner, scan in (("compiled", compiled), ("numpy", None)):
        elements._compiled = scan
        try:
            row = measure({"leaf": old}, {"leaf": new}, rounds)
        finally:
            elements._compiled = compiled
        row.update(lr=f"one 200 MB leaf, {scanner}", step=1)
        log(row)
        rows.append(row)
    return rows


def text(row: dict) -> str:
    share = row["changed"] / row["elements"]
    ideal = row["forms"]["ideal"]
    target = ""
    if share <= 0.05:
        target = "yes" if row["chosen"] <= 1.3 * ideal + MB else "NO"
    forms = " ".join(f"{k} {v / MB:.1f}" for k, v in sorted(row["forms"].items()))
    apply_ratio = row["apply"] / row["apply_copy"] if row["apply_copy"] else math.nan
    return (
        f"| {row['lr']} | {row['step']} | {share:.2%} | {row['whole'] / MB:.0f} | "
        f"{row['chosen'] / MB:.1f} ({row['chosen'] / row['whole']:.1%}) | {forms} | "
        f"{row['find'] * 1e3:.0f} ms = {row['whole'] / row['find'] / 1e9:.2f} GB/s "
        f"({row['find'] / row['find_copy']:.2f}x copy) | "
        f"{row['diff'] * 1e3:.0f} ms = {row['whole'] / row['diff'] / 1e9:.2f} GB/s "
        f"({row['diff'] / row['diff_copy']:.2f}x copy) | {row['zstd_diff'] * 1e3:.0f} ms | "
        f"{row['apply'] * 1e3:.0f} ms ({apply_ratio:.2f}x copy) | {target} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    config = Config(layers=args.layers)
    about = machine()
    params = sum(p.numel() for p in build_model(config).parameters())
    print(f"machine: {about['cpu']}, {about['cores']} cores, load {about['load_average']}")
    print(f"model: {config}, {params / 1e6:.0f} M parameters, {2 * params / MB:.0f} MB in bf16")
    columns = [
        "lr",
        "step",
        "changed",
        "whole_MB",
        "chosen_MB",
        "forms_MB",
        "find",
        "diff",
        "diff+zstd",
        "apply",
        "1.3x",
    ]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    rows = []
    for lr, steps in ((1e-6, args.steps), (1e-5, args.steps), (1e-2, 1)):
        rows += train(config, lr, steps, args.rounds, lambda r: print(text(r), flush=True))
    rows.append(random_bits(config, args.rounds, lambda r: print(text(r), flush=True)))
    one_leaf(args.rounds, lambda r: print(text(r), flush=True))
    ratios = [r["diff"] / r["diff_copy"] for r in rows]
    print(f"diff/copy over the model's pushes: {summary(ratios)}")
    found = [r["find"] / r["find_copy"] for r in rows]
    print(f"find/copy (the exact scan, {elements.SCANNER}) over them: {summary(found)}")
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
