"""Nothing lost, nothing trusted blindly (docs/refusals.md): hostile model folders, careless
--out folders and two runs on one folder, each as a real command line in a process of its own
(bench/hostile.py builds the cases and measures them). Each refusal is one line on stderr,
exit status 1, within 100 MB and a few seconds over the command's --help, and deletes
nothing."""
import hashlib
import json
import os
import re
import signal
import subprocess
import sys

import numpy
import pytest

from bench import hostile
from nanobert.formats import safetensors
from nanobert.formats.checkpoint import training_checkpoint_folder
from nanobert.model.config import BertConfig
from nanobert.model.limits import check_config_values
from nanobert.model.pretrained import check_state_dict
from nanobert.training import folder as out_folder
from nanobert.training.grid import rate_name, run_grid, run_name
from nanobert.training.resume import check_state_types
from nanobert.training.run import restore_dropout, seed_dropout

MEMORY_BOUND = 100e6       # bytes over the process's baseline (its --help)
SECONDS_BOUND = 3.0        # over the baseline: the target is 1 s, a shared machine is slower


def assert_one_line_refusal(result, *words):
    """Exit status 1, one line on stderr starting "error:" and naming `words`."""
    lines = [line for line in result["stderr"].splitlines() if line.strip()]
    assert result["exit"] == 1 and len(lines) == 1, \
        f"exit {result['exit']}, {len(lines)} stderr lines:\n{result['stderr'][-3000:]}"
    assert lines[0].startswith("error: ") and "Traceback" not in result["stderr"], lines[0]
    for word in words:
        assert word in lines[0], f"{word!r} not named in: {lines[0]}"
    return lines[0]


def assert_bounded(result):
    assert result["over_peak"] <= MEMORY_BOUND, \
        f"peak {result['peak'] / 1e6:.0f} MB, {result['over_peak'] / 1e6:.0f} MB over --help"
    assert result["over_seconds"] <= SECONDS_BOUND, \
        f"{result['seconds']:.1f} s, {result['over_seconds']:.1f} s over --help"


# case -> what the one line must name
LOADER_CASES = {
    "header-1gib": ("model.safetensors", "header length 1,073,741,824"),
    "tensor-too-large": ("config.json", "bert.embeddings.word_embeddings.weight",
                         "(262144, 1024)"),
    "layers-1024": ("config.json", "missing (16352): ", "and 16347 more"),
    "layers-100000": ("config.json", "num_hidden_layers"),
    "layers-1000000": ("config.json", "num_hidden_layers"),
    "fifo": ("model.safetensors", "FIFO"),
    "config-fifo": ("config.json", "FIFO"),
    "model-dev-zero": ("model.safetensors", "character device"),
    "dropout-string": ("config.json", "hidden_dropout_prob", "'0.1'"),
    "eps-string": ("config.json", "layer_norm_eps"),
    "init-range-null": ("config.json", "initializer_range", "None"),
    "beyond-memory": ("config.json", "parameters", "available"),
    "config-sparse-1gib": ("config.json", "1,073,741,824 bytes, more than the"),
    "vocab-sparse-1gib": ("vocab.txt", "1,073,741,824 bytes, more than the"),
    "config-nested": ("config.json", "nested too deeply"),
    "tokenizer-config-array": ("tokenizer_config.json", "list"),
    "tokenizer-config-torn": ("tokenizer_config.json", "not valid JSON"),
    "tokenizer-config-types": ("tokenizer_config.json", "do_lower_case", "'no'"),
}


@pytest.mark.parametrize("case", LOADER_CASES)
def test_a_hostile_model_folder_is_refused_in_one_line_in_bounded_memory_and_time(tmp_path,
                                                                                   case):
    result = hostile.measure(case, str(tmp_path), timeout=30)
    assert result["exit"] != "timeout", f"{case}: still running after 30 s"
    assert_one_line_refusal(result, *LOADER_CASES[case])
    assert_bounded(result)


@pytest.mark.parametrize("case", ["hidden-1e9-train", "hidden-1e9-from-scratch"])
def test_a_config_too_large_to_allocate_is_one_line_naming_the_key(tmp_path, case):
    result = hostile.measure(case, str(tmp_path), timeout=120)
    assert_one_line_refusal(result, "config.json", "hidden_size")
    assert result["over_peak"] <= MEMORY_BOUND, result["over_peak"]


