"""Files: atomic writes (a crash or Ctrl-C mid-save never destroys the previous file or
folder) and reading a JSON object with errors that name the file."""
import contextlib
import json
import os
import secrets
import shutil


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


def read_json(path, what="JSON file"):
    """The JSON object (a dict) in the file `path`; `what` names the file in the errors
    ("config.json", "manifest.json"). FileNotFoundError if it is missing, ValueError naming
    the file if it is not UTF-8 JSON or holds something else than an object."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no {what} at {path}")
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value
