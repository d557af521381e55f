"""The trainer process of tests/integrations/test_vllm_engine.py: a transformers Llama built
from the test's model folder, trained with real AdamW steps on synthetic tokens, pushed to a
varsync table with :class:`varsync.integrations.vllm.WeightPublisher`.

    python vllm_trainer.py MODEL_DIR URL steps DTYPE   # one step and push per "step" line on stdin
    python vllm_trainer.py MODEL_DIR URL loop DTYPE OUT  # step and push until killed

After each push it states its own forward pass's log-probabilities of the fixed PROMPTS'
tokens, computed on the weights it pushed (cast to DTYPE and back, as vLLM receives
them): ``steps`` prints one JSON line ``{"version": v, "logprobs": [...]}``; ``loop``
writes it to OUT/<v>.json before pushing version v, so that whatever version an engine
loads when the process is killed, its expected values are on disk.
"""

from __future__ import annotations

import json
import os
import sys

import torch

PROMPTS = [[1, 50, 60, 70, 80, 90, 100, 110], [1, 200, 10, 20, 30, 40]]
LEARNING_RATE = 1e-2


def logprobs(model: torch.nn.Module, dtype: torch.dtype) -> list[list[float]]:
    """Each prompt token's log-probability after its prefix, under ``model``'s weights as
    pushed in ``dtype`` (float32 arithmetic, as the float32 vLLM engine computes)."""
    state = {k: v.to(dtype).to(torch.float32) for k, v in model.state_dict().items()}
    out = []
    with torch.no_grad(), torch.device("cpu"):
        original = {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(state)
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            scores = model(ids).logits.float().log_softmax(-1)
            out.append(scores[0, :-1].gather(-1, ids[0, 1:, None])[:, 0].tolist())
        model.load_state_dict(original)
    return out


def main() -> None:
    from transformers import LlamaForCausalLM

    from varsync.integrations.vllm import WeightPublisher

    folder, url, mode, dtype_name = sys.argv[1:5]
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(1)
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    vocab = model.config.vocab_size

    def step() -> None:
        tokens = torch.randint(0, vocab, (4, 16))
        model(tokens, labels=tokens).loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    with WeightPublisher(url, dtype=None if dtype == torch.float32 else dtype) as publisher:
        if mode == "steps":
            for line in sys.stdin:
                if line.strip() != "step":
                    break
                step()
                version = publisher.push(model)
                print(json.dumps({"version": version, "logprobs": logprobs(model, dtype)}))
                sys.stdout.flush()
            return
        out, version = sys.argv[5], 0
        while True:  # until killed
            step()
            version += 1
            path = os.path.join(out, f"{version}.json")
            with open(path + ".tmp", "w") as f:
                json.dump({"version": version, "logprobs": logprobs(model, dtype)}, f)
            os.rename(path + ".tmp", path)
            assert publisher.push(model) == version


if __name__ == "__main__":
    main()
