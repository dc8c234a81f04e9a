"""BertConfig: the hyper-parameters of a BERT, read from and written to HF's config.json,
and the labels of a fine-tuning task as config.json stores them (id2label / label2id, and
problem_type: what a sequence classifier's labels are, declared, never guessed from them)."""
import dataclasses
import os

from ..formats.fileio import read_json
from .limits import check_config_values, check_fits_in_memory
from .ops import GELU_KINDS

PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")


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
    # transformers' name: "regression", "single_label_classification" (one class id per
    # example), "multi_label_classification" (a 0/1 target per label), or None (undeclared: the
    # sequence classifier decides when it is built, heads.BertForSequenceClassification).
    problem_type: str = None
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
        if self.problem_type not in (None, *PROBLEM_TYPES):
            raise ValueError(f"problem_type must be one of {PROBLEM_TYPES} or None, "
                             f"got {self.problem_type!r}")
        kind = self.extra.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise ValueError(f"position_embedding_type {kind!r} is not supported (only 'absolute')")

    @classmethod
    def from_dict(cls, d):
        if d.get("model_type", "bert") != "bert":
            raise ValueError(f"model_type {d['model_type']!r} is not a BERT (expected 'bert')")
        check_config_values(d)                  # types and ranges, before anything is built
        d = {k: v for k, v in d.items() if k != "model_type"}       # always "bert"
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in d.items() if k in names}
        extra = {k: v for k, v in d.items() if k not in names}
        return cls(**known, extra=extra)

    def to_dict(self):
        d = dict(self.extra)
        d.update({f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name != "extra"})
        if d["problem_type"] is None:      # undeclared: left out, as transformers saves it
            del d["problem_type"]
        d["model_type"] = "bert"
        return d

    @classmethod
    def from_json_file(cls, path):
        """config.json, or the config.json inside a folder; a bad value or a model too large
        for the memory available is a ValueError naming the file (model/limits.py)."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        try:
            config = cls.from_dict(read_json(path, "config.json"))
            check_fits_in_memory(config)
        except ValueError as e:
            raise ValueError(e if str(e).startswith(path) else f"{path}: {e}") from None
        return config

# ------------------------------------------------------------------------ task labels


def _parse_id2label(id2label):
    """{index: name} (int or string keys, as config.json has them) or a list of names ->
    {int: name}, checked to be indexed 0..n-1."""
    if isinstance(id2label, (list, tuple)):
        id2label = dict(enumerate(id2label))
    if not isinstance(id2label, dict) or not id2label:
        raise ValueError(f"id2label must be a non-empty dict {{index: name}}, got {id2label!r}")
    try:
        by_index = {int(k): v for k, v in id2label.items()}
    except (TypeError, ValueError):
        raise ValueError(f"id2label keys must be integers 0..n-1, "
                         f"got {sorted(map(str, id2label))}") from None
    if sorted(by_index) != list(range(len(by_index))):
        raise ValueError(f"id2label keys must be exactly 0..{len(by_index) - 1}, "
                         f"got {sorted(by_index)}")
    return by_index


def _check_count(n, what="num_labels"):
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"{what} must be a positive integer, got {n!r}")
    return n


def num_labels(config):
    """Number of labels as transformers counts them: len(id2label) (config.json stores
    num_labels only that way), else a bare "num_labels" key, else 2 (HF's default)."""
    stated = config.extra.get("num_labels")
    if stated is not None:
        _check_count(stated)
    if config.extra.get("id2label") is None:
        return 2 if stated is None else stated
    count = len(_parse_id2label(config.extra["id2label"]))
    if stated is not None and stated != count:
        raise ValueError(f"config says num_labels={stated} but its id2label has {count} labels")
    return count


_num_labels = num_labels     # for the functions whose num_labels argument shadows it


def with_labels(config, num_labels=None, id2label=None, problem_type=None):
    """A copy of `config` whose extra holds id2label / label2id as config.json stores them
    (string keys "0".."n-1"; label2id the inverse) and no separate "num_labels" key.

    id2label (a dict {index: name} or a list of names) sets the labels; num_labels alone
    keeps the existing names when the count is unchanged, else names them LABEL_0.. as HF.
    problem_type (one of PROBLEM_TYPES) replaces config.problem_type when given.
    """
    count = _num_labels(config)
    label2id = config.extra.get("label2id")
    if num_labels is not None:
        _check_count(num_labels)
    if id2label is not None:
        by_index = _parse_id2label(id2label)
        if num_labels is not None and num_labels != len(by_index):
            raise ValueError(f"num_labels={num_labels} but id2label has {len(by_index)} labels")
        label2id = None
    elif num_labels is not None and num_labels != count:
        by_index, label2id = {i: f"LABEL_{i}" for i in range(num_labels)}, None
    elif config.extra.get("id2label") is not None:
        by_index = _parse_id2label(config.extra["id2label"])
    else:
        by_index = {i: f"LABEL_{i}" for i in range(count)}
    extra = {k: v for k, v in config.extra.items() if k != "num_labels"}
    extra["id2label"] = {str(i): by_index[i] for i in range(len(by_index))}
    if not isinstance(label2id, dict) or len(label2id) != len(by_index):
        label2id = {name: i for i, name in by_index.items()}
    extra["label2id"] = dict(label2id)
    problem_type = config.problem_type if problem_type is None else problem_type
    return dataclasses.replace(config, extra=extra, problem_type=problem_type)
