"""The answer to an image: its most likely label and that label's probability, from the classifier's logits."""

import numpy as np

LABELS = np.array(["cat", "dog", "bird"])


def top_label(outputs):
    logits = outputs["logits"]
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probabilities = exp / exp.sum(axis=-1, keepdims=True)
    best = probabilities.argmax(axis=-1)
    return {"label": LABELS[best], "probability": probabilities.max(axis=-1).astype(np.float32)}
