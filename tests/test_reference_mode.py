"""Reference mode (nanobert/model/active.py): the model on ops.py's functions, with the update
as its math (ReferenceAdamW, ops.clip_by_global_norm), proven equal to the fast layer as a whole,
as llm.c proves train_gpt2.cu equal to train_gpt2.c:

1. float64: five training steps (forward, backward, clipping, AdamW) of pretraining and of every
   task head, dropout on, padding, both AdamW flavours: losses, weights and AdamW's moments
   within 1e-12 of the fast run's, relative (the measured errors are recorded); float32 within
   a stated bound.
2. a traced reference step runs no function of the fast layer (fast, fast_cpu, fast_gpu,
   packing, threads, kernels, cublas, counter_rng); bench.reading_cost's figure at most 800
   lines.
3. evaluation (the model called in eval mode: the one forward with cache=False) runs ops.py
   too, and equals the fast layer's no-cache paths.
4. the switch: NANOBERT_REFERENCE=1, and refusals for the GPU and float16.
"""
import contextlib
import os
import subprocess
import sys

import numpy
import pytest

from bench import reading_cost
from nanobert import BertForPreTraining
from nanobert.model import active, ops, special
from nanobert.model.heads import (BertForMultipleChoice, BertForQuestionAnswering,
                                  BertForSequenceClassification, BertForTokenClassification)
from nanobert.model.optim import AdamW, ReferenceAdamW, clip_by_global_norm, learning_rate
from nanobert.testing import make_batch, tiny_bert_config
from conftest import record, vanishes

pytestmark = pytest.mark.learner           # the learner's quick tier (README)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 5
FLOAT64_TOL = 1e-12
FLOAT32_TOL = 5e-5          # measured <= 3.6e-6 (AdamW's m after 5 steps)

# task -> (model class, config options, the conftest.vanishes name of the task)
TASKS = {
    "pretraining": (BertForPreTraining, {}, "pretraining"),
    "sequence_classification": (BertForSequenceClassification, {"num_labels": 3}, "classify"),
    "regression": (BertForSequenceClassification, {"num_labels": 1}, "regress"),
    "multi_label": (BertForSequenceClassification,
                    {"num_labels": 3, "problem_type": "multi_label_classification"}, "multi"),
    "token_classification": (BertForTokenClassification, {"num_labels": 3}, "tag"),
    "question_answering": (BertForQuestionAnswering, {}, "qa"),
    "multiple_choice": (BertForMultipleChoice, {}, "choice"),
}


@contextlib.contextmanager
def reference_mode(on=True):
    """The switch set inside, given back after."""
    was = active.reference_ops()
    active.use_reference_ops(on)
    try:
        yield
    finally:
        active.use_reference_ops(was)


# The fast layer's two ways to run a padded batch: packed (packing.py, where the loss reads no
# padded position), which draws its dropout masks over the attended tokens only, so it is
# compared without dropout; and padded, as the reference runs it, with dropout on.
VARIANTS = {"packed, no dropout": (True, 0.0), "padded, dropout": (False, 0.1)}


def train(task, reference, dtype, mode="bert", steps=STEPS, seed=0,
          variant="padded, dropout"):
    """`steps` steps of loss_and_grads + clip + AdamW on one tiny model in the chosen mode ->
    (losses, model, optimizer). The same batch, the same dropout generator's seed."""
    cls, options, _ = TASKS[task]
    packs, dropout = VARIANTS[variant]
    config = tiny_bert_config(vocab_size=11, layers=2, heads=2, head_size=3, dropout=dropout,
                              classifier_dropout=2 * dropout, intermediate_size=7,
                              max_position_embeddings=8, **options)
    batch = make_batch(numpy.random.default_rng(seed), config, task, 3, 6)
    with reference_mode(reference):
        model = cls(config, seed=seed, dtype=dtype).train()
        model.packs = packs
        model.rng = numpy.random.default_rng(seed + 7)
        optimizer = AdamW(model.params, lr=1e-2, mode=mode)
        assert isinstance(optimizer, ReferenceAdamW) == reference
        losses = []
        for step in range(steps):
            loss, grads = model.loss_and_grads(batch)
            clip_by_global_norm(grads, 0.5, mode=mode)      # 0.5: tiny models do clip
            optimizer.step(grads, lr=learning_rate(step, 1e-2, 1, steps))
            losses.append(float(loss))
    return losses, model, optimizer