def test_a_trainer_state_of_the_wrong_type_is_one_line_naming_file_and_key(tmp_path):
    result = hostile.measure("trainer-state-step-string", str(tmp_path), timeout=120)
    assert_one_line_refusal(result, "trainer_state.json", "step must be an integer", "'2'")


def test_a_checkpoints_optimizer_state_is_bounded_by_the_config_too(tmp_path):
    result = hostile.measure("optimizer-header-1gib", str(tmp_path), timeout=120)
    assert_one_line_refusal(result, "optimizer.safetensors", "header length 1,073,741,824")
    assert_bounded(result)


@pytest.mark.parametrize("case", ["finetune-out-on-source", "init-from-out",
                                  "out-on-other-run"])
def test_an_out_holding_a_model_or_another_run_is_refused_and_nothing_is_lost(tmp_path, case):
    result = hostile.measure(case, str(tmp_path), timeout=120)
    assert_one_line_refusal(result, "--out")
    assert result["kept"], f"{case}: a file of the earlier run changed or went"
    assert result["over_seconds"] <= SECONDS_BOUND, result["over_seconds"]


def test_overwrite_replaces_an_earlier_run_and_resume_with_it_is_refused(tmp_path):
    out = hostile.pretrained_run(str(tmp_path))
    both = hostile.run_case(hostile.train_args(str(tmp_path), out, "--resume", "--overwrite"))
    assert_one_line_refusal(both, "--resume", "--overwrite")
    again = hostile.run_case(hostile.train_args(str(tmp_path), out, "--overwrite"))
    assert again["exit"] == 0, again["stderr"][-2000:]


def test_ctrl_c_while_preparing_the_data_is_one_line_saying_how_to_go_on(tmp_path):
    result = hostile.measure("interrupt-data", str(tmp_path), timeout=120)
    assert_one_line_refusal(result, "interrupted (Ctrl-C) while preparing the data",
                            "same command")


# ------------------------------------------------------------------- one run per folder


def test_a_second_process_on_a_running_folder_is_refused_naming_the_holder(tmp_path):
    result = hostile.measure("second-run", str(tmp_path), timeout=120)
    pid = result["note"].split()[-1]
    assert_one_line_refusal(result, "is in use by another run", f"pid {pid}", "started")
    assert result["kept"], "the first run did not survive the second's start"


def start(argv, output=subprocess.PIPE):
    script, *flags = argv
    return subprocess.Popen([sys.executable, os.path.join(hostile.HERE, script), *flags],
                            cwd=hostile.HERE, stdout=output, stderr=output, text=True,
                            env={**os.environ, "PYTHONPATH": hostile.HERE,
                                 "OMP_NUM_THREADS": "1"})


def test_two_fresh_runs_started_together_one_runs_and_one_is_refused(tmp_path):
    out = str(tmp_path / "run")
    argv = hostile.train_args(str(tmp_path), out)
    runs = [start(argv), start(argv)]
    errors = [p.communicate(timeout=300)[1] for p in runs]
    results = sorted((p.returncode, err) for p, err in zip(runs, errors))
    assert [code for code, _ in results] == [0, 1], results
    line = results[1][1].strip()
    assert len(line.splitlines()) == 1 and ("is in use by another run" in line
                                            or "holds an earlier run" in line), line
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        steps = [json.loads(line)["step"] for line in f]
    assert steps == [1, 2], f"metrics.jsonl of the run that ran: steps {steps}"


def test_kill_9_leaves_no_stale_lock_and_resume_just_works(tmp_path):
    out = str(tmp_path / "run")
    argv = hostile.train_args(str(tmp_path), out, "--steps", "100000", "--checkpoint-every", "1")
    first = start(argv, subprocess.DEVNULL)
    state = os.path.join(out, "checkpoint", "trainer_state.json")
    hostile.wait_for(lambda: os.path.exists(state) or first.poll() is not None, 300)
    first.send_signal(signal.SIGKILL)
    first.wait()
    checkpoint = training_checkpoint_folder(os.path.join(out, "checkpoint"))  # a cut swap done
    with open(os.path.join(checkpoint, "trainer_state.json"), encoding="utf-8") as f:
        step = json.load(f)["step"]
    resumed = hostile.run_case(argv[:] + ["--resume", "--stop-at-step", str(step + 1)],
                               timeout=300)
    assert resumed["exit"] == 0, resumed["stderr"][-2000:]
    assert f"resumed {out}/checkpoint at step {step}" in resumed["stdout"], resumed["stdout"]


