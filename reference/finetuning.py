"""Reference losses, logits and gradients of the BERT fine-tuning heads, from transformers.

For each task a tiny transformers model in float64 (eval mode, so no dropout; eager
attention) with weights drawn from a numpy Generator is run on a hand-built batch with
padding, and its loss, logits and the gradient of the loss w.r.t. every parameter are saved
in tests/fixtures/finetuning_float64.npz. The nanobert tests load it (no torch needed) and,
with torch + transformers installed, rebuild it live with `make_fixture()` (deterministic).

    python -m reference.finetuning             # writes tests/fixtures/finetuning_float64.npz
    python -m reference.finetuning --out X.npz

Tasks (the key prefix) and the transformers class each uses:
  seq_cls      BertForSequenceClassification, 3 labels, int labels (one -100: ignored)
  regression   BertForSequenceClassification, num_labels 1 -> MSE on the squeezed logits
  multi_label  BertForSequenceClassification, 3 labels, float labels -> BCE with logits
  token_cls    BertForTokenClassification, 5 labels, -100 on padding and continuation pieces
  qa           BertForQuestionAnswering; positions past the end (= T and > T: ignored after
               clamping to [0, T]) and a negative one (clamped to 0, the [CLS])
  choice       BertForMultipleChoice, input [2, 3, T], one score per choice

Keys, each under "<task>/" (float64 unless noted):
  config_json                     HF config.to_json_string() before the forward pass (so
                                  problem_type is still unset: transformers infers it from
                                  the labels; nanobert's tests declare the multi-label one)
  input_ids, token_type_ids, attention_mask   int64 [B, T] ([B, C, T] for choice)
  labels                          int64 or float64; qa has start_positions, end_positions [B]
  param/<name>                    weights, HF state-dict names
  grad/<name>                     d loss / d param
  loss                            scalar, HF's own (checked against the loss written out here)
  logits                          [B, C] / [B, T, C] / [B, C]; qa has start_logits, end_logits
"""

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import transformers

from reference.pretraining import perturb_weights

DEFAULT_OUT = Path("tests/fixtures/finetuning_float64.npz")
SEED = 4321

CONFIG = dict(
    vocab_size=37,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=23,
    max_position_embeddings=16,
    type_vocab_size=2,
    hidden_act="gelu",  # exact erf GELU, as in the released checkpoints
    layer_norm_eps=1e-12,
    initializer_range=0.02,
)
B, T = 4, 9
PAD, UNK, CLS, SEP = 0, 1, 2, 3
FIRST_WORD_ID = 5
IGNORE = -100

# task -> (transformers class name, num_labels)
TASKS = {
    "seq_cls": ("BertForSequenceClassification", 3),
    "regression": ("BertForSequenceClassification", 1),
    "multi_label": ("BertForSequenceClassification", 3),
    "token_cls": ("BertForTokenClassification", 5),
    "qa": ("BertForQuestionAnswering", 2),
    "choice": ("BertForMultipleChoice", 2),
}


def build_model(class_name, num_labels, rng):
    """The transformers class in float64, eval mode, every weight overwritten from `rng`
    (as reference/pretraining.py: LayerNorm gains 1 + 0.1 N, biases 0.1 N, matrices 0.2 N,
    so attention, GELU and tanh are far from their near-linear small-init regime)."""
    config = transformers.BertConfig(**CONFIG, num_labels=num_labels, attn_implementation="eager")
    torch.manual_seed(SEED)
    model = getattr(transformers, class_name)(config).to(torch.float64).eval()
    perturb_weights(model, rng)
    assert model.config._attn_implementation == "eager"
    return model


def words(rng, n):
    return rng.integers(FIRST_WORD_ID, CONFIG["vocab_size"], size=n)


def make_inputs(rng):
    """B = 4 rows of length T = 9 covering the edge cases:
    row 0  [CLS] A A A [SEP] B B B [SEP], full length, A/B segments
    row 1  [CLS] A A [SEP] B [SEP] then padding from position 6
    row 2  [CLS] then padding only
    row 3  one id repeated (embedding gradients must add up), single segment, no padding
    """
    input_ids = np.full((B, T), PAD, dtype=np.int64)
    token_type_ids = np.zeros((B, T), dtype=np.int64)
    attention_mask = np.zeros((B, T), dtype=np.int64)
    input_ids[0] = [CLS, *words(rng, 3), SEP, *words(rng, 3), SEP]
    token_type_ids[0, 5:] = 1
    attention_mask[0] = 1
    input_ids[1, :6] = [CLS, *words(rng, 2), SEP, *words(rng, 1), SEP]
    token_type_ids[1, 4:6] = 1
    attention_mask[1, :6] = 1
    input_ids[2, 0] = CLS
    attention_mask[2, 0] = 1
    r, s = words(rng, 2)
    input_ids[3] = [CLS, r, r, s, r, r, s, r, SEP]
    attention_mask[3] = 1
    return dict(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)


