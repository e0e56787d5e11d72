"""Writes a small BERT classifier, seeded, into ./bert-small (no download): what `model.py` loads. For a model of the
Hub, save it instead: AutoModelForSequenceClassification.from_pretrained("bert-base-uncased").save_pretrained(...)."""

import torch
from transformers import BertConfig, BertForSequenceClassification

torch.manual_seed(0)
config = BertConfig(vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                    intermediate_size=1024, num_labels=2)
BertForSequenceClassification(config).eval().save_pretrained("bert-small")
