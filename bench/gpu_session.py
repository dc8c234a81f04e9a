"""bench/gpu_session.sh's report: the JSON records of its bench.gpu_profile phases (one file a
phase, named after it) merged into one JSON with every run (its phase added) and the ratios
the session is for, and a short summary table.

    python -m bench.gpu_session WORK_DIR --out session.json --summary summary.txt

Ratios (wall time over wall time, same case and precision): nanobert over torch eager and
over torch.compile; nanobert's graph over its eager step (phase "profile" over "eager");
the fused attention over the unfused one ("fused" over "profile") and tiles of 64 keys over
32 ("fused-tile64" over "fused"). A run that failed, was skipped or whose graph failed to
capture enters no ratio (its step_mode says how it ran)."""
import argparse
import glob
import json
import os

# (what, numerator (phase or None: any, framework), denominator (phase or None, framework))
RATIOS = (("nanobert / torch eager", (None, "nanobert"), (None, "torch")),
          ("nanobert / torch.compile", (None, "nanobert"), ("compile", "torch.compile")),
          ("graph / eager (nanobert)", ("profile", "nanobert"), ("eager", "nanobert")),
          ("fused / unfused attention", ("fused", "nanobert"), ("profile", "nanobert")),
          ("fused tiles of 64 / of 32 keys", ("fused-tile64", "nanobert"),
           ("fused", "nanobert")))
# phases whose nanobert runs are not the default configuration: never a "nanobert" of ratios
# that name no phase
VARIANTS = {"eager", "eager-more", "fused", "fused-tile64"}


def read_phases(folder):
    """{phase name: its gpu_profile JSON} of the folder's *.json files."""
    phases = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(path) as f:
            phases[os.path.basename(path)[:-5]] = json.load(f)
    return phases


def all_runs(phases):
    return [{"phase": name, **run} for name, result in phases.items()
            for run in result.get("runs", [])]


def timed(run):
    """Whether a run's wall time may enter a ratio: nanobert's only if its step ran as its
    phase asked (eager in an eager phase, else from its graph)."""
    if run.get("wall_ms") is None:
        return False
    wanted = "eager" if run["phase"].startswith("eager") else "graph"
    return run["framework"] != "nanobert" or run.get("step_mode") == wanted


def pick(runs, phase, framework, case, precision):
    for run in runs:
        if (run["framework"], run["case"], run["precision"]) == (framework, case, precision) \
                and (run["phase"] == phase if phase else run["phase"] not in VARIANTS) \
                and timed(run):
            return run
    return None


def ratios(runs):
    """Every ratio of RATIOS the runs allow."""
    out = []
    keys = sorted({(r["case"], r["precision"]) for r in runs if r.get("wall_ms")})
    for what, (top_phase, top), (bottom_phase, bottom) in RATIOS:
        for case, precision in keys:
            a = pick(runs, top_phase, top, case, precision)
            b = pick(runs, bottom_phase, bottom, case, precision)
            if a is not None and b is not None and a is not b:
                out.append({"what": what, "case": case, "precision": precision,
                            "ratio": a["wall_ms"] / b["wall_ms"], "numerator_ms": a["wall_ms"],
                            "denominator_ms": b["wall_ms"]})
    return out


def summary(session):
    """The short table: a line a run, then a line a ratio."""
    lines = [f"{session['gpu']}   {session['date']}",
             f"{'phase':<13}{'framework':<14}{'case':<14}{'prec':<8}{'wall ms':>9}"
             f"{'peak GiB':>9}  step"]
    for r in session["runs"]:
        head = f"{r['phase']:<13}{r['framework']:<14}{r['case']:<14}{r['precision']:<8}"
        if "error" in r or "skipped" in r:
            lines.append(head + (f"failed: {r['error']}" if "error" in r
                                 else f"skipped: {r['skipped']}")[:90])
            continue
        wall = "-" if r.get("wall_ms") is None else f"{r['wall_ms']:.1f}"
        peak = "-" if r.get("peak_gib") is None else f"{r['peak_gib']:.2f}"
        lines.append(head + f"{wall:>9}{peak:>9}  {r.get('step_mode', '-')}"[:120])
    for q in session["ratios"]:
        lines.append(f"{q['what']:<32}{q['case']:<14}{q['precision']:<8}{q['ratio']:>6.2f} "
                     f"({q['numerator_ms']:.1f} / {q['denominator_ms']:.1f} ms)")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="the phases' gpu_profile JSON files")
    parser.add_argument("--out", required=True, help="the session's JSON")
    parser.add_argument("--summary", required=True, help="the short table")
    args = parser.parse_args(argv)
    phases = read_phases(args.folder)
    first = next(iter(phases.values()), {})
    runs = all_runs(phases)
    session = {"gpu": first.get("gpu", "-"), "cupy": first.get("cupy"),
               "torch": next((p["torch"] for p in phases.values() if p.get("torch")), None),
               "date": first.get("date", "-"),
               "phases": {name: {k: v for k, v in result.items() if k != "runs"}
                          for name, result in phases.items()},
               "runs": runs, "ratios": ratios(runs)}
    with open(args.out, "w") as f:
        json.dump(session, f, indent=1)
    with open(args.summary, "w") as f:
        f.write(summary(session))


if __name__ == "__main__":
    main()
