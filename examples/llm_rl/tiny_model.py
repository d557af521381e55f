"""A tiny Llama-architecture model and its tokenizer, built here: nothing is downloaded.

vLLM loads it from the folder :func:`build` writes (``config.json``, safetensors weights,
a byte-level BPE tokenizer trained on a few lines of text); the trainer builds the same
model from the same folder with transformers. The CPU attention backend of vLLM needs a
head size of 32 or more: hidden 64 over 2 heads.
"""

from __future__ import annotations

from pathlib import Path

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a learner publishes weights and many actors pull them",
    "one two three four five six seven eight nine ten",
    "varsync moves whole versions or none at all",
] * 8


def build(folder: str | Path, *, seed: int = 0, dtype: str = "float32", layers: int = 2) -> Path:
    """Write a tiny random-initialised Llama (``dtype``: float32 or bfloat16) and its
    tokenizer into ``folder``; return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<s>", "</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=False,
        torch_dtype=dtype,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(folder)
    return folder
