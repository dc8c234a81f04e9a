"""BertConfig: the hyper-parameters of a BERT, read from and written to HF's config.json."""
import dataclasses
import json
import os

from .ops import GELU_KINDS


@dataclasses.dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    # Keys of a config.json nanobert does not use (architectures, id2label, ...), kept so
    # that a load + save round trip does not lose them.
    extra: dict = dataclasses.field(default_factory=dict, repr=False)

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"BertConfig.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(f"hidden_size ({self.hidden_size}) is not divisible by "
                             f"num_attention_heads ({self.num_attention_heads})")
        if self.hidden_act not in GELU_KINDS:
            raise ValueError(f"hidden_act must be one of {GELU_KINDS}, got {self.hidden_act!r}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"BertConfig.{name} must be in [0, 1), got {getattr(self, name)}")
        kind = self.extra.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise ValueError(f"position_embedding_type {kind!r} is not supported (only 'absolute')")

    @property
    def head_size(self):
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, d):
        if d.get("model_type", "bert") != "bert":
            raise ValueError(f"model_type {d['model_type']!r} is not a BERT (expected 'bert')")
        d = {k: v for k, v in d.items() if k != "model_type"}       # always "bert"
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in d.items() if k in names}
        extra = {k: v for k, v in d.items() if k not in names}
        return cls(**known, extra=extra)

    def to_dict(self):
        d = dict(self.extra)
        d.update({f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name != "extra"})
        d["model_type"] = "bert"
        return d

    @classmethod
    def from_json_file(cls, path):
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.exists(path):
            raise FileNotFoundError(f"no config.json at {path}")
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path} is not valid UTF-8 JSON: {e}") from e
        if not isinstance(d, dict):
            raise ValueError(f"{path} must hold a JSON object, got {type(d).__name__}")
        return cls.from_dict(d)

    def to_json_string(self):
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