NOISE_TOL = 1e-9    # absolute, for the tensors whose exact gradient is 0 (measured 2.5e-11)


def worst_difference(fast, reference, task, config):
    """-> (max over the tensors of max |fast - reference| / max |reference|, the largest
    absolute difference of a tensor whose exact gradient is 0 (conftest.vanishes)). The
    second is rounding noise on both sides: its gradient is ~1e-18, which Adam divides by
    sqrt(v) + eps ~ 1e-8 ("torch") into steps of ~1e-11, different in each run."""
    worst, noise = 0.0, 0.0
    for name, r in reference.items():
        difference = float(numpy.abs(fast[name] - r).max())
        if vanishes(task, name, config):
            noise = max(noise, difference)
        else:
            worst = max(worst, difference / max(float(numpy.abs(r).max()), 1e-300))
    return worst, noise


def compare_runs(task, dtype, mode, variant="padded, dropout"):
    """The fast and the reference run -> {what: worst relative difference}."""
    fast_losses, fast_model, fast_opt = train(task, False, dtype, mode, variant=variant)
    ref_losses, ref_model, ref_opt = train(task, True, dtype, mode, variant=variant)
    tag = TASKS[task][2]
    config = ref_model.config
    losses = numpy.abs(numpy.array(fast_losses) - ref_losses) / numpy.abs(ref_losses).max()
    errors, noise = {"loss": float(losses.max())}, 0.0
    for what, f, r in (("weights", fast_model.params, ref_model.params),
                       ("adam m", fast_opt.m, ref_opt.m), ("adam v", fast_opt.v, ref_opt.v)):
        errors[what], tensor_noise = worst_difference(f, r, tag, config)
        noise = max(noise, tensor_noise)
    return errors, noise


# ------------------------------------------------------------- 1. equal as a whole


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("mode", ["bert", "torch"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_five_float64_steps_in_reference_mode_equal_the_fast_layer(task, mode, variant):
    """float64, padding: losses, weights and AdamW state after five steps."""
    errors, noise = compare_runs(task, numpy.float64, mode, variant)
    for what, err in errors.items():
        record(f"reference vs fast, 5 float64 steps, {what}", err)
        assert err <= FLOAT64_TOL, (f"{task} ({mode}, {variant}) {what}: relative difference "
                                    f"{err:.3e}")
    record("reference vs fast, 5 float64 steps, zero-gradient tensors (absolute)", noise)
    assert noise <= NOISE_TOL


@pytest.mark.parametrize("task", ["pretraining", "sequence_classification"])
def test_five_float32_steps_in_reference_mode_are_within_float32_rounding(task):
    """float32: the fast layer's erf is another approximation (fast_cpu.erf_float32) and its
    sums run in another order, so the runs agree to float32 rounding, amplified by five
    steps of Adam (whose update m / sqrt(v) rescales small gradient differences)."""
    errors, _ = compare_runs(task, numpy.float32, "bert")
    for what, err in errors.items():
        record(f"reference vs fast, 5 float32 steps, {what}", err)
        assert err <= FLOAT32_TOL, f"{task} {what}: relative difference {err:.3e}"


def test_the_reference_update_is_the_fast_update_bitwise():
    """One AdamW step from the same gradients, both flavours, weight decay on some tensors:
    ReferenceAdamW (ops.adamw_update, a loop) and AdamW's chunked, threaded sweep write the
    same bits in "bert" mode (the same operations in the same order)."""
    _, model, _ = train("pretraining", False, numpy.float64, steps=1)
    grads = {n: numpy.random.default_rng(1).standard_normal(p.shape) for n, p in
             model.params.items()}
    results = []
    for reference in (False, True):
        params = {n: p.copy() for n, p in model.params.items()}
        with reference_mode(reference):
            optimizer = AdamW(params, lr=1e-3, mode="bert")
            for _ in range(3):
                optimizer.step(grads)
        results.append(params)
    for name in results[0]:
        assert numpy.array_equal(results[0][name], results[1][name]), name


def test_the_reference_clip_equals_the_fast_clip():
    grads = {f"g{i}": numpy.random.default_rng(i).standard_normal(7 * i + 1) for i in range(4)}
    expected = {n: g.copy() for n, g in grads.items()}
    norm = ops.clip_by_global_norm(grads, 1.0)
    fast_norm = clip_by_global_norm(expected, 1.0)
    assert abs(norm - fast_norm) <= 1e-15 * fast_norm
    assert norm > 1.0                                   # so it clipped
    for name, g in grads.items():
        numpy.testing.assert_allclose(g, expected[name], rtol=1e-15)
        assert numpy.sqrt(sum((g * g).sum() for g in grads.values())) == pytest.approx(1.0)


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32])
def test_ops_erf_is_the_fast_layers_erf_bitwise(dtype):
    """ops.erf (the two formulas, each evaluated everywhere) and special.erf (in blocks, each
    formula on its own elements): the same bits, also at 0, -0, +-1, the clamp, inf and NaN."""
    x = numpy.random.default_rng(0).standard_normal(20000) * numpy.repeat([0.3, 2.0, 30.0], 7000)[
        :20000]
    x = numpy.concatenate([x, [0.0, -0.0, 1.0, -1.0, 6.0, 4.0, numpy.inf, -numpy.inf, numpy.nan,
                               numpy.nextafter(1.0, 0.0)]]).astype(dtype)
    bits = numpy.uint64 if dtype == numpy.float64 else numpy.uint32
    assert numpy.array_equal(ops.erf(x).view(bits), special.erf(x).view(bits))

