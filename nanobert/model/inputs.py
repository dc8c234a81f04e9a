"""Validation of what a user hands the model, on the host, before anything reaches the device.

Every error is a ValueError that names the key, the index and the value at fault, e.g.
`input_ids[1, 3] = -1 is outside [0, 50)`. The model classes call `check_inputs` for the
encoder's inputs and their own `check_targets` (built from the helpers here) for the labels.
"""
import numpy

from ..backend import to_host

INPUT_KEYS = ("input_ids", "token_type_ids", "attention_mask")


def require_keys(batch, keys, what):
    """A batch is a dict holding at least `keys` (none of them None)."""
    if not isinstance(batch, dict) or any(k not in batch or batch[k] is None for k in keys):
        found = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        wanted = " and ".join(repr(k) for k in keys)
        raise ValueError(f"a {what} batch is a dict with at least {wanted}, got {found}")


def as_int_array(batch, key, where):
    """batch[key] as a NumPy integer array (a boolean attention_mask becomes 0/1)."""
    a = numpy.asarray(to_host(batch[key]))
    if a.dtype == bool and key == "attention_mask":
        a = a.astype(numpy.int64)
    if not numpy.issubdtype(a.dtype, numpy.integer):
        raise ValueError(f"{where}: {key} must be an integer array, got dtype {a.dtype}")
    return a


def as_real_array(batch, key, where):
    """Float labels (regression, multi-label): any int or float array, finite -> float64."""
    a = numpy.asarray(to_host(batch[key]))
    real = numpy.issubdtype(a.dtype, numpy.integer) or numpy.issubdtype(a.dtype, numpy.floating)
    if a.dtype == bool or not real:
        raise ValueError(f"{where}: {key} must be a real-valued array, got dtype {a.dtype}")
    a = a.astype(numpy.float64)
    if not numpy.isfinite(a).all():
        index = tuple(int(i) for i in numpy.argwhere(~numpy.isfinite(a))[0])
        raise ValueError(f"{key}[{', '.join(map(str, index))}] = {a[index]} is not finite")
    return a


def check_range(a, key, low, high, allowed=()):
    """Every value in [low, high) or in `allowed` (e.g. the ignore index -100)."""
    bad = (a < low) | (a >= high)
    for value in allowed:
        bad &= a != value
    if bad.any():
        index = tuple(int(i) for i in numpy.argwhere(bad)[0])
        also = f" (allowed also: {list(allowed)})" if allowed else ""
        raise ValueError(f"{key}[{', '.join(map(str, index))}] = {a[index]} is outside "
                         f"[{low}, {high}){also}")


def shape_error(key, shape, expected):
    return ValueError(f"batch: {key} has shape {shape}, "
                      f"expected {' or '.join(map(str, expected))}")


def check_per_example(batch, key, B, low, high, allowed=()):
    """One integer label per example: [B] (or [B, 1], as HF accepts) -> int64 [B]."""
    labels = as_int_array(batch, key, "batch")
    if labels.shape not in ((B,), (B, 1)):
        raise shape_error(key, labels.shape, [(B,)])
    labels = labels.reshape(B)
    check_range(labels, key, low, high, allowed=allowed)
    return labels.astype(numpy.int64)


def check_inputs(config, input_ids, token_type_ids=None, attention_mask=None, where="inputs"):
    """Validate on the host and fill defaults. Returns int64 NumPy arrays [B, T]."""
    batch = {"input_ids": input_ids}
    if token_type_ids is not None:
        batch["token_type_ids"] = token_type_ids
    if attention_mask is not None:
        batch["attention_mask"] = attention_mask
    ids = as_int_array(batch, "input_ids", where)
    if ids.ndim != 2:
        raise ValueError(f"{where}: input_ids must be [batch, seq_len], got shape {ids.shape}")
    B, T = ids.shape
    if T > config.max_position_embeddings:
        raise ValueError(f"{where}: sequence length {T} exceeds max_position_embeddings "
                         f"{config.max_position_embeddings}")
    check_range(ids, "input_ids", 0, config.vocab_size)
    out = {"input_ids": ids.astype(numpy.int64)}
    for key, default, high in (("token_type_ids", 0, config.type_vocab_size),
                               ("attention_mask", 1, 2)):
        a = as_int_array(batch, key, where) if key in batch else numpy.full((B, T), default)
        if a.shape != (B, T):
            raise ValueError(f"{where}: {key} has shape {a.shape} but input_ids has {(B, T)}")
        check_range(a, key, 0, high)
        out[key] = a.astype(numpy.int64)
    return out
