"""What a config.json may hold, and whether its model fits in this machine's memory: checked
before anything is built from it, because a config.json comes with a download from a
stranger. A wrong type or an absurd size is one ValueError naming the key (BertConfig's file
readers add the file); a model whose parameters alone cannot fit in the memory available is
refused before one of them is allocated.

The bounds are far beyond any released BERT (BERT-large: 24 layers, hidden 1024, vocab 30,522)
and keep what is built from a config small before the memory check: a table of 1,024 layers
is 16,000 names, where 100,000 layers were 1.6 million and a second of work.
"""
import math
import os

# key -> (smallest, largest) of the integer fields
INTEGER_RANGES = {
    "vocab_size": (1, 2**22),
    "hidden_size": (1, 2**16),
    "num_hidden_layers": (1, 1024),
    "num_attention_heads": (1, 2**16),
    "intermediate_size": (1, 2**18),
    "max_position_embeddings": (1, 2**20),
    "type_vocab_size": (1, 2**16),
    "pad_token_id": (0, 2**22 - 1),
    "num_labels": (1, 2**20),          # a head's width: LABEL_0.. are made for each
}
PROBABILITIES = ("hidden_dropout_prob", "attention_probs_dropout_prob")
POSITIVE_REALS = ("layer_norm_eps", "initializer_range")


# JSON's true / false are Python ints: a count or a size given `true` is refused, not taken as 1.
def is_integer(value):
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_real(value):
    """A number, and finite (not NaN, not infinite)."""
    return is_number(value) and math.isfinite(value)


def check_config_values(d):
    """ValueError naming the first key of config dict `d` whose value has the wrong type or
    is out of range: the sizes and counts (integers within INTEGER_RANGES), the dropout
    probabilities (numbers in [0, 1)), layer_norm_eps and initializer_range (numbers > 0),
    hidden_act (a string), classifier_dropout (null or a probability); hidden_size divisible
    by num_attention_heads, pad_token_id inside the vocab. Keys absent keep their defaults."""
    for key, (low, high) in INTEGER_RANGES.items():
        value = d.get(key, low)
        if not is_integer(value):
            raise ValueError(f"{key} must be an integer, got {value!r} ({type(value).__name__})")
        if not low <= value <= high:
            raise ValueError(f"{key} {value} is outside [{low}, {high:,}]")
    for key in PROBABILITIES + ("classifier_dropout",):
        value = d.get(key, 0.0)
        if key == "classifier_dropout" and value is None:
            continue
        if not (is_real(value) and 0.0 <= value < 1.0):
            raise ValueError(f"{key} must be a probability, a number in [0, 1), got {value!r}")
    for key in POSITIVE_REALS:
        value = d.get(key, 1.0)
        if not (is_real(value) and 0.0 < value < 1e3):
            raise ValueError(f"{key} must be a positive number, got {value!r}")
    if not isinstance(d.get("hidden_act", "gelu"), str):
        raise ValueError(f"hidden_act must be a string, got {d['hidden_act']!r}")
    hidden, heads = d.get("hidden_size", 768), d.get("num_attention_heads", 12)
    if hidden % heads:
        raise ValueError(f"hidden_size ({hidden}) is not divisible by num_attention_heads "
                         f"({heads})")
    if "vocab_size" in d and d.get("pad_token_id", 0) >= d["vocab_size"]:
        raise ValueError(f"pad_token_id {d['pad_token_id']} is outside the vocab of "
                         f"vocab_size {d['vocab_size']}")


def encoder_parameters(config):
    """The parameter count of the encoder a BertConfig describes (embeddings, L layers,
    pooler), from the sizes alone: a lower bound of every model built on it."""
    H, I, L = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    embeddings = (config.vocab_size + config.max_position_embeddings
                  + config.type_vocab_size) * H + 2 * H
    layer = 4 * (H * H + H) + 2 * (I * H) + I + H + 4 * H      # Q K V O, FFN, two LayerNorms
    return embeddings + L * layer + H * H + H


def available_memory():
    """Bytes of memory this process could still get: MemAvailable of /proc/meminfo (Linux),
    else the free physical pages; None where neither can be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits_in_memory(config, bytes_per_parameter=8):
    """ValueError, not a MemoryError half-way (or the OOM killer), when the encoder's
    parameters need more memory than is available, before any is allocated: 8 bytes a
    parameter, its float32 weight as read or drawn and the model's float32 copy of it (a
    lower bound: training adds gradients and Adam's moments)."""
    count = encoder_parameters(config)
    needed, available = count * bytes_per_parameter, available_memory()
    if available is not None and needed > available:
        raise ValueError(f"the model has {count:,} parameters: {needed / 1e9:,.1f} GB to load "
                         f"or build ({bytes_per_parameter} bytes a parameter), and "
                         f"{available / 1e9:,.1f} GB of memory are available")
