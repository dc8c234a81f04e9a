"""Text and data: WordPiece, pretraining instances and shards, task readers, metrics."""
