"""The fine-tuning heads (sequence classification / regression / multi-label, token
classification, question answering, multiple choice), held to the same proof as the core:

1. float64 central differences of each head's loss w.r.t. every parameter tensor, on tiny
   BERTs whose shapes, padding, labels and dropout hypothesis draws;
2. parity with the transformers class of the same name on a committed reference fixture
   (loss, logits, every gradient; float64 and float32) and on one regenerated live;
3. checkpoints: loading the encoder from any BERT checkpoint (fresh heads reported), head
   size mismatches, and the round trip through transformers in both directions (live);
4. bad batches and configs fail with a ValueError that names the value.
"""
import json
import pathlib

import numpy
import pytest
from hypothesis import assume, example, given, settings, strategies as st

from nanobert import BertConfig, BertForPreTraining, BertModel
from nanobert.model import heads
from nanobert.model.bert import BertPreTrainedModel
from nanobert.formats import safetensors
from nanobert.model.config import num_labels, with_labels
from nanobert.model.heads import (BertForMultipleChoice, BertForQuestionAnswering,
                                  BertForSequenceClassification, BertForTokenClassification)
from nanobert.testing import bert_cases, check_model_gradients, make_batch, tiny_bert_config
from conftest import assert_close, attended, record, record_errors, reference_fixture, vanishes

# ------------------------------------------------------------- 1. central differences

GRAD_TOL = 1e-7
ENTRIES_PER_TENSOR = 4      # random entries of each tensor checked (all entries when fewer)

SHAPES = dict(heads=(1, 2), head_size=(2, 3), layers=(1, 2), classifier_dropout=[None, 0.0, 0.3])
seeds = st.integers(0, 2**31 - 1)
EDGE = dict(batch=1, seq_len=1, heads=1, head_size=3, layers=1, hidden_act="gelu", dropout=0.0,
            classifier_dropout=None)                       # T = 1, B = 1, no dropout
BUSY = dict(batch=3, seq_len=5, heads=2, head_size=2, layers=2, hidden_act="gelu", dropout=0.1,
            classifier_dropout=0.3)                        # everything on


def cases(task, **config):
    """(config, batch) pairs for `task`, drawn by nanobert.testing.bert_cases."""
    return bert_cases(task, **SHAPES, **config)


def case(task, batch, seq_len, choices=2, seed=0, **config):
    """One explicit (config, batch) pair, for @example."""
    config = tiny_bert_config(**config)
    rng = numpy.random.default_rng(seed)
    return config, make_batch(rng, config, task, batch, seq_len, choices)


def check_head_gradients(cls, case, seed, check):
    """Every parameter tensor of a perturbed `cls`: nanobert.testing.check_model_gradients
    (five-point central differences of the loss, dropout masks replayed). Draws whose loss is
    flat are skipped: every label ignored, or multiple-choice inputs whose choices pool to the
    same vector (equal scores, gradients cancel to ~1e-17; hypothesis found seed=130, B=1,
    T=2, 2 choices)."""
    config, batch = case
    model = cls(config, seed=seed, dtype=numpy.float64).train()
    rng = numpy.random.default_rng(seed)
    for p in model.params.values():                  # move away from LN = 1 / bias = 0
        p += 0.1 * rng.standard_normal(p.shape)
    errors = check_model_gradients(model, batch, entries=ENTRIES_PER_TENSOR, tol=GRAD_TOL,
                                   if_flat="skip")
    assume(errors)
    record_errors(f"grad {check}, every parameter", errors)
    # transformers never updates the [PAD] row of the word embeddings (padding_idx), so its
    # gradient is 0 by definition, not d loss / d row (the checker skips that row): check that.
    pad = model.config.pad_token_id
    _, grads = model.loss_and_grads(batch)
    assert not grads["bert.embeddings.word_embeddings.weight"][pad].any()


@settings(max_examples=6, deadline=None)
@given(seed=seeds, case=cases("sequence_classification", num_labels=(2, 4)))
@example(seed=0, case=case("sequence_classification", **EDGE))
@example(seed=1, case=case("sequence_classification", **BUSY, num_labels=3))
def test_sequence_classification_gradients_match_central_differences(seed, case):
    """Cross-entropy on the pooled [CLS]; a -100 label is ignored."""
    check_head_gradients(BertForSequenceClassification, case, seed, "sequence classification (CE)")


@settings(max_examples=5, deadline=None)
@given(seed=seeds, case=st.one_of(
    cases("regression", num_labels=1),
    cases("regression", num_labels=2, problem_type="regression")))
@example(seed=0, case=case("regression", **EDGE, num_labels=1))
def test_regression_gradients_match_central_differences(seed, case):
    """MSE: num_labels == 1 (logits squeezed to [B]), or problem_type "regression" with
    num_labels = 2 (MSE over [B, 2])."""
    check_head_gradients(BertForSequenceClassification, case, seed, "sequence regression (MSE)")


