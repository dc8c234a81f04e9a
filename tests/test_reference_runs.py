"""nanobert/training/reference_runs.py: a run placed against README's known-good run of its
kind (the line train.py and finetune.py end with, the curve drawn behind loss_curve.png), a
reference written from a run's folder, and the shipped references found for the defaults."""
import json
import os

import pytest

from nanobert.training import reference_runs
from nanobert.training.compare import write_json

BROWN = os.path.join("somewhere", "data", "brown", "train.txt.gz")   # the corpus's own text


def user_args(**changes):
    """vars() of a train.py run on the nano preset and Brown's own text, 10 minutes."""
    return {"preset": "nano", "corpus": "brown", "data": [BROWN], "config": None,
            "init_from": None, "minutes": 10.0, "steps": 750, "lr": 1.5e-3, "batch_size": 52,
            **changes}


@pytest.fixture
def references(tmp_path, monkeypatch):
    """A pretraining reference in a folder of its own: held-out MLM accuracy 0.10 at step
    500, 0.14 at 1,000, 0.20 at its end, step 2,000."""
    monkeypatch.setattr(reference_runs, "FOLDER", str(tmp_path / "references"))
    curve = [{"kind": "train", "step": s, "mlm_loss": 8.0 - s / 1000, "lr": 2e-3 - s * 1e-6}
             for s in (100, 1000)] + \
        [{"kind": "eval", "step": s, "mlm_accuracy": a} for s, a in
         ((500, 0.10), (1000, 0.14), (2000, 0.20))]
    write_json(str(tmp_path / "references" / "pretrain-nano-brown.json"), {
        "command": "`python train.py`", "machine": "quiet 2-core machine", "steps": 2000,
        "args": {"lr": 1.5e-3, "batch_size": 52}, "heldout": {"mlm_accuracy": 0.20},
        "curve": curve})
    return tmp_path


def place(accuracy, step, **changes):
    return reference_runs.place_pretraining(user_args(**changes), {
        "step": step, "heldout": {"mlm_accuracy": accuracy}})


def test_a_run_is_placed_against_the_reference_at_the_same_step(references):
    line = place(0.118, 750)                          # the reference: 0.12 at step 750
    assert line == ("held-out MLM accuracy 0.118 at step 750; the reference run (`python "
                    "train.py`, quiet 2-core machine) had 0.120 at this step: on track; it went "
                    "on to step 2,000 (0.200): fewer steps in the same 10 minutes here (a "
                    "busier or slower machine)"), line
    assert ": behind (a shorter schedule: your rate fell to 0 by step 750, the reference's " \
        "was 1.3e-03 at this step); it went on" in place(0.105, 750)
    assert ": behind (a different corpus? a changed model or data?); it went on to step 2,000 " \
        "(0.200)" in place(0.105, 750, steps=2000)    # its schedule as long: no other suspect
    assert "behind (your run differs in --batch-size, --lr); it went" in place(
        0.105, 750, lr=1e-3, batch_size=32)
    assert place(0.118, 750, minutes=None).endswith(  # --steps 750: a run cut short
        "0.120 at this step: on track; it went on to step 2,000 (0.200)")
    assert ": ahead of it;" in place(0.135, 750)
    assert place(0.199, 2400, steps=2400).endswith("had 0.200 at its end (step 2,000): on "
                                                   "track")
    assert place(0.05, 300).endswith("had its first held-out point at step 500: too early to "
                                     "place")


def test_a_run_without_a_reference_says_so(references):
    line = place(0.2, 2000, config="my_config.json")
    assert line == ("no reference run for a run with --config, --data or --init-from (there is "
                    "one for --preset nano on --corpus brown): loss_curve.png shows your run "
                    "alone")
    assert "no reference run for --preset tiny on --corpus brown" in place(0.2, 2000,
                                                                           preset="tiny")
    assert "no reference run for a run with" in place(0.2, 2000, data=["my_corpus.txt"])
    assert reference_runs.place_pretraining(user_args(), {"step": 9}).startswith(
        "no held-out evaluation")


def test_the_reference_curve_is_drawn_behind_the_run(references, monkeypatch):
    drawn = []
    monkeypatch.setattr(reference_runs, "plot", lambda *a, behind=None: drawn.append(behind))
    reference_runs.plot_with_reference("pretrain", user_args(), "m.jsonl", "p.png", ("mlm_loss",))
    reference_runs.plot_with_reference("pretrain", user_args(preset="tiny"), "m.jsonl", "p.png",
                                       ("mlm_loss",))
    reference_runs.plot_with_reference("pretrain", user_args(preset="tiny"), "m.jsonl", "p.png",
                                       ("mlm_loss",), alone=False)      # finetune.py's: none
    assert len(drawn) == 2 and drawn[0][-1] == {"kind": "eval", "step": 2000,
                                                "mlm_accuracy": 0.20}     # the curve, whole
    assert drawn[1] is None                            # the run alone


