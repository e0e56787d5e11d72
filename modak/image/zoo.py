"""The model zoo: reference architectures defined in code with seeded random weights (nothing is downloaded).

In-image code (no msgspec, PyYAML or build tooling): the image builds a zoo model from its entry at start.
Importing this module does not import torch; building or feeding a model does. The ONNX export of a zoo model
(which the analysis reads) is host-side: :mod:`modak.workload.zoo`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from modak.errors import InputError, did_you_mean

if TYPE_CHECKING:
    import torch

SEED = 0
_BOTH = ("training", "inference")


@dataclass(frozen=True)
class ZooEntry:
    """One zoo architecture: its inputs (per-sample shapes, dtypes, index ranges) and how to build it."""

    name: str
    description: str
    input_shapes: Mapping[str, tuple[int, ...]]
    input_dtypes: Mapping[str, str]
    tasks: tuple[str, ...]  # training, inference
    factory: str  # its factory's name in modak.image.zoo_models.FACTORIES
    index_bounds: Mapping[str, int] | None = None  # exclusive upper bound of integer inputs (vocabulary, rows)

    def shapes(self, overrides: Mapping[str, Any] | None = None) -> dict[str, tuple[int, ...]]:
        """The default input shapes with ``overrides`` applied; names and ranks are checked."""
        shapes = dict(self.input_shapes)
        for key, shape in (overrides or {}).items():
            if key not in shapes:
                raise InputError(f"zoo model '{self.name}' has no input '{key}'{did_you_mean(key, shapes)}")
            shape = tuple(int(d) for d in shape)
            if len(shape) != len(shapes[key]) or min(shape, default=1) < 1:
                raise InputError(f"input '{key}' of zoo model '{self.name}' takes a per-sample shape of "
                                 f"{len(shapes[key])} positive dimensions like {list(shapes[key])}, got {list(shape)}")
            shapes[key] = shape
        return shapes

    def build(self, input_shapes: Mapping[str, Any] | None = None) -> torch.nn.Module:
        """The module with seeded random weights, in eval mode, sized for ``input_shapes``."""
        import torch

        from modak.image import zoo_models

        shapes = self.shapes(input_shapes)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            try:
                model = zoo_models.build(self.factory, shapes, self.index_bounds or {})
            except ValueError as exc:
                raise InputError(f"zoo model '{self.name}': {exc}") from None
        return model.eval()


ZOO: dict[str, ZooEntry] = {e.name: e for e in (
    ZooEntry("mnist_cnn", "Small CNN for 28x28 digits: 2 conv + max-pool, 2 fully connected (0.4 M params)",
             {"input": (1, 28, 28)}, {"input": "float32"}, _BOTH, "mnist_cnn"),
    ZooEntry("mlp", "3-layer perceptron 784-1024-1024-10 (1.9 M params)",
             {"input": (784,)}, {"input": "float32"}, _BOTH, "mlp"),
    ZooEntry("resnet18", "ResNet-18 image classifier, 1000 classes (11.7 M params, 1.8 GMAC at 224x224)",
             {"input": (3, 224, 224)}, {"input": "float32"}, _BOTH, "resnet18"),
    ZooEntry("mlp_large", "3-layer perceptron 784-4096-4096-10: weights beyond the caches (20 M params)",
             {"input": (784,)}, {"input": "float32"}, _BOTH, "mlp_large"),
    ZooEntry("resnet34", "ResNet-34 image classifier, 1000 classes (21.8 M params, 3.7 GMAC at 224x224)",
             {"input": (3, 224, 224)}, {"input": "float32"}, _BOTH, "resnet34"),
    ZooEntry("resnet50", "ResNet-50 v1.5 image classifier, 1000 classes (25.6 M params, 4.1 GMAC at 224x224)",
             {"input": (3, 224, 224)}, {"input": "float32"}, _BOTH, "resnet50"),
    ZooEntry("mobilenet_v2", "MobileNetV2 (width 1.0) image classifier, 1000 classes (3.5 M params, 0.3 GMAC)",
             {"input": (3, 224, 224)}, {"input": "float32"}, _BOTH, "mobilenet_v2"),
    ZooEntry("bert_base", "BERT-base encoder (12 layers, hidden 768) with a 2-class head; input: token ids "
             "(110 M params, 11.2 GMAC at sequence length 128)",
             {"input_ids": (128,)}, {"input_ids": "int64"}, _BOTH, "bert_base", {"input_ids": 30522}),
    ZooEntry("bert_small", "BERT-small encoder (4 layers, hidden 512, 8 heads) with a 2-class head; input: token "
             "ids (29 M params, 1.7 GMAC at sequence length 128)",
             {"input_ids": (128,)}, {"input_ids": "int64"}, _BOTH, "bert_small", {"input_ids": 30522}),
    ZooEntry("vit_tiny", "ViT-Tiny/16 image classifier: 12 pre-norm encoder layers, hidden 192, 3 heads, 1000 "
             "classes (5.7 M params, 1.3 GMAC at 224x224)",
             {"input": (3, 224, 224)}, {"input": "float32"}, _BOTH, "vit_tiny"),
    ZooEntry("yolo_small", "Small YOLO-style detector: CSP backbone, SPPF, PAN neck, 3-scale head, 80 classes "
             "(1.9 M params)", {"input": (3, 320, 320)}, {"input": "float32"}, _BOTH, "yolo_small"),
    ZooEntry("dlrm_small", "Small DLRM recommender: 13 dense features, 26 embedding tables of 10k x 64, dot "
             "interaction, 1 logit (17 M params)", {"dense": (13,), "sparse": (26,)},
             {"dense": "float32", "sparse": "int64"}, _BOTH, "dlrm_small", {"sparse": 10_000}),
    ZooEntry("ncf", "NCF (NeuMF) recommender: GMF and MLP towers over user and item embeddings, 100k users x "
             "20k items (11.5 M params)", {"user": (1,), "item": (1,)}, {"user": "int64", "item": "int64"}, _BOTH,
             "ncf", {"user": 100_000, "item": 20_000}),
    ZooEntry("convnext_atto", "ConvNeXt-Atto image classifier: 7x7 depthwise convolutions, LayerNorm, GELU; "
             "widths 40-320, depths 2-2-6-2, 1000 classes (3.7 M params, 0.55 GMAC at 224x224)",
             {"input": (3, 224, 224)}, {"input": "float32"}, _BOTH, "convnext_atto"),
    ZooEntry("unet_small", "Small U-Net segmenter: 4 levels of widths 16-128, a 256-wide bottom, transposed-"
             "convolution upsampling, skip connections, 2 classes per pixel (1.9 M params)",
             {"input": (1, 128, 128)}, {"input": "float32"}, _BOTH, "unet_small"),
    ZooEntry("lstm_lm", "LSTM language model: 256-wide embeddings of 10k tokens, 2 LSTM layers of 512, the last "
             "position's next-token logits (11.4 M params)", {"input_ids": (64,)}, {"input_ids": "int64"}, _BOTH,
             "lstm_lm", {"input_ids": 10_000}),
    ZooEntry("efficientnet_b0", "EfficientNet-B0 image classifier: inverted bottlenecks with squeeze-and-"
             "excitation, SiLU, 3x3 and 5x5 depthwise convolutions, 1000 classes (5.3 M params, 0.39 GMAC at 224x224)",
             {"input": (3, 224, 224)}, {"input": "float32"}, _BOTH, "efficientnet_b0"),
    ZooEntry("squeezenet", "SqueezeNet 1.1 image classifier: fire modules (1x1 squeeze, concatenated 1x1 and 3x3 "
             "expands), 1000 classes from a 1x1 convolution (1.2 M params, 0.35 GMAC at 224x224)",
             {"input": (3, 224, 224)}, {"input": "float32"}, _BOTH, "squeezenet"),
    ZooEntry("gru_kws", "GRU keyword spotter: 2 GRU layers of 256 over 100 frames of 40 audio features, 12 "
             "classes (0.6 M params)", {"features": (100, 40)}, {"features": "float32"}, _BOTH, "gru_kws"),
    ZooEntry("gpt_small", "GPT-style decoder: 4 pre-norm blocks of hidden 256 and 4 heads with a causal mask over "
             "128 tokens of a 10k vocabulary, the last position's next-token logits (tied output layer; 5.7 M "
             "params)", {"input_ids": (128,)}, {"input_ids": "int64"}, _BOTH, "gpt_small", {"input_ids": 10_000}),
    ZooEntry("m5_audio", "M5 raw-audio classifier: four Conv1d stages (a 80-wide stride-4 first one) with "
             "BatchNorm and max-pooling over 1 s at 16 kHz, 35 classes (0.6 M params)",
             {"audio": (1, 16000)}, {"audio": "float32"}, _BOTH, "m5_audio"),
    ZooEntry("detr_r18", "DETR detector with a ResNet-18 trunk: 2 encoder and 2 decoder pre-norm layers (hidden "
             "256, 8 heads) over the stride-32 features, 50 object queries, 91 classes and boxes (15.7 M params)",
             {"input": (3, 224, 224)}, {"input": "float32"}, _BOTH, "detr_r18"),
    ZooEntry("mobilevit_xxs", "MobileViT-XXS image classifier: inverted residuals with SiLU and three MobileViT "
             "blocks (transformers over 2x2 patches, widths 64-96), 1000 classes (1.3 M params at 256x256)",
             {"input": (3, 256, 256)}, {"input": "float32"}, _BOTH, "mobilevit_xxs"),
    ZooEntry("deepspeech_small", "DeepSpeech 2, small: two strided 2-D convolutions with a clipped ReLU over 2 s "
             "of a 161-bin spectrogram, 3 bidirectional LSTM layers of 256, per-frame logits of 29 characters "
             "(6.6 M params)",
             {"spectrogram": (1, 161, 200)}, {"spectrogram": "float32"}, _BOTH, "deepspeech_small"),
    ZooEntry("crnn_sed", "CRNN sound-event detector: three 3x3 convolution blocks pooled over 64 mel bands, 2 "
             "bidirectional GRU layers of 128 over 256 frames, per-frame activities of 10 events (0.6 M params)",
             {"mel": (1, 64, 256)}, {"mel": "float32"}, _BOTH, "crnn_sed"),
    ZooEntry("chain4", "Dispatch-overhead probe: 4 fully connected layers 16-16 with tanh (8 graph nodes, 1 k "
             "params)", {"input": (16,)}, {"input": "float32"}, _BOTH, "chain4"),
    ZooEntry("chain64", "Dispatch-overhead probe: 64 fully connected layers 16-16 with tanh (128 graph nodes, "
             "17 k params)", {"input": (16,)}, {"input": "float32"}, _BOTH, "chain64"),
)}


def zoo_names() -> list[str]:
    """The zoo's architecture names, sorted."""
    return sorted(ZOO)


def get_entry(name: str) -> ZooEntry:
    """The zoo entry ``name``; an unknown name is an :class:`InputError` with the closest match."""
    try:
        return ZOO[name]
    except KeyError:
        raise InputError(f"unknown zoo model '{name}'{did_you_mean(name, ZOO)}") from None


def make_inputs(name: str, batch: int = 1, shapes: Mapping[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """Seeded random inputs for ``name`` with a leading batch dimension, keyed by input name in call order.

    Floating-point inputs are standard normal; integer inputs (token ids, embedding indices) are uniform
    over their valid range.
    """
    import torch

    entry = get_entry(name)
    generator = torch.Generator().manual_seed(SEED + 1)
    inputs = {}
    for key, shape in entry.shapes(shapes).items():
        size = (batch, *shape)
        if entry.input_dtypes[key] == "int64":
            inputs[key] = torch.randint(0, (entry.index_bounds or {})[key], size, generator=generator)
        else:
            inputs[key] = torch.randn(size, generator=generator, dtype=getattr(torch, entry.input_dtypes[key]))
    return inputs