@settings(max_examples=4, deadline=None)
@given(seed=seeds, case=cases("multi_label", num_labels=(1, 3),
                              problem_type="multi_label_classification"))
def test_multi_label_gradients_match_central_differences(seed, case):
    """Declared multi-label, labels [B, C] in [0, 1] -> mean binary cross-entropy with logits
    (one label too: a task of one tag is still multi-label, not regression)."""
    check_head_gradients(BertForSequenceClassification, case, seed, "sequence multi-label (BCE)")


@settings(max_examples=6, deadline=None)
@given(seed=seeds, case=cases("token_classification", num_labels=(2, 4)))
@example(seed=0, case=case("token_classification", **EDGE))
@example(seed=1, case=case("token_classification", **BUSY, num_labels=4))
def test_token_classification_gradients_match_central_differences(seed, case):
    """Cross-entropy at every position whose label is not -100 (padding, continuation pieces)."""
    check_head_gradients(BertForTokenClassification, case, seed, "token classification")


@settings(max_examples=6, deadline=None)
@given(seed=seeds, case=cases("question_answering"))
@example(seed=0, case=case("question_answering", **EDGE))
@example(seed=1, case=case("question_answering", **BUSY))
def test_question_answering_gradients_match_central_differences(seed, case):
    """(start CE + end CE) / 2, positions drawn from [-2, T + 2): clamped to [0, T], T ignored."""
    check_head_gradients(BertForQuestionAnswering, case, seed, "question answering")


@settings(max_examples=5, deadline=None)
@given(seed=seeds, case=cases("multiple_choice"))
@example(seed=0, case=case("multiple_choice", **EDGE, choices=2))
def test_multiple_choice_gradients_match_central_differences(seed, case):
    """Inputs [B, C, T]; one score per choice from the pooled [CLS]; CE over the choices."""
    check_head_gradients(BertForMultipleChoice, case, seed, "multiple choice")

# ------------------------------------------------------------------- 2. reference parity

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "finetuning_float64.npz"
TOL = {numpy.float64: 1e-10, numpy.float32: 1e-4}
TASKS = {"seq_cls": BertForSequenceClassification, "regression": BertForSequenceClassification,
         "multi_label": BertForSequenceClassification, "token_cls": BertForTokenClassification,
         "qa": BertForQuestionAnswering, "choice": BertForMultipleChoice}
BATCH_KEYS = ("input_ids", "token_type_ids", "attention_mask", "labels", "start_positions",
              "end_positions")


@pytest.fixture(scope="module", params=["committed", "live"])
def ref(request):
    return reference_fixture(request.param, FIXTURE, "reference.finetuning")


def task_ref(ref, task):
    return {k[len(task) + 1:]: v for k, v in ref.items() if k.startswith(task + "/")}


def load_model(r, task, dtype, declared=True):
    """The fixture's model. Its config.json was saved before transformers' first forward, so
    it has no problem_type; transformers then guessed multi-label from the float labels, which
    nanobert never does: the multi-label task declares it, as a user would (declared=True)."""
    config = BertConfig.from_dict(json.loads(str(r["config_json"])))
    if task == "multi_label" and declared:
        config = with_labels(config, problem_type="multi_label_classification")
    params = {k[len("param/"):]: v for k, v in r.items() if k.startswith("param/")}
    return TASKS[task](config, dtype=dtype, params=params).eval()


def logit_keys(task):
    return ("start_logits", "end_logits") if task == "qa" else ("logits",)


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32])
@pytest.mark.parametrize("task", list(TASKS))
def test_loss_logits_and_every_gradient_match_transformers(ref, task, dtype):
    r = task_ref(ref, task)
    model = load_model(r, task, dtype)
    batch = {k: r[k] for k in BATCH_KEYS if k in r}
    loss, grads, out = model.loss_and_grads(batch, return_outputs=True)
    tol, tag = TOL[dtype], f"{numpy.dtype(dtype).name} {task}"
    assert_close(loss, r["loss"], tol, f"reference {tag} loss")
    called = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    for key in logit_keys(task):
        ours, called_ours, theirs = out[key], getattr(called, key), r[key]
        if task == "token_cls":             # packed: a padded position's logits are head(0)
            ours, called_ours, theirs = (attended(a, batch["attention_mask"])
                                         for a in (ours, called_ours, theirs))
        assert_close(ours, theirs, tol, f"reference {tag} logits")
        assert_close(called_ours, theirs, tol, f"reference {tag} logits")
    assert set(grads) == {k[len("grad/"):] for k in r if k.startswith("grad/")}
    largest = max(numpy.abs(r["grad/" + name]).max() for name in grads)
    for name, g in grads.items():
        expected = r["grad/" + name]
        if vanishes(task, name, model.config):
            err = record(f"reference {tag} vanishing gradients / largest",
                         float(numpy.abs(g - expected).max() / largest))
            assert err <= tol, f"{name}: error {err:.2e} relative to the largest gradient"
            continue
        assert_close(g, expected, tol, f"reference {tag} gradients")