# ------------------------------------------------------- 2. what a reference step runs


FAST_FILES = ("fast.py", "fast_cpu.py", "fast_gpu.py", "packing.py", "threads.py", "kernels.py",
              "cublas.py", "counter_rng.py")


def test_a_reference_step_runs_no_function_of_the_fast_layer():
    """Traced (sys.setprofile, threads too): one reference pretraining step with padding and
    dropout calls ops.py's ops and nothing of the fast layer; the fast step does call it (so
    the trace would see it)."""
    reference = reading_cost.executed_functions(reference=True)
    fast_ran = [f for f in reference if os.path.basename(f[0]) in FAST_FILES]
    assert not fast_ran, f"reference mode ran the fast layer: {fast_ran[:5]}"
    ran = {name for path, _, name, _ in reference if path.endswith("model/ops.py")}
    assert {"self_attention_forward", "self_attention_backward", "layernorm_backward",
            "cross_entropy_backward", "erf", "adamw_update", "clip_by_global_norm"} <= ran
    fast = reading_cost.executed_functions(reference=False)
    assert {"fast_cpu.py", "packing.py", "threads.py"} <= {os.path.basename(f[0]) for f in fast}


def test_the_reference_step_reads_at_most_800_lines():
    """The reading cost (bench.reading_cost): the issue's target, held."""
    files = reading_cost.per_file(reading_cost.executed_functions(reference=True))
    total = sum(lines for _, lines in files.values())
    record("reference step's reading cost (lines)", total)
    assert total <= 800, f"{total} lines: {files}"

# ---------------------------------------------------------------- 3. evaluation too


def test_evaluation_in_reference_mode_runs_ops_and_equals_the_fast_layer():
    """model(...) in eval mode: the one forward with cache=False, on the fast layer's no-cache
    paths or on ops.py in reference mode. Logits and hidden states agree to 1e-12 (float64)."""
    config = tiny_bert_config(vocab_size=11, layers=2, heads=2, head_size=3, intermediate_size=7,
                              max_position_embeddings=8, num_labels=3)
    batch = make_batch(numpy.random.default_rng(3), config, "sequence_classification", 3, 6)
    inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    outputs = []
    for reference in (False, True):
        with reference_mode(reference):
            model = BertForSequenceClassification(config, seed=1, dtype=numpy.float64).eval()
            if reference:
                codes = reading_cost.trace(lambda: outputs.append(model(**inputs)))
            else:
                outputs.append(model(**inputs))
    ran = {os.path.basename(c.co_filename) for c in codes}
    assert "ops.py" in ran and not ran & set(FAST_FILES), ran
    fast, reference = outputs
    mask = inputs["attention_mask"] == 1
    err = numpy.abs(fast.logits - reference.logits).max() / numpy.abs(reference.logits).max()
    record("reference vs fast inference, logits", err)
    assert err <= 1e-12
    for f, r in zip(fast.hidden_states, reference.hidden_states):
        assert numpy.abs(f[mask] - r[mask]).max() <= 1e-12 * numpy.abs(r).max()

