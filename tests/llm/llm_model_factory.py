"""Build the tiny language models the tests and the benchmark serve: random weights, no downloads.

A Llama-style config with random weights (seeded), saved with safetensors, and a WordLevel
tokenizer trained on ``data/corpus.txt`` with a simple chat template.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CORPUS = Path(__file__).parent / "data" / "corpus.txt"
SPECIAL = ["<unk>", "<pad>", "<s>", "</s>", "<system>", "<user>", "<assistant>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<{{ message['role'] }}> {{ message['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def build_tokenizer(vocab_size: int | None = None) -> PreTrainedTokenizerFast:
    """The corpus's words; with ``vocab_size``, made-up words (``w123``) after them up to that size,
    for a model whose output layer has the width of a real vocabulary."""
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    tok.train([str(CORPUS)], trainers.WordLevelTrainer(special_tokens=SPECIAL))
    if vocab_size is not None and vocab_size > tok.get_vocab_size():
        vocab = tok.get_vocab()
        vocab.update({f"w{i}": i for i in range(len(vocab), vocab_size)})
        tok.model = models.WordLevel(vocab, unk_token="<unk>")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        additional_special_tokens=SPECIAL[4:],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(
    directory: Path,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    max_positions: int = 512,
    vocab: int | None = None,
    initializer_range: float = 0.5,
    seed: int = 0,
) -> Path:
    """Write a tiny Llama model and its tokenizer into ``directory`` (a version directory)."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        # Wide initial weights make the logits peaked, so float noise between batched and solo
        # forwards cannot flip a greedy choice.
        initializer_range=initializer_range,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory
