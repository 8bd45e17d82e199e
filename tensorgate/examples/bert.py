"""A BERT-base-shaped text classifier: transformers' ``BertForSequenceClassification`` from a config
(random weights, fixed seed) and a WordPiece tokenizer trained on a small text shipped with tensorgate.

BERT-base's shape: 12 layers, hidden 768, 12 heads, feed-forward 3072, 512 positions and its 30,522-row
vocabulary (110 M parameters); the tokenizer trained on ``data/corpus.txt`` uses the first few thousand
ids of it. The ONNX export keeps the batch and sequence axes free, so a batch pads only to its own
longest sequence (``ragged`` inputs, docs/workloads.md).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

CORPUS = Path(__file__).parent / "data" / "corpus.txt"
LABELS = 2
MAX_LENGTH = 128  # tokens per text, [CLS] and [SEP] included; longer texts are truncated
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def train_tokenizer(path: Path, vocab_size: int = 4000) -> None:
    """A BERT-style WordPiece tokenizer (lower case, [CLS] text [SEP]) trained on the bundled corpus,
    written as ``tokenizer.json``. ``[PAD]`` is id 0, the pad value of the served inputs."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False)
    tokenizer.train([str(CORPUS)], trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tokenizer.enable_truncation(MAX_LENGTH)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))


def build(
    seed: int = 7, layers: int = 12, hidden: int = 768, heads: int = 12, intermediate: int = 3072
) -> torch.nn.Module:
    """BERT-base (the defaults) with random weights; fewer layers or a narrower width for tests."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        num_labels=LABELS,
        attn_implementation="eager",  # traces to plain ONNX operators
    )
    return BertForSequenceClassification(config).eval()


class _Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits


def export_onnx(model: torch.nn.Module, path: str, opset: int = 17) -> None:
    """``input_ids``, ``attention_mask``, ``token_type_ids`` INT64 [-1, -1] -> ``logits`` FP32 [-1, 2]."""
    sample = torch.ones((2, 16), dtype=torch.int64)
    axes = {name: {0: "batch", 1: "sequence"} for name in INPUTS}
    with warnings.catch_warnings():  # the tracer's notes on Python control flow it folded (shapes only)
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _Logits(model),
            (sample, sample, torch.zeros_like(sample)),
            path,
            input_names=list(INPUTS),
            output_names=["logits"],
            dynamic_axes={**axes, "logits": {0: "batch"}},
            opset_version=opset,
            dynamo=False,
        )
