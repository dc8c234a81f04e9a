"""The math of BERT: op pairs, the encoder, the pretraining and task heads, the optimizer."""