def test_an_undeclared_problem_type_is_decided_when_the_model_is_built():
    """The fixture's configs declare no problem_type. The model decides when it is built, not
    from a batch: num_labels 1 -> regression, more -> single-label, kept in its config; the
    multi-label fixture's float labels then do not fit and are refused, naming the type."""
    ref = reference_fixture("committed", FIXTURE, "reference.finetuning")
    for task, kind in (("seq_cls", "single_label_classification"), ("regression", "regression"),
                       ("multi_label", "single_label_classification")):
        r = task_ref(ref, task)
        assert BertConfig.from_dict(json.loads(str(r["config_json"]))).problem_type is None
        model = load_model(r, task, numpy.float64, declared=False)
        assert model.problem_type == model.config.problem_type == kind
        batch = {k: r[k] for k in BATCH_KEYS if k in r}
        if task == "multi_label":
            with pytest.raises(ValueError, match=r"^batch: labels float64 \(4, 3\) do not fit the "
                                                 r"model's problem_type 'single_label_class"):
                model.loss(batch)
            continue
        _, _, out = model.loss_and_grads(batch, return_outputs=True)
        assert out["problem_type"] == kind


def test_question_answering_counts_clamped_and_ignored_positions():
    r = task_ref(reference_fixture("committed", FIXTURE, "reference.finetuning"), "qa")
    model = load_model(r, "qa", numpy.float64)
    _, _, out = model.loss_and_grads({k: r[k] for k in BATCH_KEYS if k in r}, return_outputs=True)
    # start [5, 1, T + 3, -1], end [7, T, 0, 2]: T and beyond are ignored, -1 becomes 0
    assert (out["start_positions_ignored"], out["start_positions_clamped_to_0"]) == (1, 1)
    assert (out["end_positions_ignored"], out["end_positions_clamped_to_0"]) == (1, 0)

# ---------------------------------------------------------------------- 3. checkpoints

CONFIG = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
              intermediate_size=24, max_position_embeddings=20)


def tiny_inputs(seed=0, B=3, T=7, choices=None):
    rng = numpy.random.default_rng(seed)
    shape = (B, T) if choices is None else (B, choices, T)
    mask = numpy.ones(shape, dtype=numpy.int64)
    mask[1, ..., 4:] = 0
    types = numpy.zeros(shape, dtype=numpy.int64)
    types[..., 3:] = 1
    return {"input_ids": rng.integers(5, CONFIG["vocab_size"], size=shape), "token_type_ids": types,
            "attention_mask": mask}


def perturbed(model, seed=0, scale=0.05):
    rng = numpy.random.default_rng(seed)
    for p in model.params.values():
        p += (scale * rng.standard_normal(p.shape)).astype(p.dtype)
    return model.eval()


def logits_of(out):
    return (numpy.stack([out.start_logits, out.end_logits]) if hasattr(out, "start_logits")
            else out.logits)


def comparable(cls, logits, inputs):
    """Per-position logits where packing leaves them equal to transformers' (the attended
    positions); any other logits as they are."""
    if cls is BertForTokenClassification:
        return attended(logits, inputs["attention_mask"])
    return logits


def call(model, inputs):
    return model(inputs["input_ids"], inputs["token_type_ids"], inputs["attention_mask"])


def test_num_labels_reads_id2label_and_defaults_to_two():
    config = BertConfig(**CONFIG)
    assert num_labels(config) == 2
    assert num_labels(with_labels(config, num_labels=5)) == 5
    named = with_labels(config, id2label={0: "O", 1: "B-PER", 2: "I-PER"})
    # config.json's string keys
    assert named.extra["id2label"] == {"0": "O", "1": "B-PER", "2": "I-PER"}
    assert named.extra["label2id"] == {"O": 0, "B-PER": 1, "I-PER": 2}
    assert num_labels(BertConfig.from_dict({**CONFIG,
                                            "id2label": {"0": "a", "1": "b", "2": "c"}})) == 3
    assert num_labels(BertConfig.from_dict({**CONFIG, "num_labels": 4})) == 4
    # names kept
    assert with_labels(named, num_labels=3).extra["id2label"] == named.extra["id2label"]
    with pytest.raises(ValueError, match="num_labels=4 but its id2label has 3"):
        num_labels(BertConfig.from_dict({**CONFIG, "num_labels": 4,
                                         "id2label": {"0": "a", "1": "b", "2": "c"}}))
    with pytest.raises(ValueError, match=r"id2label keys must be exactly 0..1, got \[0, 2\]"):
        with_labels(config, id2label={0: "a", 2: "b"})
    with pytest.raises(ValueError, match="num_labels must be a positive integer, got 0"):
        with_labels(config, num_labels=0)
    with pytest.raises(ValueError, match="problem_type must be one of"):
        with_labels(config, problem_type="ranking")
    with pytest.raises(ValueError, match="needs num_labels == 2"):
        BertForQuestionAnswering(with_labels(config, num_labels=3))