def test_the_lock_is_released_when_main_returns_and_reentrant_in_one_process(tmp_path):
    folder = str(tmp_path)

    @out_folder.releases_output_folder
    def main():
        out_folder.lock_folder(folder)
        out_folder.lock_folder(folder)              # the same process again: nothing to do
        probe = subprocess.run([sys.executable, "-c", LOCK_PROBE, folder], capture_output=True,
                               text=True, env={**os.environ, "PYTHONPATH": hostile.HERE})
        return probe.stdout.strip()
    assert main().startswith(f"in use: {folder} is in use by another run (pid {os.getpid()}")
    probe = subprocess.run([sys.executable, "-c", LOCK_PROBE, folder], capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": hostile.HERE})
    assert probe.stdout.strip() == "free", probe.stdout + probe.stderr


def test_eval_into_a_folder_a_run_holds_is_refused_naming_the_holder(tmp_path):
    """finetune.py --do eval writes eval_results.json and predictions into --out: not while
    another process holds that folder."""
    out = str(tmp_path / "busy")
    os.makedirs(out)
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, out], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": hostile.HERE})
    try:
        assert holder.stdout.readline().strip() == "held"
        trained = str(tmp_path / "ft")
        argv = hostile.finetune_args(str(tmp_path), hostile.tiny_model(str(tmp_path / "m")),
                                     trained, "--lr", "1e-3")
        assert hostile.run_case(argv, timeout=120)["exit"] == 0
        result = hostile.run_case(["finetune.py", "--do", "eval", "--model", trained + "/best",
                                   "--dev", argv[argv.index("--dev") + 1], "--out", out],
                                  timeout=120)
    finally:
        holder.kill()
        holder.wait()
    assert_one_line_refusal(result, "is in use by another run", f"pid {holder.pid}")
    assert not os.path.exists(os.path.join(out, "eval_results.json"))


LOCK_HOLDER = """
import sys, time
from nanobert.training import folder
folder.lock_folder(sys.argv[1])
print("held", flush=True)
time.sleep(600)
"""


LOCK_PROBE = """
import sys
from nanobert.training import folder
try:
    folder.lock_folder(sys.argv[1])
    print("free")
except ValueError as e:
    print(f"in use: {e}")
"""


def test_the_model_a_run_reads_is_never_its_out_even_with_overwrite(tmp_path):
    source = tmp_path / "pretrain" / "checkpoint"
    source.mkdir(parents=True)
    with pytest.raises(ValueError, match="holds the model this run reads"):
        out_folder.check_output_folder(str(tmp_path / "pretrain"), [str(source)],
                                       overwrite=True)
    out_folder.check_output_folder(str(tmp_path / "elsewhere"), [str(source)])


# ------------------------------------------------------------------------------ the grid


def test_grid_rates_that_print_alike_get_folders_of_their_own():
    runs = [{"lr": 1e-4, "epochs": 3.0, "batch_size": 32},
            {"lr": 1.0001e-4, "epochs": 3.0, "batch_size": 32},
            {"lr": 1e-4, "epochs": 3.0000001, "batch_size": 32}]
    names = [run_name(run) for run in runs]
    assert len(set(names)) == 3, names
    assert [rate_name(lr) for lr in (3e-5, 1e-4, 1.5e-4, 2e-5)] == \
        ["3e-05", "1e-04", "1.5e-04", "2e-05"]           # the names folders had before


def test_grid_best_holds_the_winners_own_weights_by_hash(tmp_path):
    """Each run writes weights of its own; <out>/best must be the dev-best run's bytes."""
    written = {}

    def fine_tune(run, folder):
        best = os.path.join(folder, "best")
        os.makedirs(best, exist_ok=True)
        weights = numpy.full(4, run["lr"], dtype=numpy.float64)
        safetensors.save_file({"w": weights}, os.path.join(best, "model.safetensors"))
        written[run["lr"]] = digest(os.path.join(best, "model.safetensors"))
        dev = 0.9 if run["lr"] == 1e-4 else 0.5           # the first run wins
        return {"best": {"score": dev, "epoch": 1.0, "dev": {"accuracy": dev}},
                "train_minutes": 0.0}

    runs = [{"lr": lr, "epochs": 1.0, "batch_size": 8} for lr in (1e-4, 1.0001e-4)]
    rows, winner = run_grid(runs, str(tmp_path), fine_tune, "accuracy")
    assert winner["lr"] == 1e-4
    best = digest(tmp_path / "best" / "model.safetensors")
    assert best == written[1e-4], "<out>/best is not the winning run's weights"
    assert len({row["folder"] for row in rows}) == 2


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()

