"""Files: atomic writes (a crash or Ctrl-C mid-save never destroys the previous file or
folder), recovering what a crash left behind, and reading a JSON object or a regular file
with errors that name the file."""
import contextlib
import json
import os
import secrets
import shutil
import stat
import sys


@contextlib.contextmanager
def atomic_open(path, mode="wb", encoding=None):
    """Open a temporary file beside `path` for writing; on a clean exit flush, fsync and
    rename it over `path` (os.replace is atomic); on any error remove it and re-raise."""
    folder, base = os.path.split(os.path.abspath(path))
    temporary = os.path.join(folder, f".{base}.{secrets.token_hex(4)}.tmp")
    # O_EXCL: never reuse someone else's file; mode 0o666 lets the umask decide, as open() would
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    descriptor = os.open(temporary, flags, 0o666)
    try:
        with os.fdopen(descriptor, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


@contextlib.contextmanager
def atomic_folder(folder):
    """Build a folder beside `folder` (yielded path), then swap it in: the old one is moved
    aside, the new one renamed into place, and only then the old one deleted. A crash at any
    point leaves a complete folder at `folder` or at `folder + ".old"`."""
    folder = os.path.abspath(os.fspath(folder))
    building, previous = folder + ".tmp", folder + ".old"
    shutil.rmtree(building, ignore_errors=True)
    try:
        yield building
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    if os.path.isdir(folder):
        shutil.rmtree(previous, ignore_errors=True)
        os.replace(folder, previous)
    os.replace(building, folder)
    shutil.rmtree(previous, ignore_errors=True)


def recover_folder(folder, log=None):
    """Finish what a crash inside atomic_folder left beside `folder`, so that every reader
    sees one complete folder; -> a one-line account of what was done (also written to `log`,
    default sys.stderr), or None when there was nothing to do.

    - only `folder.old` exists (a crash between the two renames): it is the last complete
      folder, renamed back into place;
    - `folder` and `folder.old` both exist (a crash after the swap): `folder` is complete and
      `folder.old` stale: removed;
    - `folder.tmp` exists: a build that never finished (a swap completes only after the
      build): removed.
    """
    folder = os.path.abspath(os.fspath(folder))
    building, previous = folder + ".tmp", folder + ".old"
    done = []
    if os.path.isdir(previous):
        if os.path.isdir(folder):
            shutil.rmtree(previous)
            done.append(f"removed the stale {previous}")
        else:
            os.replace(previous, folder)
            done.append(f"restored {folder} from {previous}")
    if os.path.isdir(building):
        shutil.rmtree(building)
        done.append(f"removed the unfinished {building}")
    if not done:
        return None
    message = "; ".join(done) + " (left by an interrupted save)"
    print(message, file=sys.stderr if log is None else log, flush=True)
    return message


def recover_folders_in(parent, log=None):
    """recover_folder for every `<name>.old` / `<name>.tmp` folder directly inside `parent`
    (e.g. the data sets of a run, each built by atomic_folder) -> their messages."""
    if not os.path.isdir(parent):
        return []
    names = sorted({name[:-4] for name in os.listdir(parent)
                    if name.endswith((".old", ".tmp"))
                    and os.path.isdir(os.path.join(parent, name))})
    messages = (recover_folder(os.path.join(parent, name), log) for name in names)
    return [m for m in messages if m]


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"))


def check_regular_file(path, what="file"):
    """FileNotFoundError if nothing is at `path`; ValueError saying what it is if it is not a
    regular file (a folder, /dev/zero, a FIFO, a socket): reading one would hang, never end,
    or fail with a confusing error."""
    path = os.fspath(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} not found: {path!r}") from None
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a file")
        raise ValueError(f"{what} {path!r} is not a regular file: it is {kind}")
    return path


JSON_MAX_BYTES = 16 * 1000 * 1000    # a config, a tokenizer, a trainer state: KBs to a few MB


def read_json(path, what="JSON file", max_bytes=JSON_MAX_BYTES):
    """The JSON object (a dict) in the file `path`; `what` names the file in the errors
    ("config.json", "manifest.json"). FileNotFoundError if it is missing, ValueError naming
    the file if it is not UTF-8 JSON, holds something else than an object, or is larger than
    `max_bytes` (a sparse file of zeros must not be read whole)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no {what} at {path}")
    check_regular_file(path, what)
    size = os.path.getsize(path)
    if size > max_bytes:
        raise ValueError(f"{path}: {size:,} bytes, more than the {max_bytes:,} a {what} may "
                         "hold: not read")
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:            # e.g. 100,000 nested "[": hostile, never a config
        raise ValueError(f"{path}: JSON nested too deeply to be a {what}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def output_folder(path, flag="--out"):
    """Create the output folder `path` (and its parents) -> path; a ValueError naming the
    flag when something that is not a folder is already there."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{flag} {path} exists and is not a folder")
    os.makedirs(path, exist_ok=True)
    return path