@pytest.mark.parametrize("cls", heads.TASK_HEADS)
def test_save_then_load_is_exact_with_labels_in_config_json(tmp_path, cls):
    config = with_labels(BertConfig(**CONFIG), id2label=["neg", "pos"])
    model = cls(config, seed=3, dtype=numpy.float64)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == [cls.__name__]
    assert (saved["id2label"] == {"0": "neg", "1": "pos"}
            and saved["label2id"] == {"neg": 0, "pos": 1})
    again = cls.from_pretrained(tmp_path, dtype=numpy.float64)
    assert set(again.params) == set(model.params) == set(cls.param_shapes(config))
    for name, p in model.params.items():
        numpy.testing.assert_array_equal(again.params[name], p, err_msg=name)
    # HF: no pooler for tokens / QA
    assert ("bert.pooler.dense.weight" in model.params) == cls.uses_pooler


@pytest.mark.parametrize("cls", heads.TASK_HEADS)
def test_encoder_loads_from_a_pretraining_checkpoint_and_a_fresh_head_is_reported(tmp_path, cls,
                                                                                  capsys):
    pretrained = BertForPreTraining(BertConfig(**CONFIG), seed=4, dtype=numpy.float64)
    pretrained.save_pretrained(tmp_path)
    capsys.readouterr()
    model = cls.from_pretrained(tmp_path, dtype=numpy.float64)
    printed = capsys.readouterr().out
    head = sorted(cls.head_shapes(model.config))
    assert f"newly initialized: {head}" in printed, printed
    assert "were not used when initializing" in printed and "cls.seq_relationship.weight" in printed
    for name, p in model.params.items():
        if name.startswith("bert."):
            numpy.testing.assert_array_equal(p, pretrained.params[name], err_msg=name)
        elif name.endswith("weight"):
            # truncated normal(0.02): nothing beyond two standard deviations
            assert 0 < numpy.abs(p).max() <= 2 * 0.02 and abs(p.std() - 0.02) < 0.01, name
        else:
            assert not p.any(), name                                                        # bias 0


def test_bare_encoder_checkpoint_without_prefix_feeds_every_head(tmp_path, capsys):
    encoder = BertModel(BertConfig(**CONFIG), seed=5)
    encoder.save_pretrained(tmp_path)                   # no `bert.` prefix, with a pooler
    capsys.readouterr()
    tokens = BertForTokenClassification.from_pretrained(tmp_path, num_labels=7)
    printed = capsys.readouterr().out
    assert "not used when initializing BertForTokenClassification: ['bert.pooler.dense.bias', " \
           "'bert.pooler.dense.weight']" in printed, printed
    assert tokens.params["classifier.weight"].shape == (7, 16) and tokens.num_labels == 7
    inputs = tiny_inputs()
    numpy.testing.assert_array_equal(call(tokens, inputs).hidden_states[-1],
                                     call(encoder.eval(), inputs).last_hidden_state)
    # and the other way: a checkpoint without a pooler, loaded by a class that needs one
    tokens.save_pretrained(tmp_path / "tokens")
    capsys.readouterr()
    BertForSequenceClassification.from_pretrained(tmp_path / "tokens", num_labels=7)
    printed = capsys.readouterr().out
    assert ("newly initialized: ['bert.pooler.dense.bias', 'bert.pooler.dense.weight']"
            in printed), printed