# ------------------------------------------------------------------------ in one process


def test_a_header_longer_than_the_bound_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "model.safetensors"
    safetensors.save_file({"w": numpy.zeros(3, numpy.float32)}, path)
    length = int.from_bytes(path.read_bytes()[:8], "little")
    with pytest.raises(ValueError, match=f"header length {length} bytes is more than the 16"):
        safetensors.read_entries(path, max_header_bytes=16)
    assert safetensors.read_entries(path, max_header_bytes=length)["w"].shape == (3,)


@pytest.mark.parametrize("changes, message", [
    ({"hidden_dropout_prob": "0.1"}, "hidden_dropout_prob must be a probability"),
    ({"attention_probs_dropout_prob": 1.0}, "attention_probs_dropout_prob must be a prob"),
    ({"classifier_dropout": -0.5}, "classifier_dropout must be a probability"),
    ({"layer_norm_eps": "1e-12"}, "layer_norm_eps must be a positive number"),
    ({"layer_norm_eps": float("nan")}, "layer_norm_eps must be a positive number"),
    ({"initializer_range": None}, "initializer_range must be a positive number"),
    ({"num_hidden_layers": 100_000}, r"num_hidden_layers 100000 is outside \[1, 1,024\]"),
    ({"hidden_size": 768.0}, r"hidden_size must be an integer, got 768.0 \(float\)"),
    ({"vocab_size": True}, "vocab_size must be an integer"),
    ({"hidden_size": 100, "num_attention_heads": 12}, "is not divisible"),
    ({"pad_token_id": 40, "vocab_size": 40}, "pad_token_id 40 is outside the vocab"),
    ({"hidden_act": ["gelu"]}, "hidden_act must be a string"),
])
def test_config_values_are_type_and_range_checked_naming_the_key(tmp_path, changes, message):
    with pytest.raises(ValueError, match=message):
        check_config_values(changes)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**hostile.TINY, "vocab_size": 41, **changes}))
    with pytest.raises(ValueError, match=re.escape(str(path)) + ": .*" + message):
        BertConfig.from_json_file(path)


def test_a_missing_tensor_error_names_a_few_and_the_count():
    expected = {f"t{i}": (2,) for i in range(1000)}
    with pytest.raises(ValueError) as info:
        check_state_dict(expected, {})
    message = str(info.value)
    assert "missing (1000): t0, t1, t10, t100, t101 and 995 more" in message, message
    assert len(message) < 200, len(message)


@pytest.mark.parametrize("state, message", [
    ({"step": "2"}, "step must be an integer >= 0, got '2'"),
    ({"total_steps": 0}, "total_steps must be an integer >= 1"),
    ({"train_seconds": float("nan")}, "train_seconds must be a number >= 0"),
    ({"best": [1]}, "best must be null or an object"),
    ({"best": {"score": "0.9"}}, "best.score must be a number, got '0.9'"),
    ({"loss_scaler": {"loss_scale": None, "clean_steps": 0}}, "loss_scaler.loss_scale"),
])
def test_a_trainer_state_of_the_wrong_types_names_the_file_and_key(state, message):
    with pytest.raises(ValueError, match=re.escape(f"trainer_state.json: {message}")):
        check_state_types(state, "trainer_state.json")
    check_state_types({"step": 2, "total_steps": 4, "best": None, "train_seconds": 1.5},
                      "trainer_state.json")


def test_a_dropout_state_edited_by_hand_is_one_value_error():
    from nanobert import BertConfig, BertForPreTraining
    model = BertForPreTraining(BertConfig(vocab_size=40, **hostile.TINY))
    seed_dropout(model, 0, 0)
    with pytest.raises(ValueError, match="trainer_state.json: dropout_rng is not a generator"):
        restore_dropout(model, {"bit_generator": "PCG64", "state": "x"}, 0, 1, 0)
