"""A Hugging Face ViT image classifier as its users write it: built from its config (seeded weights, no download),
called by keyword (pixel_values), returning a ModelOutput. For a model of the Hub, return
``AutoModelForImageClassification.from_pretrained(folder)`` instead."""

from transformers import ViTConfig, ViTForImageClassification

LABELS = ("cat", "dog", "bird")


def build_model(layers: int = 2, hidden: int = 64):
    config = ViTConfig(image_size=64, patch_size=16, hidden_size=hidden, num_hidden_layers=layers,
                       num_attention_heads=4, intermediate_size=2 * hidden, num_labels=len(LABELS),
                       id2label=dict(enumerate(LABELS)), label2id={label: i for i, label in enumerate(LABELS)})
    return ViTForImageClassification(config)
