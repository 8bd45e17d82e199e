"""A YOLOv8 detector in torch: ultralytics' architecture, built from its model description without weights.

The layers, channel widths and depths are those of ultralytics' ``yolov8.yaml`` at a scale (``s``:
depth 0.33, width 0.50, at most 1024 channels): a Conv/C2f/SPPF backbone, a PAN neck, and the
decoupled anchor-free Detect head with its distribution focal loss (DFL) box decoding. At 640x640 it
has 11.2 M parameters and 8400 anchors (80x80 + 40x40 + 20x20), as the published YOLOv8s.

The exported graph ends as ultralytics' ONNX export does, with the boxes decoded (DFL, anchors,
strides) and the class scores through a sigmoid, but split in two for serving: ``detection_boxes``
[N, 8400, 4] (x1, y1, x2, y2 in the 640x640 input's pixels) and ``detection_scores`` [N, 8400, 80].

Random weights cannot detect anything, so two things make the network do a trained one's work:
batch-norm statistics are taken from a forward pass in training mode over synthetic images (so
activations keep a trained network's scale instead of fading layer after layer), and the
classification biases are set so that a few hundred (anchor, class) pairs per reference image
pass a 0.25 confidence on average, as on a busy photograph: non-maximum suppression then has a realistic
number of candidates to sort, never none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

CLASSES = 80
REG_MAX = 16
STRIDES = (8, 16, 32)
SIZE = 640
CONFIDENCE = 0.25  # ultralytics' default for predictions
CANDIDATES = 300  # (anchor, class) pairs per reference image the calibrated biases let through, on average


@dataclass(frozen=True)
class Scale:
    depth: float
    width: float
    max_channels: int


SCALES = {
    "n": Scale(0.33, 0.25, 1024),
    "s": Scale(0.33, 0.50, 1024),
    "m": Scale(0.67, 0.75, 768),
    # A slim network on the same code path, for tests: same layers, a sixteenth of the channels.
    "test": Scale(0.33, 0.0625, 1024),
}


def _divisible(x: float, divisor: int = 8) -> int:
    return int(math.ceil(x / divisor) * divisor)


class Conv(nn.Module):
    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c2, eps=0.001, momentum=0.03)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    def __init__(self, c1: int, c2: int, shortcut: bool) -> None:
        super().__init__()
        self.cv1 = Conv(c1, c2, 3, 1)
        self.cv2 = Conv(c2, c2, 3, 1)
        self.add = shortcut and c1 == c2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    def __init__(self, c1: int, c2: int, n: int = 1, shortcut: bool = False) -> None:
        super().__init__()
        self.c = c2 // 2
        self.cv1 = Conv(c1, 2 * self.c, 1, 1)
        self.cv2 = Conv((2 + n) * self.c, c2, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, self.c, shortcut) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).chunk(2, 1))
        for m in self.m:
            y.append(m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    def __init__(self, c1: int, c2: int, k: int = 5) -> None:
        super().__init__()
        c_ = c1 // 2
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c_ * 4, c2, 1, 1)
        self.m = nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        for _ in range(3):
            y.append(self.m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class DFL(nn.Module):
    """The expected distance under each side's softmax over REG_MAX bins (a fixed 1x1 convolution)."""

    def __init__(self, c1: int = REG_MAX) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c1, 1, 1, bias=False).requires_grad_(False)
        self.conv.weight.data[:] = torch.arange(c1, dtype=torch.float).view(1, c1, 1, 1)
        self.c1 = c1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, a = x.shape
        return self.conv(x.view(b, 4, self.c1, a).transpose(2, 1).softmax(1)).view(b, 4, a)


class Detect(nn.Module):
    def __init__(self, ch: tuple[int, ...], nc: int = CLASSES) -> None:
        super().__init__()
        self.nc = nc
        self.no = nc + REG_MAX * 4
        c2, c3 = max(16, ch[0] // 4, REG_MAX * 4), max(ch[0], min(nc, 100))
        self.cv2 = nn.ModuleList(
            nn.Sequential(Conv(x, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 4 * REG_MAX, 1)) for x in ch
        )
        self.cv3 = nn.ModuleList(nn.Sequential(Conv(x, c3, 3), Conv(c3, c3, 3), nn.Conv2d(c3, nc, 1)) for x in ch)
        self.dfl = DFL(REG_MAX)
        # ultralytics' bias_init: box logits at 1, class logits at the prior of 5 objects per image.
        for box, cls, stride in zip(self.cv2, self.cv3, STRIDES, strict=True):
            box[-1].bias.data[:] = 1.0
            cls[-1].bias.data[:] = math.log(5 / nc / (SIZE / stride) ** 2)

    def raw(self, xs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The box distributions [N, 64, A] and class logits [N, nc, A] over every level's anchors."""
        b = xs[0].shape[0]
        boxes = torch.cat([self.cv2[i](x).view(b, 4 * REG_MAX, -1) for i, x in enumerate(xs)], 2)
        logits = torch.cat([self.cv3[i](x).view(b, self.nc, -1) for i, x in enumerate(xs)], 2)
        return boxes, logits

    def forward(self, xs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        boxes, logits = self.raw(xs)
        anchors, strides = _anchors(xs)
        lt, rb = self.dfl(boxes).chunk(2, 1)
        xyxy = torch.cat((anchors - lt, anchors + rb), 1) * strides  # [N, 4, A] in input pixels
        return xyxy.transpose(1, 2), logits.sigmoid().transpose(1, 2)


def _anchors(xs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Grid cell centres (in cells) and each anchor's stride, [1, 2, A] and [1, 1, A]."""
    points, strides = [], []
    for x, stride in zip(xs, STRIDES, strict=True):
        h, w = x.shape[2], x.shape[3]
        sy, sx = torch.meshgrid(
            torch.arange(h, dtype=x.dtype) + 0.5, torch.arange(w, dtype=x.dtype) + 0.5, indexing="ij"
        )
        points.append(torch.stack((sx, sy), 0).view(2, -1))
        strides.append(torch.full((1, h * w), float(stride), dtype=x.dtype))
    return torch.cat(points, 1).unsqueeze(0), torch.cat(strides, 1).unsqueeze(0)


class YOLOv8(nn.Module):
    """``yolov8.yaml`` at one scale: backbone (layers 0-9), PAN neck (10-21), Detect (22)."""

    def __init__(self, scale: str = "s", nc: int = CLASSES) -> None:
        super().__init__()
        s = SCALES[scale]

        def c(channels: int) -> int:
            return _divisible(min(channels, s.max_channels) * s.width)

        def n(repeats: int) -> int:
            return max(round(repeats * s.depth), 1)

        self.b0 = Conv(3, c(64), 3, 2)  # P1/2
        self.b1 = Conv(c(64), c(128), 3, 2)  # P2/4
        self.b2 = C2f(c(128), c(128), n(3), True)
        self.b3 = Conv(c(128), c(256), 3, 2)  # P3/8
        self.b4 = C2f(c(256), c(256), n(6), True)
        self.b5 = Conv(c(256), c(512), 3, 2)  # P4/16
        self.b6 = C2f(c(512), c(512), n(6), True)
        self.b7 = Conv(c(512), c(1024), 3, 2)  # P5/32
        self.b8 = C2f(c(1024), c(1024), n(3), True)
        self.b9 = SPPF(c(1024), c(1024), 5)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.h12 = C2f(c(1024) + c(512), c(512), n(3))
        self.h15 = C2f(c(512) + c(256), c(256), n(3))  # P3 out
        self.h16 = Conv(c(256), c(256), 3, 2)
        self.h18 = C2f(c(256) + c(512), c(512), n(3))  # P4 out
        self.h19 = Conv(c(512), c(512), 3, 2)
        self.h21 = C2f(c(512) + c(1024), c(1024), n(3))  # P5 out
        self.detect = Detect((c(256), c(512), c(1024)), nc)

    def features(self, x: torch.Tensor) -> list[torch.Tensor]:
        p3 = self.b4(self.b3(self.b2(self.b1(self.b0(x)))))
        p4 = self.b6(self.b5(p3))
        p5 = self.b9(self.b8(self.b7(p4)))
        h12 = self.h12(torch.cat((self.up(p5), p4), 1))
        h15 = self.h15(torch.cat((self.up(h12), p3), 1))
        h18 = self.h18(torch.cat((self.h16(h15), h12), 1))
        h21 = self.h21(torch.cat((self.h19(h18), p5), 1))
        return [h15, h18, h21]

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.detect(self.features(images))


def reference_images(count: int, seed: int) -> torch.Tensor:
    """Synthetic photographs in [0, 1]: smooth colour fields with rectangles of other colours on them,
    in the letterboxed layout a served image has (grey bands of 114/255 above and below)."""
    g = torch.Generator().manual_seed(seed)
    images = torch.full((count, 3, SIZE, SIZE), 114 / 255)
    band = SIZE // 8
    yy, xx = torch.meshgrid(torch.linspace(0, 1, SIZE - 2 * band), torch.linspace(0, 1, SIZE), indexing="ij")
    for i in range(count):
        colours = torch.rand((3, 3), generator=g)
        field = colours[0].view(3, 1, 1) * (1 - yy) + colours[1].view(3, 1, 1) * xx
        for _ in range(12):
            y0, x0 = (int(v) for v in torch.randint(0, SIZE - 2 * band - 40, (2,), generator=g))
            h, w = (int(v) for v in torch.randint(20, 200, (2,), generator=g))
            field[:, y0 : y0 + h, x0 : x0 + w] = torch.rand((3, 1, 1), generator=g)
        images[i, :, band : SIZE - band] = field.clamp(0, 1)
    return images


def build(scale: str = "s", seed: int = 7) -> YOLOv8:
    """The network with random weights (fixed seed), its batch norms and class biases set as above."""
    torch.manual_seed(seed)
    model = YOLOv8(scale)
    images = reference_images(8, seed)
    model.train()
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.momentum = None  # a cumulative average over the passes below
            module.reset_running_stats()
    with torch.no_grad():
        for index in range(0, len(images), 2):
            model(images[index : index + 2])
    model.eval()
    with torch.no_grad():
        _, logits = model.detect.raw(model.features(images))
        anchors = [(SIZE // stride) ** 2 for stride in STRIDES]
        biases = torch.cat(
            [cls[-1].bias.view(1, -1, 1).expand(1, -1, a) for cls, a in zip(model.detect.cv3, anchors, strict=True)], 2
        )
        bare = (logits - biases).flatten()
        threshold = math.log(CONFIDENCE / (1 - CONFIDENCE))
        shift = threshold - float(torch.topk(bare, CANDIDATES * len(images)).values[-1])
        for cls in model.detect.cv3:
            cls[-1].bias.data[:] = shift
    return model


def anchor_count() -> int:
    return sum((SIZE // stride) ** 2 for stride in STRIDES)


def export_onnx(model: YOLOv8, path: str, opset: int = 17) -> None:
    """``images`` FP32 [-1, 3, 640, 640] -> ``detection_boxes`` [-1, 8400, 4], ``detection_scores`` [-1, 8400, 80]."""
    import onnx

    torch.onnx.export(
        model,
        (torch.zeros(1, 3, SIZE, SIZE),),
        path,
        input_names=["images"],
        output_names=["detection_boxes", "detection_scores"],
        dynamic_axes={"images": {0: "batch"}, "detection_boxes": {0: "batch"}, "detection_scores": {0: "batch"}},
        opset_version=opset,
        dynamo=False,
    )
    # The tracer leaves the anchor axis symbolic (it follows the input's height and width, which
    # only the batch axis may vary): state it, so the served metadata reads [-1, 8400, ...].
    graph = onnx.load(path)
    for output in graph.graph.output:
        output.type.tensor_type.shape.dim[1].dim_value = anchor_count()
    onnx.save(graph, path)
