"""argparse types that check a numeric flag's range when the command line is parsed, so a bad
value is one line and exit status 2 (argparse's own), never a traceback mid-run:

    p.add_argument("--batch-size", type=positive_int)
    p.add_argument("--lr", type=in_range(float, 0.0, 1.0, low_open=True))
"""
import argparse
import math


def in_range(kind, low=None, high=None, low_open=False, high_open=False):
    """A type that parses `kind` (int or float) and refuses values outside [low, high]
    (an open end excludes its bound; None: unbounded). NaN and infinities are refused too."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {_a(kind)}") from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and (value >= high if high_open else value > high)
        if too_low or too_high:
            raise argparse.ArgumentTypeError(f"{text} is outside {_interval()}")
        return value

    def _interval():
        left = "(" if low_open or low is None else "["
        right = ")" if high_open or high is None else "]"
        return f"{left}{'-inf' if low is None else low}, {'inf' if high is None else high}{right}"
    parse.__name__ = kind.__name__        # argparse names the type in its messages
    return parse


def _a(kind):
    return "an integer" if kind is int else "a number"


positive_int = in_range(int, 1)                      # counts that must be at least 1
non_negative_int = in_range(int, 0)                  # counts where 0 means "none" or "all"
non_negative_float = in_range(float, 0.0)
probability = in_range(float, 0.0, 1.0)              # a fraction of something, 0..1
learning_rate = in_range(float, 0.0, 1.0, low_open=True)   # above 1 any BERT diverges