# ----------------------------------------------------------------------- 4. the switch


def test_the_environment_variable_turns_reference_mode_on():
    code = ("from nanobert.model import active; from nanobert import AdamW, BertConfig, "
            "BertForPreTraining; m = BertForPreTraining(BertConfig(vocab_size=10, hidden_size=4, "
            "num_hidden_layers=1, num_attention_heads=1, intermediate_size=4)); "
            "print(active.reference_ops(), type(AdamW(m.params)).__name__)")
    for value, expected in (("1", "True ReferenceAdamW"), ("0", "False AdamW")):
        env = {**os.environ, "NANOBERT_REFERENCE": value}
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, text=True,
                             capture_output=True, check=True).stdout.strip()
        assert out == expected


@pytest.mark.parametrize("made_in", [False, True], ids=["fast", "reference"])
def test_a_switch_after_adamw_is_refused_at_its_step_not_half_applied(made_in):
    """AdamW(...) picks its update when it is made (AdamW or ReferenceAdamW); switching the
    mode after it would run the model on one layer and the update on the other: its step
    refuses, saying what to do, and changes nothing. The `model:` line says the mode."""
    params = {"w": numpy.ones(3)}
    with reference_mode(made_in):
        optimizer = AdamW(params, lr=0.1)
        assert active.describe() == ("reference mode (ops.py)" if made_in
                                     else "fast layer (fast.py)")
    with reference_mode(not made_in):
        with pytest.raises(RuntimeError, match=r"active.use_reference_ops\(\) switched the "
                                               r"mode after AdamW\(...\) was made.*call it "
                                               r"before AdamW\(...\)"):
            optimizer.step({"w": numpy.ones(3)})
    assert (params["w"] == 1).all() and optimizer.step_count == 0
    with reference_mode(made_in):
        optimizer.step({"w": numpy.ones(3)})                # its own mode: it steps
    assert (params["w"] < 1).all()


@pytest.mark.parametrize("device,dtype", [("gpu", "float32"), ("cpu", "float16")])
def test_reference_mode_refuses_the_gpu_and_float16_in_one_line(device, dtype):
    with reference_mode(), pytest.raises(ValueError, match="reference mode .* runs ops.py on "
                                                            "the CPU in float32 or float64"):
        active.check_reference_mode(device, dtype)
    active.check_reference_mode(device, dtype)              # the fast layer takes both
    with reference_mode(), pytest.raises(ValueError, match="reference mode"):
        BertForPreTraining(tiny_bert_config(), dtype=numpy.float16)


@pytest.mark.parametrize("argv,refused", [
    (["--reference-ops", "--device", "gpu"], "on gpu in float32"),
    (["--reference-ops", "--dtype", "float16"], "on cpu in float16"),
    (["--reference-ops", "--dtype", "float64"], None)])
def test_both_command_lines_switch_reference_mode_on_or_refuse_in_one_line(argv, refused):
    """train.py and finetune.py: --reference-ops turns the switch on at start-up
    (training/run.setup_device), before any data work; a GPU or float16 is one line."""
    import finetune
    import train
    from nanobert.training.run import setup_device
    for command in (train, finetune):
        args = command.parse_args(argv)
        with reference_mode(False):
            if refused:
                with pytest.raises(SystemExit, match=f"error: reference mode .*{refused}"):
                    setup_device(args)
            else:
                setup_device(args)
                assert active.reference_ops() and args.reference_ops


def test_the_commands_without_a_dtype_flag_start_in_reference_mode():
    """fill_mask, attention and features take no --dtype: float32, allowed."""
    import argparse
    from nanobert.training.run import setup_device
    with reference_mode():
        setup_device(argparse.Namespace(device="cpu", no_tf32=True))