def test_head_with_another_number_of_labels_is_an_error_unless_reinit_head(tmp_path, capsys):
    model = BertForSequenceClassification(with_labels(BertConfig(**CONFIG), num_labels=3),
                                          seed=6)
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"classifier.weight has shape \(3, 16\) \(3 labels\) "
                                         r"but BertForSequenceClassification with num_labels=5 "
                                         r"needs \(5, 16\)"):
        BertForSequenceClassification.from_pretrained(tmp_path, num_labels=5)
    with pytest.raises(ValueError,
                       match=r"\(3 labels\) but BertForMultipleChoice .* \(1 labels\)"):
        BertForMultipleChoice.from_pretrained(tmp_path)
    capsys.readouterr()
    fresh = BertForSequenceClassification.from_pretrained(tmp_path, num_labels=5,
                                                          reinit_head=True)
    printed = capsys.readouterr().out
    assert ("classifier.weight: found shape (3, 16) in the checkpoint and (5, 16) in the model"
            in printed)
    assert (fresh.params["classifier.weight"].shape == (5, 16)
            and not fresh.params["classifier.bias"].any())
    # 3 labels, from config.json
    kept = BertForSequenceClassification.from_pretrained(tmp_path)
    numpy.testing.assert_array_equal(kept.params["classifier.weight"],
                                     model.params["classifier.weight"])
    capsys.readouterr()
    # same shape, fresh
    again = BertForSequenceClassification.from_pretrained(tmp_path, reinit_head=True)
    assert "- classifier.weight: reinit_head=True" in capsys.readouterr().out
    assert not again.params["classifier.bias"].any()
    assert not numpy.array_equal(again.params["classifier.weight"],
                                 model.params["classifier.weight"])
    # the same classifier serves token classification, as in transformers
    tokens = BertForTokenClassification.from_pretrained(tmp_path)
    numpy.testing.assert_array_equal(tokens.params["classifier.weight"],
                                     model.params["classifier.weight"])


def test_encoder_that_does_not_fit_is_still_an_error(tmp_path):
    BertForPreTraining(BertConfig(**CONFIG)).save_pretrained(tmp_path)
    tensors = safetensors.load_file(tmp_path / "model.safetensors")
    del tensors["bert.encoder.layer.1.output.dense.bias"]
    safetensors.save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing \(1\): bert.encoder.layer.1.output.dense.bias"):
        BertForSequenceClassification.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such folder"):
        BertForTokenClassification.from_pretrained(tmp_path / "nowhere")

# ----------------------------------------------------------------------- 4. bad input


def bad_batch_cases():
    B, T = 3, 7
    inputs = tiny_inputs(B=B, T=T)
    choice_inputs = tiny_inputs(B=2, T=T, choices=3)
    return [
        (BertForSequenceClassification, {**inputs, "labels": numpy.array([0, 2, 1])},
         r"labels\[1\] = 2 is outside \[0, 2\)"),
        (BertForSequenceClassification, {**inputs, "labels": numpy.array([0, 1])},
         r"labels int64 \(2,\) do not fit the model's problem_type 'single_label_classification' "
         r"\(integer class ids, shape \(3,\) or \(3, 1\)\)"),
        (BertForSequenceClassification, {**inputs}, r"at least 'input_ids' and 'labels'"),
        (BertForTokenClassification, {**inputs, "labels": numpy.zeros((B, T - 1), dtype=int)},
         r"labels has shape \(3, 6\), expected \(3, 7\)"),
        (BertForTokenClassification, {**inputs, "labels": numpy.full((B, T), 0.5)},
         "labels must be an integer array, got dtype float64"),
        (BertForTokenClassification, {**inputs, "labels": numpy.full((B, T), -1)},
         r"labels\[0, 0\] = -1 is outside \[0, 2\) \(allowed also: \[-100\]\)"),
        (BertForQuestionAnswering, {**inputs, "start_positions": numpy.array([0, 1, 2])},
         r"'end_positions'"),
        (BertForQuestionAnswering, {**inputs, "start_positions": numpy.zeros(B, dtype=int),
                                    "end_positions": numpy.zeros((B, 2), dtype=int)},
         r"end_positions has shape \(3, 2\), expected \(3,\)"),
        (BertForMultipleChoice, {**inputs, "labels": numpy.array([0, 1, 0])},
         r"input_ids must be \[batch, num_choices, seq_len\], got shape \(3, 7\)"),
        (BertForMultipleChoice, {**choice_inputs, "labels": numpy.array([0, 3])},
         r"labels\[1\] = 3 is outside \[0, 3\)"),
        (BertForMultipleChoice, {**choice_inputs,
                                 "attention_mask": numpy.ones((2, 3, T + 1), dtype=int),
                                 "labels": numpy.array([0, 1])},
         r"attention_mask has shape \(2, 3, 8\) but input_ids has \(2, 3, 7\)"),
    ]


@pytest.mark.parametrize("cls, batch, message", bad_batch_cases())
def test_bad_batches_name_the_offending_value(cls, batch, message):
    model = cls(BertConfig(**CONFIG), seed=0)
    with pytest.raises(ValueError, match=message):
        model.loss_and_grads(batch)


DISAGREEING_LABELS = [      # (problem_type, num_labels, labels of 3 examples, what is refused)
    ("single_label_classification", 3, [[1.0, 0, 1], [0, 0, 0], [0, 1, 1]], r"float64 \(3, 3\)"),
    ("single_label_classification", 3, [[1, 0, 1], [0, 0, 0], [0, 1, 1]], r"int64 \(3, 3\)"),
    ("single_label_classification", 2, [0.0, 1.0, 1.0], r"float64 \(3,\)"),
    ("multi_label_classification", 3, [2, 0, 1], r"int64 \(3,\)"),
    ("multi_label_classification", 1, [1.0, 0.0, 1.0], r"float64 \(3,\)"),
    ("regression", 2, [0.5, 1.0, 2.0], r"float64 \(3,\)"),
]


