"""nanobert: BERT with every forward and backward pass written by hand in NumPy / CuPy.

    nanobert/backend.py   the one NumPy / CuPy switch
    nanobert/model/       the math: ops, the encoder, pretraining and task heads, AdamW
    nanobert/data/        text and data: tokenizer, pretraining instances, task readers, metrics
    nanobert/formats/     files: safetensors, checkpoints, atomic writes, packaged models
"""
from .model.config import BertConfig
from .model.heads import (BertForMultipleChoice, BertForQuestionAnswering,
                          BertForSequenceClassification, BertForTokenClassification)
from .model.bert import BertModel
from .model.pretraining import BertForPreTraining
from .model.optim import AdamW, average_gradients, clip_by_global_norm, learning_rate

__all__ = ["BertConfig", "BertModel", "BertForPreTraining", "BertForSequenceClassification",
           "BertForTokenClassification", "BertForQuestionAnswering", "BertForMultipleChoice",
           "AdamW", "average_gradients", "clip_by_global_norm", "learning_rate"]