def test_a_reference_is_written_from_a_runs_folder(references):
    run = references / "run"
    (run / "checkpoint").mkdir(parents=True)
    with open(run / "metrics.jsonl", "w") as f:
        for step in range(20, 1020, 20):
            f.write(json.dumps({"kind": "train", "step": step, "mlm_loss": 9.123456789 - step
                                / 500, "lr": 1e-3, "tokens_per_second": 5e4}) + "\n")
            if step % 500 == 0:
                f.write(json.dumps({"kind": "eval", "step": step, "mlm_accuracy": step / 5000,
                                    "mlm_loss": 7.0, "nsp_accuracy": 0.6, "nsp_loss": 0.6,
                                    "mlm_accuracy_by_input": {"[MASK]": 0.1}}) + "\n")
    held = {"mlm_accuracy": 0.2, "mlm_loss": 7.0, "nsp_accuracy": 0.6, "nsp_loss": 0.6}
    (run / "eval.json").write_text(json.dumps({"step": 1000, "train_minutes": 2.0,
                                               "heldout": held}))
    (run / "checkpoint" / "trainer_state.json").write_text(json.dumps({"args": user_args()}))
    path = reference_runs.write_reference(str(run), "a test machine")
    assert path == os.path.join(reference_runs.FOLDER, "pretrain-nano-brown.json")
    written = json.loads(open(path).read())
    train = [r["step"] for r in written["curve"] if r["kind"] == "train"]
    assert train == list(range(200, 1200, 200))                  # every 200th step
    assert [r["step"] for r in written["curve"] if r["kind"] == "eval"] == [500, 1000]
    assert written["curve"][0] == {"kind": "train", "step": 200, "mlm_loss": 8.723,
                                   "lr": 0.001}                  # 4 significant digits
    assert written["steps"] == 1000 and written["args"]["lr"] == 1.5e-3
    assert place(0.2, 1000).endswith("had 0.200 at its end (step 1,000): on track")
    (run / "checkpoint" / "trainer_state.json").write_text(json.dumps(
        {"args": user_args(data=["mine.txt"])}))
    with pytest.raises(SystemExit, match="not a run that has a reference"):
        reference_runs.write_reference(str(run), "a test machine")


def test_fine_tuning_is_placed_against_the_default_runs_reference(references):
    write_json(os.path.join(reference_runs.FOLDER, "finetune-default.json"), {
        "command": "`python finetune.py`", "machine": "quiet 2-core machine",
        "args": {"lr": 3e-5, "epochs": 1.0}, "best": {"score": 0.83, "metric": "accuracy",
                                                     "epoch": 1.0}, "curve": []})
    args = {"demo": True, "model": "all-MiniLM-L6-v2", "lr": [3e-5], "epochs": [1.0]}

    def line(score, **changes):
        return reference_runs.place_finetuning({**args, **changes}, {
            "best": {"score": score, "metric": "accuracy", "epoch": 1.0}})
    assert line(0.825) == ("dev accuracy 0.825 after 1 epoch; the reference run (`python "
                           "finetune.py`, quiet 2-core machine) had 0.830 after 1 epoch: on "
                           "track")
    assert line(0.70, lr=[1e-3]).endswith("behind (your run differs in --lr)")
    assert line(0.70, demo=False).startswith("no reference run for --model all-MiniLM-L6-v2")


def test_the_defaults_have_shipped_references():
    """train.py's and finetune.py's no-argument runs find their reference in the package."""
    import finetune
    import train
    pretraining = vars(train.parse_args([]))
    assert reference_runs.reference_name("pretrain", pretraining) == "pretrain-nano-brown"
    reference, _ = reference_runs.load("pretrain", pretraining)
    assert reference["args"]["lr"] == pretraining["lr"] and reference["steps"] > 5000
    assert sum(r["kind"] == "eval" for r in reference["curve"]) >= 10
    try:
        fine_tuning = vars(finetune.resolve_task(finetune.parse_args([])))
    except FileNotFoundError:
        pytest.skip("all-MiniLM-L6-v2 is not installed")
    reference, _ = reference_runs.load("finetune", fine_tuning)
    assert reference["best"]["metric"] == fine_tuning["metric"] == "accuracy"
    assert reference_runs.differences("finetune", fine_tuning, reference) == []