@pytest.mark.parametrize("kind, count, labels, found", DISAGREEING_LABELS)
def test_labels_that_disagree_with_the_problem_type_are_refused(kind, count, labels, found):
    """The declared type decides, never the labels: a multi-hot batch given to a single-label
    model, class ids given to a multi-label one, ... are one ValueError naming the type."""
    model = BertForSequenceClassification(
        with_labels(BertConfig(**CONFIG), num_labels=count, problem_type=kind), seed=0)
    with pytest.raises(ValueError, match=rf"^batch: labels {found} do not fit the model's "
                                         rf"problem_type '{kind}' \("):
        model.loss_and_grads({**tiny_inputs(), "labels": numpy.array(labels)})


@pytest.mark.parametrize("labels, message", [
    ([[0, 1.5], [0, 1], [1, 0]], r"labels\[0, 1\] = 1.5 is outside \[0, 1\] \(multi-label"),
    ([[True, False], [False, False], [True, True]], "must be a real-valued array, got dtype bool"),
])
def test_multi_label_targets_are_probabilities(labels, message):
    config = with_labels(BertConfig(**CONFIG), problem_type="multi_label_classification")
    model = BertForSequenceClassification(config, seed=0)
    with pytest.raises(ValueError, match=message):
        model.loss_and_grads({**tiny_inputs(), "labels": numpy.array(labels)})
    ones = {**tiny_inputs(), "labels": numpy.array([[0, 1], [0, 0], [1, 1]])}   # 0/1 integers
    assert model.check_batch(ones)["labels"].dtype == numpy.float64


def test_one_label_per_example_stays_what_was_declared():
    """The old guess from the labels made a multi-label task of one tag a regression (one
    output) and an undeclared one with float labels multi-label. Declared, the type holds:
    one tag, multi-label -> binary cross-entropy; single-label with one label per example ->
    cross-entropy; neither changes with the batch."""
    inputs = tiny_inputs()
    one_tag = BertForSequenceClassification(
        with_labels(BertConfig(**CONFIG), num_labels=1,
                    problem_type="multi_label_classification"), seed=0, dtype=numpy.float64)
    labels = numpy.array([[1.0], [0.0], [1.0]])
    loss, _, out = one_tag.loss_and_grads({**inputs, "labels": labels}, return_outputs=True)
    p = 1 / (1 + numpy.exp(-out["logits"]))
    bce = -(labels * numpy.log(p) + (1 - labels) * numpy.log(1 - p)).mean()
    assert out["problem_type"] == "multi_label_classification"
    assert loss == pytest.approx(bce, rel=1e-12)
    single = BertForSequenceClassification(BertConfig(**CONFIG), seed=0, dtype=numpy.float64)
    assert single.problem_type == "single_label_classification"
    _, _, out = single.loss_and_grads({**inputs, "labels": numpy.array([1, 0, 1])},
                                      return_outputs=True)
    assert out["problem_type"] == "single_label_classification"
    with pytest.raises(ValueError, match="needs num_labels >= 2"):
        BertForSequenceClassification(with_labels(BertConfig(**CONFIG), num_labels=1,
                                                  problem_type="single_label_classification"))


def test_regression_labels_must_be_finite():
    model = BertForSequenceClassification(with_labels(BertConfig(**CONFIG), num_labels=1))
    batch = {**tiny_inputs(), "labels": numpy.array([0.5, numpy.nan, 1.0])}
    with pytest.raises(ValueError, match=r"labels\[1\] = nan is not finite"):
        model.loss_and_grads(batch)
    batch["labels"] = numpy.array([[0.5], [1.0], [2.0]])                # [B, 1]: squeezed, as HF
    assert numpy.isfinite(model.loss_and_grads(batch)[0])

# ------------------------------------------------------------------ the skeleton's hooks

HOOKS = ("_check_targets", "_head_forward", "_loss_forward", "_loss_backward", "_head_backward",
         "_output")


def test_every_hook_is_declared_on_the_skeleton_and_supplied_by_every_head():
    for hook in HOOKS:
        assert getattr(BertPreTrainedModel, hook).__doc__, f"{hook} has no contract"
        for cls in (BertForPreTraining, *heads.TASK_HEADS):
            assert getattr(cls, hook) is not getattr(BertPreTrainedModel, hook), (cls, hook)


