"""The model families of the zoo: what ``modak model eval``'s "family held out" split holds out together, and
what the kernel model's calibration folds hold out (:func:`modak.predict.kernels.calibrate`)."""

from __future__ import annotations

from collections.abc import Mapping

# The model families that "family held out" holds out together: every zoo model belongs to one (tests check it
# against the zoo and the shipped rows). Dense-convolution CNNs (ConvNeXt: the ResNet design modernized) are
# "resnet", depthwise/squeezed ones "mobile-cnn"; the dispatch-overhead probes (chains of small fully connected
# layers) are multilayer perceptrons.
FAMILIES: Mapping[str, tuple[str, ...]] = {
    "resnet": ("resnet18", "resnet34", "resnet50", "convnext_atto", "mnist_cnn"),
    "mobile-cnn": ("mobilenet_v2", "efficientnet_b0", "squeezenet"),
    "transformer": ("bert_base", "bert_small", "gpt_small", "vit_tiny"),
    "mlp-recommender": ("mlp", "mlp_large", "dlrm_small", "ncf", "chain4", "chain64"),
    "recurrent": ("lstm_lm", "gru_kws"),
    "detection-segmentation": ("yolo_small", "unet_small"),
    "audio": ("m5_audio",),
}
_FAMILY_OF = {model: name for name, models in FAMILIES.items() for model in models}


def family(model: str) -> str:
    """A model's family in :data:`FAMILIES`; a model of none (a user's own) is a family of its own."""
    return _FAMILY_OF.get(model, model)
