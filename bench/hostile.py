"""Hostile inputs and careless commands, measured: each case of docs/refusals.md ("Nothing
lost, nothing trusted blindly") built in a scratch folder and run as a command line in a
process of its own, with its exit status, the lines it printed on stderr, its peak memory
(ru_maxrss of that one child, through a small wrapper process) and its seconds; the memory and
time are also given over the same command's `--help` (the process's baseline: Python, NumPy
and nanobert imported).

    PYTHONPATH=. python -m bench.hostile                  # every case, a markdown table
    PYTHONPATH=. python -m bench.hostile --cases fifo header-1gib
    PYTHONPATH=/work/main python -m bench.hostile --root /work/main --timeout 20   # the old code

tests/test_hostile.py builds the same cases (these functions) and asserts the refusals.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

import numpy

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("the cat sat on a mat and the dog ran to the old man who was in his house . "
         "she said it is good to see you here today").split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TINY = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=32)

# ------------------------------------------------------------------------- the material


def write_text(folder, documents=30, sentences=6, seed=0):
    """A corpus of sentences over WORDS: one sentence a line, documents apart -> its path."""
    rng = numpy.random.default_rng(seed)
    path = os.path.join(folder, "text.txt")
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(documents):
            for _ in range(sentences):
                f.write(" ".join(rng.choice(WORDS, size=8)) + "\n")
            f.write("\n")
    return path


def write_vocab(folder):
    path = os.path.join(folder, "vocab.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(SPECIALS + sorted(set(WORDS))) + "\n")
    return path


def tiny_model(folder):
    """A BertForPreTraining folder (config.json, model.safetensors, vocab.txt) of TINY's
    sizes, as a download would bring -> folder."""
    from nanobert import BertConfig, BertForPreTraining
    os.makedirs(folder, exist_ok=True)
    vocab = write_vocab(folder)
    with open(vocab, encoding="utf-8") as f:
        size = len(f.read().split())
    BertForPreTraining(BertConfig(vocab_size=size, **TINY)).save_pretrained(folder)
    return folder


def edit_json(path, **changes):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    data.update(changes)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)


def classify_files(folder):
    """--train / --dev TSV files of a two-label task over WORDS."""
    rng = numpy.random.default_rng(1)
    paths = []
    for split, rows in (("train", 24), ("dev", 8)):
        path = os.path.join(folder, f"{split}.tsv")
        with open(path, "w", encoding="utf-8") as f:
            for i in range(rows):
                f.write(" ".join(rng.choice(WORDS, size=6)) + f"\t{i % 2}\n")
        paths.append(path)
    return paths


def train_args(folder, out, *more):
    """A two-step train.py run on the tiny corpus (seconds)."""
    return ["train.py", "--data", write_text(folder), "--heldout", "none",
            "--vocab", write_vocab(folder), "--steps", "2", "--batch-size", "4",
            "--max-seq-length", "16", "--dupe-factor", "1", "--log-every", "1",
            "--eval-every", "0", "--out", out, *more]


def finetune_args(folder, model, out, *more):
    train, dev = classify_files(folder)
    return ["finetune.py", "--model", model, "--task", "classify", "--train", train,
            "--dev", dev, "--epochs", "1", "--batch-size", "4", "--max-seq-length", "16",
            "--out", out, *more]


def pretrained_run(folder, root=HERE, name="pretrain"):
    """A finished train.py run (<out>/checkpoint, metrics.jsonl) of `root`'s code -> its
    --out."""
    out = os.path.join(folder, name)
    result = run_case(train_args(folder, out), root, timeout=600)
    if result["exit"] != 0:
        raise RuntimeError(f"the tiny train.py run failed: {result['stderr']}")
    return out

# ------------------------------------------------------------------------------ cases
# Each case: folder -> (argv, after) where after(result) adds what was kept (None: nothing
# to check) to the result. argv[0] is a script of the repository or "-m module".


def fill_mask(model):
    return ["-m", "nanobert.fill_mask", "--model", model, "the [MASK] sat ."]


def case_header_1gib(folder, root=HERE):
    """model.safetensors of 4 KB on disk whose header length says 1 GiB (a sparse file)."""
    model = tiny_model(os.path.join(folder, "m"))
    path = os.path.join(model, "model.safetensors")
    with open(path, "wb") as f:
        f.write((2**30).to_bytes(8, "little"))
    os.truncate(path, 2**30 + 4096)
    return fill_mask(model), None


def case_tensor_too_large(folder, root=HERE):
    """A header that declares the word embeddings 1 GiB, far larger than config.json allows;
    the file sparse, so that the byte ranges tile it exactly."""
    from nanobert.formats import safetensors
    model = tiny_model(os.path.join(folder, "m"))
    path = os.path.join(model, "model.safetensors")
    tensors = safetensors.load_file(path)
    big = "bert.embeddings.word_embeddings.weight"
    header, offset = {}, 0
    for name, array in tensors.items():
        shape = [2**18, 1024] if name == big else list(array.shape)
        size = int(numpy.prod(shape)) * 4
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
    os.truncate(path, 8 + len(raw) + offset)
    return fill_mask(model), None


def case_layers(count):
    def case(folder, root=HERE):
        model = tiny_model(os.path.join(folder, "m"))
        edit_json(os.path.join(model, "config.json"), num_hidden_layers=count)
        return fill_mask(model), None
    case.__doc__ = f"config.json with num_hidden_layers {count:,} (the weights of 2 layers)."
    return case


def case_special_file(name, device=None):
    """The model folder's file `name` replaced by a FIFO (named pipe) that nothing writes, or
    by a link to a device (/dev/zero: endless zeros)."""
    def case(folder, root=HERE):
        model = tiny_model(os.path.join(folder, "m"))
        path = os.path.join(model, name)
        os.remove(path)
        if device:
            os.symlink(device, path)
        else:
            os.mkfifo(path)
        return fill_mask(model), None
    case.__doc__ = f"{name} is {f'a link to {device}' if device else 'a FIFO nothing writes'}."
    return case


def case_config_value(**changes):
    def case(folder, root=HERE):
        model = tiny_model(os.path.join(folder, "m"))
        edit_json(os.path.join(model, "config.json"), **changes)
        return fill_mask(model), None
    case.__doc__ = f"config.json with {json.dumps(changes)}."
    return case


def case_huge_config_train(folder, root=HERE):
    """train.py --config with hidden_size 10^9 (the sizes cannot be allocated)."""
    config = os.path.join(folder, "config.json")
    with open(config, "w", encoding="utf-8") as f:
        json.dump({**TINY, "hidden_size": 10**9, "num_attention_heads": 1,
                   "intermediate_size": 4}, f)
    return train_args(folder, os.path.join(folder, "run"), "--config", config), None


def case_huge_config_from_scratch(folder, root=HERE):
    """finetune.py --from-scratch on a model whose config.json has hidden_size 10^9."""
    model = tiny_model(os.path.join(folder, "m"))
    edit_json(os.path.join(model, "config.json"), hidden_size=10**9, num_attention_heads=1)
    return finetune_args(folder, model, os.path.join(folder, "run"), "--from-scratch"), None


def case_tokenizer_config(content):
    def case(folder, root=HERE):
        model = tiny_model(os.path.join(folder, "m"))
        with open(os.path.join(model, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            f.write(content)
        return fill_mask(model), None
    case.__doc__ = f"tokenizer_config.json holding {content!r}."
    return case


def case_trainer_state_step(folder, root=HERE):
    """train.py --resume on a checkpoint whose trainer_state.json has "step": "2"."""
    out = pretrained_run(folder, root)
    edit_json(os.path.join(out, "checkpoint", "trainer_state.json"), step="2")
    return train_args(folder, out, "--resume"), None


def kept(paths):
    """after(): which of `paths` (a folder's files) still hold what they held."""
    before = {path: _digest(path) for path in paths}

    def after(result):
        result["kept"] = all(_digest(path) == digest for path, digest in before.items())
    return after


def _digest(path):
    import hashlib
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def case_finetune_out_on_source(folder, root=HERE):
    """finetune.py --model P/checkpoint --out P --lr 1e-4: P is the pretraining run it reads."""
    out = pretrained_run(folder, root)
    source = os.path.join(out, "checkpoint")
    files = [os.path.join(source, n) for n in ("model.safetensors", "trainer_state.json")] + \
        [os.path.join(out, "metrics.jsonl")]
    return finetune_args(folder, source, out, "--lr", "1e-4"), kept(files)


def case_init_from_out(folder, root=HERE):
    """train.py --init-from X/checkpoint --out X."""
    out = pretrained_run(folder, root)
    files = [os.path.join(out, "checkpoint", "model.safetensors"),
             os.path.join(out, "metrics.jsonl")]
    return train_args(folder, out, "--init-from", os.path.join(out, "checkpoint")), kept(files)


def case_out_on_other_run(folder, root=HERE):
    """train.py --out X where X holds an earlier run (no --resume, no --overwrite)."""
    out = pretrained_run(folder, root)
    files = [os.path.join(out, "checkpoint", "model.safetensors"),
             os.path.join(out, "metrics.jsonl")]
    return train_args(folder, out), kept(files)


def case_grid_alike_rates(folder, root=HERE):
    """finetune.py --lr 1e-4 1.0001e-4: two rates that format alike at 3 digits."""
    model = tiny_model(os.path.join(folder, "m"))
    out = os.path.join(folder, "grid")

    def after(result):
        runs = sorted(n for n in os.listdir(out) if n.startswith("lr"))
        result["kept"] = len(runs) == 2
        result["note"] = f"run folders: {runs}"
    return finetune_args(folder, model, out, "--lr", "1e-4", "1.0001e-4"), after


def case_second_run(folder, root=HERE):
    """A second train.py on the --out of one that is running (its lock held)."""
    out = os.path.join(folder, "busy")
    script, *flags = train_args(folder, out, "--steps", "100000")
    first = subprocess.Popen([sys.executable, os.path.join(root, script), *flags], cwd=root,
                             env={**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1"},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    wait_for(lambda: os.path.exists(os.path.join(out, "data")), 120)

    def after(result):
        first.poll()
        result["kept"] = first.returncode is None       # the first run still going
        result["note"] = f"first run pid {first.pid}"
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    return train_args(folder, out), after


def wait_for(condition, seconds):
    end = time.time() + seconds
    while not condition():
        if time.time() > end:
            raise TimeoutError("the first run did not start in time")
        time.sleep(0.05)


def case_sparse_file(name):
    def case(folder, root=HERE):
        model = tiny_model(os.path.join(folder, "m"))
        path = os.path.join(model, name)
        with open(path, "r+b") as f:
            f.truncate(2**30)                 # its start kept, then 1 GiB of zeros on no disk
        return fill_mask(model), None
    case.__doc__ = f"{name} grown to 1 GiB by a sparse tail of zeros."
    return case


def case_nested_config(folder, root=HERE):
    """config.json nested 100,000 deep."""
    model = tiny_model(os.path.join(folder, "m"))
    with open(os.path.join(model, "config.json"), "w", encoding="utf-8") as f:
        f.write('{"a": ' + "[" * 100_000)
    return fill_mask(model), None


def case_optimizer_header(folder, root=HERE):
    """train.py --resume on a checkpoint whose optimizer.safetensors claims a 1 GiB header."""
    out = pretrained_run(folder, root)
    path = os.path.join(out, "checkpoint", "optimizer.safetensors")
    with open(path, "wb") as f:
        f.write((2**30).to_bytes(8, "little"))
    os.truncate(path, 2**30 + 4096)
    return train_args(folder, out, "--resume"), None


class Interrupted:
    """A case's command that gets Ctrl-C as soon as the path `when` exists."""

    def __init__(self, argv, when):
        self.argv, self.when = argv, when


def case_interrupt_data(folder, root=HERE):
    """Ctrl-C while train.py prepares its data (a corpus of 2,000 documents)."""
    out = os.path.join(folder, "run")
    argv = train_args(folder, out)
    write_text(folder, documents=2000)
    return Interrupted(argv, os.path.join(out, "data")), None


CASES = {
    "header-1gib": case_header_1gib,
    "tensor-too-large": case_tensor_too_large,
    "layers-1024": case_layers(1024),
    "layers-100000": case_layers(100_000),
    "layers-1000000": case_layers(1_000_000),
    "fifo": case_special_file("model.safetensors"),
    "config-fifo": case_special_file("config.json"),
    "model-dev-zero": case_special_file("model.safetensors", "/dev/zero"),
    "dropout-string": case_config_value(hidden_dropout_prob="0.1"),
    "eps-string": case_config_value(layer_norm_eps="1e-12"),
    "init-range-null": case_config_value(initializer_range=None),
    "beyond-memory": case_config_value(hidden_size=2**16, vocab_size=2**22,
                                       num_attention_heads=2**8),
    "hidden-1e9-train": case_huge_config_train,
    "hidden-1e9-from-scratch": case_huge_config_from_scratch,
    "config-sparse-1gib": case_sparse_file("config.json"),
    "vocab-sparse-1gib": case_sparse_file("vocab.txt"),
    "config-nested": case_nested_config,
    "optimizer-header-1gib": case_optimizer_header,
    "tokenizer-config-array": case_tokenizer_config("[1, 2]"),
    "tokenizer-config-torn": case_tokenizer_config('{"do_lower_case": tr'),
    "tokenizer-config-types": case_tokenizer_config('{"do_lower_case": "no"}'),
    "trainer-state-step-string": case_trainer_state_step,
    "finetune-out-on-source": case_finetune_out_on_source,
    "init-from-out": case_init_from_out,
    "out-on-other-run": case_out_on_other_run,
    "grid-alike-rates": case_grid_alike_rates,
    "second-run": case_second_run,
    "interrupt-data": case_interrupt_data,
}

# --------------------------------------------------------------------------- measuring

WRAPPER = """
import json, os, resource, signal, subprocess, sys, time
timeout, watch, command = float(sys.argv[1]), sys.argv[2], sys.argv[3:]
start = time.time()
p = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
if watch != "-":                     # Ctrl-C as soon as `watch` exists
    while not os.path.exists(watch) and p.poll() is None and time.time() - start < timeout:
        time.sleep(0.02)
    p.send_signal(signal.SIGINT)
try:
    out, err = p.communicate(timeout=max(0.1, timeout - (time.time() - start)))
    code = p.returncode
except subprocess.TimeoutExpired:
    p.kill()
    out, err = p.communicate()
    code = "timeout"
seconds = time.time() - start
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({"exit": code, "seconds": seconds, "peak": peak, "stdout": out, "stderr": err}))
"""


def run_case(argv, root=HERE, timeout=60, memory_limit=None, interrupt_when=None):
    """Run `argv` (a script of `root`, or -m module) with `root` on PYTHONPATH in a wrapper
    process -> {"exit", "seconds", "peak" (bytes), "stdout", "stderr"} of that one child.
    memory_limit (bytes): its address space capped (ulimit -v), for the old code's cases
    that would take the machine's memory; interrupt_when: a path whose appearance sends the
    command Ctrl-C (SIGINT)."""
    if isinstance(argv, Interrupted):
        argv, interrupt_when = argv.argv, argv.when
    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1",
           "NANOBERT_THREADS": "1"}
    script = argv if argv[0] == "-m" else [os.path.join(root, argv[0]), *argv[1:]]
    command = [sys.executable, "-c", WRAPPER, str(timeout), interrupt_when or "-",
               sys.executable, *script]
    limit = None
    if memory_limit:
        import resource

        def limit():
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True,
                          preexec_fn=limit)
    if done.returncode != 0:
        raise RuntimeError(f"the wrapper failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


_baselines = {}


def baseline(argv, root=HERE):
    """The same command with --help: the process's imports, nothing of the case (measured
    once per command and code)."""
    head = tuple(argv[:2] if argv[0] == "-m" else argv[:1])
    if (head, root) not in _baselines:
        _baselines[head, root] = run_case([*head, "--help"], root)
    return _baselines[head, root]


def measure(name, folder, root=HERE, timeout=60, memory_limit=None):
    """Build case `name` in `folder`, run it -> the result, with "lines" (stderr's non-empty
    lines), "over_peak" / "over_seconds" (over baseline) and "kept" where the case checks."""
    os.makedirs(folder, exist_ok=True)
    argv, after = CASES[name](folder, root)
    result = run_case(argv, root, timeout, memory_limit)
    base = baseline(getattr(argv, "argv", argv), root)
    result.update(lines=len([line for line in result["stderr"].splitlines() if line.strip()]),
                  over_peak=result["peak"] - base["peak"],
                  over_seconds=result["seconds"] - base["seconds"])
    if after:
        after(result)
    return result


def row(name, result):
    last = (result["stderr"].strip().splitlines() or [""])[-1]
    return (f"| {name} | {result['exit']} | {result['lines']} | {result['peak'] / 1e6:,.0f} "
            f"({result['over_peak'] / 1e6:+,.0f}) | {result['seconds']:.1f} "
            f"({result['over_seconds']:+.1f}) | {result.get('kept', '')} | "
            f"{last[:160].replace('|', '/')} |")


def main(argv=None):
    import tempfile
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--root", default=HERE, help="the repository whose code runs the cases")
    p.add_argument("--timeout", type=float, default=60, help="seconds a case may run")
    p.add_argument("--memory-limit-gb", type=float,
                   help="cap each case's address space (ulimit -v) at this many GB")
    args = p.parse_args(argv)
    limit = int(args.memory_limit_gb * 2**30) if args.memory_limit_gb else None
    print("| case | exit | stderr lines | peak MB (over --help) | seconds (over --help) | "
          "kept | last line |\n|---|---|---|---|---|---|---|")
    for name in args.cases:
        with tempfile.TemporaryDirectory() as folder:
            try:
                print(row(name, measure(name, folder, args.root, args.timeout, limit)),
                      flush=True)
            except (RuntimeError, TimeoutError) as e:
                print(f"| {name} | could not run: {str(e)[-200:]} |", flush=True)


if __name__ == "__main__":
    main()