@pytest.mark.parametrize("method", ["loss", "loss_and_grads"])
def test_the_bare_encoder_has_no_loss_and_says_what_to_use_instead(method):
    model = BertModel(BertConfig(**CONFIG), seed=0)
    batch = {**tiny_inputs(), "labels": numpy.array([0, 1, 0])}
    with pytest.raises(TypeError, match=r"^BertModel is the bare encoder and has no loss: call it "
                                        r"for last_hidden_state and pooler_output, or train "
                                        r"BertForPreTraining or a task head \(BertForSequence"):
        getattr(model, method)(batch)
    assert model.check_batch(batch).keys() == {"input_ids", "token_type_ids", "attention_mask"}


@pytest.mark.parametrize("hook", HOOKS)
def test_a_head_that_leaves_out_a_hook_is_told_which(hook):
    """A sequence classifier written without one hook: the first call that needs it raises
    NotImplementedError naming the class, the hook and where its contract is."""
    parts = ("head_shapes", "target_keys", *HOOKS)
    cls = type("HeadWithout" + hook, (heads.BertForTask,),
               {name: BertForSequenceClassification.__dict__[name] for name in parts
                if name != hook} | {"problem_type": "single_label_classification"})
    model = cls(BertConfig(**CONFIG), seed=0)
    inputs = tiny_inputs()
    message = (rf"^HeadWithout{hook} does not define {hook}: a model with a head supplies it "
               rf"\(the contract: BertPreTrainedModel\.{hook}\)$")
    with pytest.raises(NotImplementedError, match=message):
        if hook == "_output":
            call(model, inputs)
        else:
            model.loss_and_grads({**inputs, "labels": numpy.array([0, 1, 0])})

# ------------------------------------------------------ live round trips with transformers

# (class, id2label or None for the default two labels, batch targets from the inputs)
EXPORTS = [
    (BertForSequenceClassification, ["neg", "neu", "pos"],
     lambda inputs: {"labels": numpy.array([2, 0, 1])}),
    (BertForSequenceClassification, ["score"],
     lambda inputs: {"labels": numpy.array([0.5, -1.0, 2.0])}),
    (BertForTokenClassification, ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"],
     lambda inputs: {"labels": numpy.where(inputs["attention_mask"] == 1, 3, -100)}),
    (BertForQuestionAnswering, None, lambda inputs: {"start_positions": numpy.array([1, 2, 9]),
                                                     "end_positions": numpy.array([3, -1, 4])}),
    (BertForMultipleChoice, None, lambda inputs: {"labels": numpy.array([1, 0, 2])}),
]


EXPORT_IDS = ["seq_cls", "regression", "token_cls", "qa", "choice"]


def export_inputs(cls):
    return tiny_inputs(seed=2, choices=3 if cls is BertForMultipleChoice else None)


def hf_outputs(hf, inputs, targets=None):
    import torch
    tensors = {k: torch.from_numpy(numpy.asarray(v))
               for k, v in {**inputs, **(targets or {})}.items()}
    if "labels" in tensors and tensors["labels"].dtype == torch.float64:
        tensors["labels"] = tensors["labels"].float()
    with torch.no_grad():
        return hf(**tensors)


def hf_logits(out):
    if hasattr(out, "start_logits"):
        return numpy.stack([out.start_logits.numpy(), out.end_logits.numpy()])
    return out.logits.numpy()


