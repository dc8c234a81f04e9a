"""The output folder --out, the user's only copy of a day's work.

One run at a time: a run holds an OS lock on <out>/.nanobert.lock (fcntl.flock) for its whole
life, and the OS lets go of it when the process ends, however it ends (kill -9 leaves nothing
to clean by hand). A second run on the folder is refused in one line naming the holder, whose
pid, host, start time and command line the lock file holds.

Nothing a run did not make is lost: a new run is refused, before any work, in an --out that
holds a model, a checkpoint or another run's records, unless --resume continues that run or
--overwrite says to replace it (as the new run writes its own files; nothing is deleted up
front); and whatever the flags, --out never holds the model the run reads (--model,
--init-from), which the run's checkpoint/ or best/ would replace.
"""
import datetime
import errno
import functools
import os
import socket
import sys

try:
    import fcntl
except ImportError:            # not POSIX: no lock, the rest still holds
    fcntl = None

LOCK_NAME = ".nanobert.lock"
# What train.py and finetune.py leave in --out: models, checkpoints and a run's records
RUN_OUTPUTS = ("checkpoint", "best", "config.json", "model.safetensors", "trainer_state.json",
               "metrics.jsonl", "results.json", "eval.json", "grid.json")
# ...and what marks a subfolder as one of a grid's runs (<out>/<run>/)
RUN_FOLDER_OUTPUTS = ("checkpoint", "best", "metrics.jsonl", "results.json")

_held = {}                     # real path of a folder -> its open lock file, in this process


def lock_folder(folder):
    """Take the lock of `folder` for this process (again: nothing to do), held until
    release_folders or the process's end; ValueError naming the holder if another process
    has it."""
    key = os.path.realpath(folder)
    if key in _held or fcntl is None:
        return
    lock = open(os.path.join(folder, LOCK_NAME), "a+", encoding="utf-8")  # not truncated:
    try:                                                   # the holder's note stays readable
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            lock.close()
            raise
        lock.seek(0)
        holder = " ".join(lock.read(400).split()) or "a process that has not said who it is"
        lock.close()
        raise ValueError(f"{folder} is in use by another run ({holder}): one run per folder; "
                         "wait for it to end or stop it, or give another --out") from None
    lock.seek(0)
    lock.truncate()
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    command = " ".join(sys.argv)[:200]
    lock.write(f"pid {os.getpid()} on {socket.gethostname()}, started {started}: {command}\n")
    lock.flush()
    _held[key] = lock


def release_folders(keep=()):
    """Let go of this process's locks but those of the folders (real paths) in `keep`."""
    for key in [k for k in _held if k not in keep]:
        _held.pop(key).close()              # closing the file releases the flock


def releases_output_folder(main):
    """A command line's main() that lets go of the --out lock it took when it returns or
    raises, so that a program calling several mains in turn (the tests, a notebook, a
    benchmark) can reuse a folder; a process that ends lets go anyway."""
    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        held = set(_held)
        try:
            return main(*args, **kwargs)
        finally:
            release_folders(keep=held)
    return wrapped


def run_outputs(folder):
    """What an earlier run left in `folder`: RUN_OUTPUTS there, and the subfolders that hold
    a run's outputs (a grid's runs), by name."""
    if not os.path.isdir(folder):
        return []
    found = [name for name in RUN_OUTPUTS if os.path.exists(os.path.join(folder, name))]
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.is_dir(follow_symlinks=False) and entry.name not in RUN_OUTPUTS and any(
                os.path.exists(os.path.join(entry.path, name)) for name in RUN_FOLDER_OUTPUTS):
            found.append(entry.name + "/")
    return found


def _inside(path, folder):
    """Whether `path` is `folder` or lies inside it (real paths: links followed)."""
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_output_folder(out, sources=(), resume=False, overwrite=False):
    """One line (ValueError) before any work when --out would lose what this run did not
    make: it is, or holds, a model folder the run reads (`sources`: --model, --init-from;
    refused whatever the flags), or it holds an earlier run's outputs (run_outputs) and
    neither --resume nor --overwrite was given."""
    if resume and overwrite:
        raise ValueError("--resume continues the run in --out, --overwrite replaces it: give one")
    for source in sources:
        if source and os.path.isdir(source) and _inside(source, out):
            raise ValueError(f"--out {out} holds the model this run reads ({source}), which "
                             "the run's own checkpoint/ or best/ would replace; give another "
                             "--out")
    found = run_outputs(out)
    if found and not (resume or overwrite):
        shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        raise ValueError(f"--out {out} holds an earlier run's {shown}: --resume continues it, "
                         "--overwrite replaces it, or give another --out")


def claim_output_folder(out, sources=(), resume=False, overwrite=False):
    """A new run's --out: made if missing, locked for this process (one run per folder),
    then checked (check_output_folder) -> out."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {out} exists and is not a folder")
    os.makedirs(out, exist_ok=True)
    lock_folder(out)
    check_output_folder(out, sources, resume, overwrite)
    return out
