"""bench/gpu_session.sh fits one device call: its first call's phases' time limits add up to
at most 480 s (a call has 600, the machine's start on top), it leaves at most 4 files in $OUT,
and it runs on the CuPy stand-in (DRY_RUN=1) into one JSON with every run, how each ran and
the ratios (bench/gpu_session.py), and a short summary table."""
import json
import os
import re
import subprocess
import sys

import pytest

from bench import gpu_session

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "gpu_session.sh")
CALL_LIMIT_S = 480


def phase_limits(script, phase):
    """The time limits of the commands a phase of the script runs (phase / profile_phase)."""
    block = re.search(rf"^    {phase}\)(.*?);;", script, re.S | re.M)
    assert block, f"no phase {phase} in gpu_session.sh"
    return [int(n) for n in re.findall(r"\b(?:phase|profile_phase) [\w-]+ (\d+)", block[1])]


def test_the_first_calls_phases_fit_in_480_seconds():
    script = open(SCRIPT).read()
    first = re.search(r'^FIRST="([^"]+)"', script, re.M)[1].split()
    limits = {phase: sum(phase_limits(script, phase)) for phase in first}
    assert all(limits.values()) and sum(limits.values()) <= CALL_LIMIT_S, limits
    assert {"tests", "profile", "compile", "variants", "models"} <= set(first), first
    stated = re.search(r"limits ([\d +]+) = (\d+) s", script)   # the comment says the same
    assert [int(n) for n in stated[1].split("+")] == list(limits.values()), limits
    assert int(stated[2]) == sum(limits.values())


def run(framework, case, precision, wall_ms, mode="graph", **fields):
    return {"framework": framework, "case": case, "precision": precision, "wall_ms": wall_ms,
            "step_mode": mode, **fields}


def test_the_report_merges_the_phases_and_computes_every_ratio(tmp_path):
    """Ratios of like with like: nanobert over torch eager and torch.compile, the graph over
    the eager step, the fused attention over the unfused, tiles of 64 over 32; a nanobert run
    whose capture failed enters none."""
    phases = {
        "profile": [run("nanobert", "base:32x128", "float16", 30.0),
                    run("torch", "base:32x128", "float16", 40.0, "eager"),
                    run("nanobert", "base:32x512", "float16", 90.0,
                        "capture failed: CUDARuntimeError: x"),
                    run("torch", "base:32x512", "float16", 60.0, "eager")],
        "compile": [run("torch.compile", "base:32x128", "float16", 25.0, "compiled")],
        "eager": [run("nanobert", "base:32x128", "float16", 45.0, "eager")],
        "fused": [run("nanobert", "base:32x128", "float16", 27.0)],
        "fused-tile64": [run("nanobert", "base:32x128", "float16", 24.3)],
        "models": [{"framework": "torch", "case": "large:16x128", "precision": "float16",
                    "error": "CUDA out of memory"}]}
    for name, runs in phases.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(
            {"gpu": "NVIDIA H200", "cupy": "14.2", "torch": "2.13", "date": "d", "runs": runs}))
    gpu_session.main([str(tmp_path), "--out", str(tmp_path / "s.json"), "--summary",
                      str(tmp_path / "s.txt")])
    session = json.loads((tmp_path / "s.json").read_text())
    assert len(session["runs"]) == 9 and {r["phase"] for r in session["runs"]} == set(phases)
    got = {(q["what"], q["case"]): round(q["ratio"], 3) for q in session["ratios"]}
    assert got == {("nanobert / torch eager", "base:32x128"): 0.75,
                   ("nanobert / torch.compile", "base:32x128"): 1.2,
                   ("graph / eager (nanobert)", "base:32x128"): 0.667,
                   ("fused / unfused attention", "base:32x128"): 0.9,
                   ("fused tiles of 64 / of 32 keys", "base:32x128"): 0.9}, got
    summary = (tmp_path / "s.txt").read_text()
    assert "capture failed" in summary and "failed: CUDA out of memory" in summary, summary
    assert len(summary.splitlines()) == 2 + 9 + 5, summary


@pytest.mark.skipif(sys.platform == "win32", reason="bash, timeout")
def test_a_dry_run_on_the_standin_leaves_its_files_and_figures(tmp_path):
    """DRY_RUN=1 runs a phase on the CuPy stand-in (tiny models): within its limit, three
    files in $OUT, nanobert's record with how its step ran."""
    pytest.importorskip("cupy_standin")
    out = tmp_path / "out"
    env = {**os.environ, "DRY_RUN": "1", "OUT": str(out), "PYTHON": sys.executable}
    result = subprocess.run(["bash", SCRIPT, "models"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    log = (out / "session.log").read_text()
    assert "== models: rc 0" in log, log[-3000:]
    assert sorted(os.listdir(out)) == ["session.json", "session.log", "summary.txt"]
    session = json.loads((out / "session.json").read_text())
    assert [(r["phase"], r["framework"], r["case"], r["step_mode"]) for r in session["runs"]] \
        == [("models", "nanobert", "tiny:2x16", "graph")], session["runs"]
    assert session["runs"][0]["peak_gib"] > 0
    assert "tiny:2x16" in (out / "summary.txt").read_text()
