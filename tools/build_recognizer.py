"""Build the bundled recognizer's acoustic model: a small streaming network built with torch, random
weights from a fixed seed, exported to ONNX with its state as explicit inputs and outputs.

    .venv/bin/python tools/build_recognizer.py          # rewrites tensorgate/examples/recognizer/acoustic.onnx
    .venv/bin/python tools/build_recognizer.py --check  # exits 1 when the committed file differs

The ONNX bytes are committed (tensorgate/examples/recognizer/acoustic.onnx), so that serving the
examples needs no torch: the example repository, the wheel and the container image carry the file.
torch is pinned (2.13.0) and its TorchScript-based exporter writes the same bytes on every run
(tests/examples/test_recognizer_model.py rebuilds the file and compares), so the file is exactly
what this script makes. The new torch.export-based exporter needs onnxscript, which the project does
not install; the TorchScript one is deprecated but present in torch 2.13.

The network, per 10 ms frame of 40 log-mel features:
- a fixed affine map that brings log-mel values of ordinary speech levels near zero mean and unit
  scale, so random weights do not saturate the recurrent layer;
- a causal 1-D convolution over time (kernel 3, 96 channels, ReLU): each frame sees the two frames
  before it, the last two of the previous chunk at a chunk's start (state ``conv_state``, [2, 40]);
- a GRU (128 units) whose hidden vector carries over from chunk to chunk (state ``gru_state``, [128]);
- a linear head to 29 CTC symbols (blank, space, a-z, apostrophe), its weights scaled up and the
  blank biased up, as trained CTC models' blanks dominate, so the random transcript changes with the
  sound and stays sparse rather than a character per frame.

The state tensors' batch dimension comes first (the server stacks each sequence's state as a row);
the GRU's own hidden-state layout ([layers, batch, units]) is reached inside the graph.
"""

from __future__ import annotations

import argparse
import io
import sys
import warnings
from pathlib import Path

SEED = 49
N_MELS = 40
CONV_CHANNELS = 96
CONV_KERNEL = 3
GRU_UNITS = 128
SYMBOLS = 29
# The head's weights scaled up so the symbol scores vary with the sound (at torch's initial scale one
# or two symbols win every frame), and the blank raised so about a quarter of speech frames emit one.
HEAD_GAIN = 6.0
BLANK_BIAS = 3.0
# log-mel of speech at ordinary recording levels spans about -14 (silence) to +4: centre and scale it.
FEATURE_SHIFT, FEATURE_SCALE = 5.0, 0.25
OPSET = 17
TARGET = Path(__file__).resolve().parent.parent / "tensorgate" / "examples" / "recognizer" / "acoustic.onnx"

INPUTS = ["features", "conv_state_in", "gru_state_in"]
OUTPUTS = ["logits", "conv_state_out", "gru_state_out"]


def build() -> bytes:
    """The ONNX model's bytes (deterministic: a fixed seed, and torch pinned)."""
    import torch

    torch.manual_seed(SEED)

    class Acoustic(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv1d(N_MELS, CONV_CHANNELS, CONV_KERNEL)
            self.gru = torch.nn.GRU(CONV_CHANNELS, GRU_UNITS, batch_first=True)
            self.head = torch.nn.Linear(GRU_UNITS, SYMBOLS)
            with torch.no_grad():
                self.head.weight *= HEAD_GAIN
                self.head.bias[0] += BLANK_BIAS

        def forward(
            self, features: torch.Tensor, conv_state_in: torch.Tensor, gru_state_in: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            x = torch.cat([conv_state_in, (features + FEATURE_SHIFT) * FEATURE_SCALE], dim=1)  # [N, 2 + T, 40]
            conv_state_out = x[:, -(CONV_KERNEL - 1) :, :]
            hidden = torch.relu(self.conv(x.transpose(1, 2))).transpose(1, 2)  # [N, T, 96]
            outputs, last = self.gru(hidden, gru_state_in.unsqueeze(0))
            return self.head(outputs), conv_state_out, last.squeeze(0)

    model = Acoustic().eval()
    example = (torch.zeros(1, 10, N_MELS), torch.zeros(1, CONV_KERNEL - 1, N_MELS), torch.zeros(1, GRU_UNITS))
    dynamic = {name: {0: "batch"} for name in INPUTS + OUTPUTS}
    dynamic["features"] = {0: "batch", 1: "frames"}
    dynamic["logits"] = {0: "batch", 1: "frames"}
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        # The TorchScript exporter's deprecation, and its note on GRUs without explicit initial
        # states (this one's is an input, as the note asks).
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            example,
            buffer,
            dynamo=False,
            opset_version=OPSET,
            input_names=INPUTS,
            output_names=OUTPUTS,
            dynamic_axes=dynamic,
        )
    return buffer.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed file; write nothing")
    args = parser.parse_args()
    data = build()
    if args.check:
        same = TARGET.exists() and TARGET.read_bytes() == data
        print(f"{TARGET.name}: {'up to date' if same else 'differs from what this script builds'}")
        return 0 if same else 1
    TARGET.write_bytes(data)
    print(f"wrote {TARGET} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