def make_choice_inputs(rng, num_choices=3):
    """2 questions x 3 choices: [CLS] question [SEP] choice [SEP], padded to T."""
    shape = (2, num_choices, T)
    input_ids = np.full(shape, PAD, dtype=np.int64)
    token_type_ids = np.zeros(shape, dtype=np.int64)
    attention_mask = np.zeros(shape, dtype=np.int64)
    for q, question_len in enumerate((3, 2)):
        question = words(rng, question_len)
        for c, choice_len in enumerate((1, 3, 5 - question_len)):
            row = [CLS, *question, SEP, *words(rng, choice_len), SEP]
            input_ids[q, c, :len(row)] = row
            token_type_ids[q, c, question_len + 2:len(row)] = 1
            attention_mask[q, c, :len(row)] = 1
    return dict(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)


def make_targets(task, rng, inputs):
    if task == "seq_cls":
        return {"labels": np.array([2, 0, IGNORE, 1], dtype=np.int64)}
    if task == "regression":
        return {"labels": rng.normal(0.0, 2.0, size=B)}
    if task == "multi_label":
        return {"labels": np.array([[1, 0, 1], [0, 0, 0], [1, 1, 1], [0, 0.25, 1]],
                                   dtype=np.float64)}
    if task == "token_cls":
        labels = rng.integers(0, TASKS[task][1], size=(B, T))
        labels[inputs["attention_mask"] == 0] = IGNORE      # padding
        labels[0, [2, 6]] = IGNORE                          # continuation word pieces
        labels[3, 4] = IGNORE
        return {"labels": labels}
    if task == "qa":
        # row 0 an answer span, row 1 end past the end (T: ignored), row 2 start far past
        # the end (clamped to T, ignored), row 3 a negative start (clamped to 0 = [CLS])
        return {"start_positions": np.array([5, 1, T + 3, -1], dtype=np.int64),
                "end_positions": np.array([7, T, 0, 2], dtype=np.int64)}
    if task == "choice":
        return {"labels": np.array([1, 2], dtype=np.int64)}
    raise ValueError(f"unknown task {task!r}")


def written_out_loss(task, out, targets):
    """The loss rule of each class, written out with torch.nn.functional, to check that the
    fixture's loss is what the docstrings say it is."""
    if task in ("seq_cls", "choice"):
        return F.cross_entropy(out.logits, targets["labels"])          # ignores -100
    if task == "regression":
        return F.mse_loss(out.logits[:, 0], targets["labels"])
    if task == "multi_label":
        return F.binary_cross_entropy_with_logits(out.logits, targets["labels"])
    if task == "token_cls":
        return F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]),
                               targets["labels"].reshape(-1))
    if task == "qa":
        ignored = out.start_logits.shape[1]                             # T
        start = targets["start_positions"].clamp(0, ignored)
        end = targets["end_positions"].clamp(0, ignored)
        return (F.cross_entropy(out.start_logits, start, ignore_index=ignored)
                + F.cross_entropy(out.end_logits, end, ignore_index=ignored)) / 2
    raise ValueError(task)


def task_fixture(task, rng):
    class_name, num_labels = TASKS[task]
    model = build_model(class_name, num_labels, rng)
    inputs = make_choice_inputs(rng) if task == "choice" else make_inputs(rng)
    targets = make_targets(task, rng, inputs)
    fixture = {"config_json": np.array(model.config.to_json_string())}
    fixture.update(inputs)
    fixture.update(targets)
    names = [n for n, _ in model.named_parameters()]
    assert names == list(model.state_dict()), "no buffers or tied aliases expected"
    for n, p in model.named_parameters():
        fixture[f"param/{n}"] = p.detach().numpy().copy()

    batch = {k: torch.from_numpy(v) for k, v in {**inputs, **targets}.items()}
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    loss = written_out_loss(task, out, batch)
    assert torch.allclose(loss, out.loss, rtol=1e-14, atol=0), (task, loss.item(), out.loss.item())
    out.loss.backward()
    fixture["loss"] = np.array(out.loss.item())
    if task == "qa":
        fixture["start_logits"] = out.start_logits.detach().numpy().copy()
        fixture["end_logits"] = out.end_logits.detach().numpy().copy()
    else:
        fixture["logits"] = out.logits.detach().numpy().copy()
    for n, p in model.named_parameters():
        fixture[f"grad/{n}"] = p.grad.numpy().copy()
    # nn.Embedding(padding_idx=pad_token_id): the [PAD] row gets no gradient even where padded
    # positions reach the loss (QA's softmax runs over all T positions, padding included).
    words_table = model.bert.embeddings.word_embeddings
    assert words_table.padding_idx == PAD and not words_table.weight.grad[PAD].any()
    if task == "regression":
        assert model.config.problem_type == "regression"        # inferred from num_labels == 1
    if task == "multi_label":
        assert model.config.problem_type == "multi_label_classification"  # from float labels
    return {f"{task}/{k}": v for k, v in fixture.items()}


def make_fixture():
    """Every array of the fixture (see the module docstring for the keys)."""
    rng = np.random.default_rng(SEED)
    fixture = {}
    for task in TASKS:
        fixture.update(task_fixture(task, rng))
    return fixture


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"npz to write (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    fixture = make_fixture()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **fixture)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, {len(fixture)} arrays)")
    for task in TASKS:
        config = json.loads(str(fixture[f"{task}/config_json"]))
        print(f"{task:<12s} {TASKS[task][0]:<31s} labels {len(config.get('id2label', [0, 1]))}  "
              f"loss {fixture[f'{task}/loss']:.17g}")


if __name__ == "__main__":
    main()
