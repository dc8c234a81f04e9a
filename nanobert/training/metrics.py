"""metrics.jsonl (one JSON record a line: appended while training, cut back to the checkpoint
on resume), the window of steps a log line reports (throughput, MFU), the training clock
across resumed runs and the time left, and the loss curve."""
import json
import math
import time

from nanobert.backend import matmul_precision
from nanobert.formats.fileio import atomic_open
from nanobert.model.flops import gpu_peak_tflops


def append_metrics(metrics_path, record):
    """One line of metrics.jsonl."""
    with open(metrics_path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def read_metrics(metrics_path):
    """metrics.jsonl's records, in order (a list of dicts)."""
    with open(metrics_path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def keep_metrics_until(metrics_path, step):
    """Rewrite metrics.jsonl with the records up to `step` (those logged after the checkpoint
    will be logged again). A crash mid-write leaves a torn last line: it is dropped, and said
    so; a bad line before the last is an error naming the file and the line."""
    with open(metrics_path, "rb") as f:
        lines = f.read().split(b"\n")
    if lines[-1] == b"":
        lines.pop()                               # the newline that ends the last line
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            step_of = record["step"]
        except (ValueError, TypeError, KeyError) as e:
            if number < len(lines):
                raise ValueError(f"{metrics_path}: line {number} is not a metrics record "
                                 f"({type(e).__name__}: {e})") from None
            print(f"dropped the torn last line of {metrics_path} (line {number}, {len(line)} "
                  "bytes): a crash cut its write short")
            break
        if step_of <= step:
            records.append(line.decode("utf-8") + "\n")
    with atomic_open(metrics_path, "w", encoding="utf-8") as f:
        f.writelines(records)


def time_left(elapsed, done, total):
    """"elapsed 1.2 min  left ~3.4 min": the seconds so far, and the steps still to do at the
    mean pace of the `done` steps they took."""
    left = elapsed / done * (total - done) if done else float("nan")
    return f"elapsed {elapsed / 60:.1f} min  left ~{left / 60:.1f} min"


class Clock:
    """Seconds of training over every run of a resumed job (`state["train_seconds"]` holds
    the earlier runs'), and where this run started, for the pace that time_left reads."""

    def __init__(self, state, step):
        self.before, self.first_step, self.start = state["train_seconds"], step, time.time()

    def seconds(self):
        return self.before + time.time() - self.start


class Window:
    """The steps since the last log line: their statistics summed (an array that on the GPU
    stays on the device until the log line reads it), their model FLOPs and their seconds of
    training (evaluations and checkpoints between steps are not training speed); `peak`
    (TFLOP/s, None: unknown) for the MFU, `ranks` for the throughput per rank."""

    def __init__(self, peak=None, ranks=1):
        self.peak, self.ranks = peak, ranks
        self.reset()

    def reset(self):
        """A new window, after a log line."""
        self.sums, self.flops, self.seconds, self.steps = None, 0, 0.0, 0

    def add(self, sums, seconds, flops=0):
        self.sums = sums if self.steps == 0 else self.sums + sums
        self.flops += flops
        self.seconds += seconds
        self.steps += 1

    def mfu(self):
        """Model FLOPs utilisation (None: no peak known)."""
        return self.flops / self.seconds / (self.peak * 1e12) if self.peak else None


def percent(fraction):
    """A fraction as a percentage for a log line: one decimal from 1% on, two significant
    digits below (a small model's MFU is 0.042%, not 0.0%)."""
    value = float(f"{100 * fraction:.2g}")
    if value >= 1 or value <= 0:
        return f"{100 * fraction:.1f}%"
    return f"{value:.{1 - math.floor(math.log10(value))}f}%"


def gpu_name():
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except Exception:
        return ""


def peak_tflops(device, dtype):
    """The peak of the GPU in use at the precision its matmuls run in (TF32, float16, ...),
    for MFU; None on the CPU or on an unknown GPU."""
    if device != "gpu":
        return None
    return gpu_peak_tflops(gpu_name(), matmul_precision(dtype, device))


def plot(metrics_path, png_path, keys=("mlm_loss", "nsp_loss"), behind=None):
    """The train (and held-out or dev) curves of `keys` from metrics.jsonl, side by side in a
    PNG; `behind`: a reference run's rows (training/reference_runs.py), drawn grey behind."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no loss_curve.png (pip install matplotlib)")
        return
    rows = read_metrics(metrics_path)
    fig, axes = plt.subplots(1, len(keys), figsize=(5.5 * len(keys), 4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        if behind:
            draw(ax, behind, key, "reference ", color="0.7")
        draw(ax, rows, key, "")
        ax.set_xlabel("step")
        ax.set_title(key.replace("_", " ").replace("mlm", "MLM").replace("nsp", "NSP"))
        ax.ticklabel_format(axis="y", useOffset=False)
        low, high = ax.get_ylim()
        middle = (low + high) / 2         # one dev point (a 1-epoch run): a readable scale
        if high - low < 0.1 * abs(middle):
            ax.set_ylim(0.95 * middle, 1.05 * middle)
        ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)                  # pyplot keeps every open figure alive until closed
    print(f"wrote {png_path}")


def draw(ax, rows, key, label, **style):
    """One run's curves of `key`: its train rows as a line, its held-out (train.py) or dev
    (finetune.py) evaluations as points joined; a test row is not drawn."""
    train = [r for r in rows if r["kind"] == "train" and key in r]   # --no-nsp: no NSP loss
    held = [r for r in rows if r["kind"] == "eval" and r.get("split", "dev") == "dev"
            and key in r]
    if train:
        ax.plot([r["step"] for r in train], [r[key] for r in train], label=label + "train",
                lw=1, **style)
    if held:
        name = "dev" if "split" in held[0] else "held-out"
        ax.plot([r["step"] for r in held], [r[key] for r in held], "o--" if style else "o-",
                label=label + name, **style)
