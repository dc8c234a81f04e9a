"""nanobert: BERT with every forward and backward pass written by hand in NumPy / CuPy."""
from .config import BertConfig
from .heads import (BertForMultipleChoice, BertForQuestionAnswering, BertForSequenceClassification,
                    BertForTokenClassification)
from .model import BertForPreTraining, BertModel
from .optim import AdamW, average_gradients, clip_by_global_norm, learning_rate

__all__ = ["BertConfig", "BertModel", "BertForPreTraining", "BertForSequenceClassification",
           "BertForTokenClassification", "BertForQuestionAnswering", "BertForMultipleChoice",
           "AdamW", "average_gradients", "clip_by_global_norm", "learning_rate"]
