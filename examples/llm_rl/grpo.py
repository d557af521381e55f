"""A GRPO-style loop on a tiny Llama: vLLM rolls out, a trainer learns, varsync syncs.

Each step: vLLM (CPU, one process) samples a group of completions per synthetic prompt,
each stamped with the weight version that produced it; a reward scores them (the share of
completion tokens from a target word); the trainer (transformers) takes one policy-gradient
step on the group-normalised advantages and pushes its weights to a varsync table; the
vLLM engine loads that version through varsync's weight-transfer engine and the trainer
waits until the engine reports holding it (on-policy rollouts). Printed per step: reward,
the version served, the sync time and the bytes moved.

    python examples/llm_rl/grpo.py                      # over shm://, 5 steps
    python examples/llm_rl/grpo.py --url redis://127.0.0.1:6379/0 --steps 10
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # vLLM in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import tiny_model  # noqa: E402

PROMPTS = ["the quick brown", "one two three", "a learner publishes", "varsync moves"]
TARGET_WORD = " fox"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=None, help="varsync store (default: a new shm:// one)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--group", type=int, default=8, help="completions per prompt")
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM
    from vllm import LLM, SamplingParams

    from varsync.integrations.vllm import WeightPublisher, last_update, update_llm

    shm_name = None
    url = args.url
    if url is None:
        shm_name = f"grpo-{uuid.uuid4().hex[:8]}"
        url = f"shm://{shm_name}"
    folder = tiny_model.build(tempfile.mkdtemp(prefix="tiny-llama-"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    target = set(tokenizer.encode(TARGET_WORD))
    trainer = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    optimizer = torch.optim.AdamW(trainer.parameters(), lr=args.lr)
    publisher = WeightPublisher(url, "policy")
    llm = LLM(
        model=str(folder),
        dtype="float32",
        distributed_executor_backend="uni",
        enforce_eager=True,
        max_model_len=64,
        seed=0,
        weight_transfer_config={"backend": "varsync"},
    )
    info = {"url": url, "table": "policy", "timeout": 30.0, "reader": "rollout-0"}
    llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": info})
    try:
        version = publisher.push(trainer)  # version 1: the starting weights
        update_llm(llm, min_version=version, timeout=30)
        sampling = SamplingParams(n=args.group, temperature=1.0, max_tokens=8, seed=0)
        print("step  reward  version_served  sync_ms  bytes_moved  stamped_versions")
        for step in range(args.steps):
            outputs = llm.generate(PROMPTS, sampling, use_tqdm=False)
            stamped = sorted(
                {s.version for o in outputs for c in o.outputs for s in c.weight_versions or []}
            )
            # reward: the share of each completion's tokens that belong to the target word
            samples = [
                (o.prompt_token_ids, list(c.token_ids)) for o in outputs for c in o.outputs
            ]
            rewards = torch.tensor(
                [sum(t in target for t in done) / max(1, len(done)) for _, done in samples]
            )
            groups = rewards.view(len(PROMPTS), args.group)
            advantages = (groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)
            loss = torch.zeros(())
            for (prompt, done), advantage in zip(samples, advantages.flatten()):
                if not done:
                    continue
                ids = torch.tensor([list(prompt) + done])
                logprobs = trainer(ids).logits[0, :-1].log_softmax(-1)
                taken = logprobs[len(prompt) - 1 :].gather(-1, ids[0, len(prompt) :, None])
                loss = loss - advantage * taken.sum() / len(samples)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

            started = time.perf_counter()
            version = publisher.push(trainer)
            served = update_llm(llm, min_version=version, timeout=30)
            publisher.wait_for_engines(version, 1, timeout=30)  # on-policy from here
            sync_ms = (time.perf_counter() - started) * 1e3
            moved = int(llm.collective_rpc(last_update)[0]["bytes_fetched"])
            print(
                f"{step:4d}  {rewards.mean():.3f}  {served:14d}  {sync_ms:7.1f}  "
                f"{moved:11,d}  {','.join(stamped)}"
            )
    finally:
        llm.collective_rpc("shutdown_weight_transfer_engine")
        publisher.close()
        if shm_name is not None:
            import varsync_shm

            varsync_shm.remove_store(shm_name)


if __name__ == "__main__":
    main()