@pytest.mark.parametrize("cls, labels, targets", EXPORTS, ids=EXPORT_IDS)
def test_transformers_loads_a_nanobert_head_with_the_same_logits_and_loss(tmp_path, cls, labels,
                                                                          targets):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = (BertConfig(**CONFIG) if labels is None
              else with_labels(BertConfig(**CONFIG), id2label=labels))
    model = perturbed(cls(config, seed=7, dtype=numpy.float32))
    model.save_pretrained(tmp_path)
    hf, info = getattr(transformers, cls.__name__).from_pretrained(tmp_path,
                                                                   output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    hf.eval()
    if labels is not None:
        assert hf.config.num_labels == len(labels)
        assert hf.config.id2label == dict(enumerate(labels))
    inputs = export_inputs(cls)
    batch = {**inputs, **targets(inputs)}
    hf_out = hf_outputs(hf, inputs, targets(inputs))
    loss, _, out = model.loss_and_grads(batch, return_outputs=True)
    assert_close(comparable(cls, logits_of(call(model, inputs)), inputs),
                 comparable(cls, hf_logits(hf_out), inputs), 1e-5, "HF export float32 logits")
    assert_close(loss, hf_out.loss.item(), 1e-5, "HF export float32 loss")


@pytest.mark.parametrize("cls, labels, targets", EXPORTS, ids=EXPORT_IDS)
def test_nanobert_loads_a_transformers_head_with_the_same_logits_and_loss(tmp_path, cls, labels,
                                                                          targets, capsys):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    extra = {}
    if labels is not None:
        extra = {"id2label": dict(enumerate(labels)),
                 "label2id": {n: i for i, n in enumerate(labels)}}
    torch.manual_seed(0)
    hf = getattr(transformers, cls.__name__)(transformers.BertConfig(**CONFIG, **extra)).eval()
    with torch.no_grad():                              # move away from LN = 1, bias = 0
        for p in hf.parameters():
            p.add_(0.05 * torch.randn_like(p))
    hf.save_pretrained(tmp_path)
    capsys.readouterr()
    model = cls.from_pretrained(tmp_path, dtype=numpy.float32)
    assert capsys.readouterr().out == ""               # nothing ignored, nothing fresh
    if labels is not None:
        assert model.config.extra["id2label"] == {str(i): n for i, n in enumerate(labels)}
    inputs = export_inputs(cls)
    hf_out = hf_outputs(hf, inputs, targets(inputs))
    loss, _, out = model.loss_and_grads({**inputs, **targets(inputs)}, return_outputs=True)
    assert_close(comparable(cls, logits_of(call(model, inputs)), inputs),
                 comparable(cls, hf_logits(hf_out), inputs), 1e-5, "HF import float32 logits")
    assert_close(loss, hf_out.loss.item(), 1e-5, "HF import float32 loss")

# ------------------------------------------------- problem_type through config.json, both ways

# problem_type -> (num_labels, labels of export_inputs' 3 examples): two of them are not what
# transformers would guess from the labels (regression over 2 outputs: float labels, guessed
# multi-label; multi-label with 0/1 targets given as float all the same)
DECLARED = {
    "single_label_classification": (3, numpy.array([2, 0, 1])),
    "multi_label_classification": (3, numpy.array([[1.0, 0, 1], [0, 0, 0], [0, 1, 1]])),
    "regression": (2, numpy.array([[0.5, -1.0], [2.0, 0.0], [1.0, 1.0]])),
}


@pytest.mark.parametrize("kind", list(DECLARED))
def test_problem_type_round_trips_through_transformers(tmp_path, kind, capsys):
    """Declared in nanobert: config.json says it, transformers' config reads it before any
    forward, the losses agree. Declared in transformers: nanobert reads it, the losses agree."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    count, labels = DECLARED[kind]
    inputs = export_inputs(BertForSequenceClassification)
    ours = perturbed(BertForSequenceClassification(
        with_labels(BertConfig(**CONFIG), num_labels=count, problem_type=kind), seed=7))
    ours.save_pretrained(tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["problem_type"] == kind
    hf = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "ours").eval()
    assert hf.config.problem_type == kind
    loss = ours.loss({**inputs, "labels": labels})
    assert_close(loss, hf_outputs(hf, inputs, {"labels": labels}).loss.item(), 1e-5,
                 f"HF export {kind} loss")

    torch.manual_seed(0)
    theirs = transformers.BertForSequenceClassification(
        transformers.BertConfig(**CONFIG, num_labels=count, problem_type=kind)).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(0.05 * torch.randn_like(p))
    theirs.save_pretrained(tmp_path / "theirs")
    loaded = BertForSequenceClassification.from_pretrained(tmp_path / "theirs")
    assert loaded.problem_type == loaded.config.problem_type == kind
    assert_close(loaded.loss({**inputs, "labels": labels}),
                 hf_outputs(theirs, inputs, {"labels": labels}).loss.item(), 1e-5,
                 f"HF import {kind} loss")


def test_from_pretrained_declares_or_decides_the_problem_type(tmp_path):
    """from_pretrained(problem_type=...) replaces the checkpoint's; a config.json without one
    (a transformers checkpoint that never ran a loss) gets the decision at build, and the saved
    folder then states it."""
    undeclared = tmp_path / "undeclared"
    BertForSequenceClassification(with_labels(BertConfig(**CONFIG), num_labels=3),
                                  seed=0).save_pretrained(undeclared)
    saved = json.loads((undeclared / "config.json").read_text())
    saved.pop("problem_type")
    (undeclared / "config.json").write_text(json.dumps(saved))
    assert "problem_type" not in BertConfig.from_json_file(undeclared).to_dict()
    model = BertForSequenceClassification.from_pretrained(undeclared)
    assert model.problem_type == "single_label_classification"
    multi = BertForSequenceClassification.from_pretrained(
        undeclared, problem_type="multi_label_classification")
    assert multi.problem_type == "multi_label_classification"
    multi.save_pretrained(tmp_path / "multi")
    assert BertForSequenceClassification.from_pretrained(tmp_path / "multi").problem_type == \
        "multi_label_classification"
    with pytest.raises(ValueError, match=r"problem_type must be one of .* got 'ranking'"):
        BertForSequenceClassification.from_pretrained(undeclared, problem_type="ranking")
