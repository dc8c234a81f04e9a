"""Atomic file writes: a crash or Ctrl-C mid-save never destroys the previous file."""
import contextlib
import os
import secrets


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
