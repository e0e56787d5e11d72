"""A Hugging Face BERT classifier as its users write it: built from its config (seeded weights, no download), called
by keyword (input_ids, attention_mask, token_type_ids), returning a ModelOutput. For a model of the Hub, return
``AutoModelForSequenceClassification.from_pretrained(folder)`` instead."""

from transformers import BertConfig, BertForSequenceClassification


def build_model(layers: int = 2, hidden: int = 128):
    config = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                        intermediate_size=4 * hidden, num_labels=3)
    return BertForSequenceClassification(config)
