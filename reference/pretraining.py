"""Reference outputs, gradients and optimizer steps of BERT pretraining (MLM + NSP).

A tiny transformers.BertForPreTraining in float64 (eval mode, so no dropout) is run on one
hand-built batch whose rows hit the edge cases (A/B segments, padding, a row that is all
padding but [CLS], repeated token ids, masked positions at the first and last index). The
result is tests/fixtures/pretraining_float64.npz, which the nanobert tests load to check the
forward pass, every parameter gradient and five optimizer steps (torch AdamW and the
original BERT AdamWeightDecay) against it.

Regenerate it from the repository root with

    python -m reference.pretraining            # writes tests/fixtures/pretraining_float64.npz
    python -m reference.pretraining --out X.npz

`make_fixture()` is deterministic, so a test may also rebuild it live and compare.

Keys (float64 unless noted):
  config_json                      HF config.to_json_string()
  input_ids, token_type_ids, attention_mask, labels [B, T], next_sentence_label [B] (int64)
  param/<name>                     initial weights, HF state-dict names; the tied aliases
                                   cls.predictions.decoder.{weight,bias} are left out
  hidden/<i>                       i = 0 embeddings output, i = 1..L output of layer i [B, T, H]
  pooler_output [B, H], prediction_logits [B, T, V], seq_relationship_logits [B, 2]
  mlm_loss, nsp_loss, loss         scalars; loss = mlm_loss + nsp_loss
  grad/<name>                      d loss / d param (word embeddings include the decoder's part)
  opt/peak_lr, opt/warmup_steps, opt/num_train_steps, opt/weight_decay, opt/steps
  opt_<mode>/loss [steps]          loss before each update, mode in {torch, bert}
  opt_<mode>/lr [steps]            learning rate used by each update
  opt_<mode>/grad_norm [steps]     global gradient norm before clipping
  opt_<mode>/param/<name>          weights after all updates
"""

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForPreTraining

from reference.bert_adam import (AdamWeightDecay, bert_learning_rate, clip_by_global_norm,
                                  uses_weight_decay)

DEFAULT_OUT = Path("tests/fixtures/pretraining_float64.npz")
SEED = 1234

CONFIG = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
    type_vocab_size=2,
    hidden_act="gelu",  # exact erf GELU, as in the released checkpoints
    layer_norm_eps=1e-12,
    initializer_range=0.02,
)
B, T = 4, 11
PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
FIRST_WORD_ID = 5  # ordinary word pieces are drawn from [5, vocab_size)
IGNORE = -100  # label of positions that are not predicted (torch's ignore_index)

PEAK_LR = 1e-2
WARMUP_STEPS = 2
NUM_TRAIN_STEPS = 10
WEIGHT_DECAY = 0.01
CLIP_NORM = 1.0
OPT_STEPS = 5

# Tied aliases: the same tensors as the word embeddings and the MLM output bias.
TIED_ALIASES = {
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}


def build_model(rng):
    """BertForPreTraining in float64 with weights drawn from `rng` (a numpy Generator).

    Every weight is overwritten, so the fixture does not depend on how a transformers version
    initialises or consumes torch's RNG. LayerNorm gains are 1 + 0.1 N(0, 1) and biases
    0.1 N(0, 1) so a backward pass that forgets either is caught. Matrices are 0.2 N(0, 1),
    ten times BERT's 0.02: with the small init attention is nearly uniform and GELU and tanh
    stay almost linear, which would hide mistakes in their backward passes.
    """
    config = BertConfig(**CONFIG, attn_implementation="eager")
    torch.manual_seed(SEED)
    model = BertForPreTraining(config).to(torch.float64).eval()
    perturb_weights(model, rng)
    assert model.config._attn_implementation == "eager"
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias
    return model


def perturb_weights(model, rng):
    """Overwrite every weight (each tied tensor once) from `rng`: LayerNorm gains
    1 + 0.1 N(0, 1), biases 0.1 N(0, 1), matrices 0.2 N(0, 1)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.from_numpy(rng.standard_normal(p.shape))
            if "LayerNorm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(0.2 * noise)


def param_names(model):
    """HF state-dict names of the trainable tensors, each tied tensor under its owner's name."""
    names = [k for k in model.state_dict() if k not in TIED_ALIASES]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters()), names
    return names


def make_batch(rng):
    """One batch, B = 4, T = 11; every row exercises something different.

    row 0  [CLS] A A A A [SEP] B B B B [SEP], full length, A/B segments, NSP label 0
    row 1  [CLS] A A [SEP] B B [SEP] then padding from position 7, NSP label 1
    row 2  [CLS] then padding only; its one prediction is at position 0 (the [CLS] itself)
    row 3  one id repeated many times (embedding gradients must add up, not overwrite),
           truncated so the last position T-1 is a masked word, not [SEP]
    Masked inputs follow the original 80/10/10 rule by hand: most become [MASK], one keeps
    its id, one is replaced by a random id.
    """
    def words(n):
        return rng.integers(FIRST_WORD_ID, CONFIG["vocab_size"], size=n)

    input_ids = np.full((B, T), PAD, dtype=np.int64)
    token_type_ids = np.zeros((B, T), dtype=np.int64)
    attention_mask = np.zeros((B, T), dtype=np.int64)
    labels = np.full((B, T), IGNORE, dtype=np.int64)

    input_ids[0] = [CLS, *words(4), SEP, *words(4), SEP]
    token_type_ids[0, 6:] = 1
    attention_mask[0] = 1

    input_ids[1, :7] = [CLS, *words(2), SEP, *words(2), SEP]
    token_type_ids[1, 4:7] = 1
    attention_mask[1, :7] = 1

    input_ids[2, 0] = CLS
    attention_mask[2, 0] = 1

    r, s = words(2)
    input_ids[3] = [CLS, r, r, s, r, SEP, r, r, s, r, r]
    token_type_ids[3, 6:] = 1
    attention_mask[3] = 1

    def predict(row, pos, how):
        labels[row, pos] = input_ids[row, pos]
        if how == "mask":
            input_ids[row, pos] = MASK
        elif how == "random":
            input_ids[row, pos] = words(1)[0]
        # "keep": the input stays the original token

    predict(0, 2, "mask")
    predict(0, 8, "random")
    predict(1, 1, "mask")
    predict(1, 5, "keep")
    predict(2, 0, "keep")  # first index of a row
    predict(3, 2, "mask")
    predict(3, 4, "mask")  # same label id as position 2 and 10
    predict(3, T - 1, "mask")  # last index of a row

    return dict(
        input_ids=input_ids,
        token_type_ids=token_type_ids,
        attention_mask=attention_mask,
        labels=labels,
        next_sentence_label=np.array([0, 1, 0, 1], dtype=np.int64),
    )


def pretraining_loss(model, batch, **kwargs):
    """Forward pass and the loss written out: MLM mean over predicted tokens + NSP mean."""
    out = model(
        input_ids=batch["input_ids"],
        token_type_ids=batch["token_type_ids"],
        attention_mask=batch["attention_mask"],
        **kwargs,
    )
    predicted = batch["labels"] != IGNORE  # [B, T]
    mlm_loss = F.cross_entropy(out.prediction_logits[predicted], batch["labels"][predicted])
    nsp_loss = F.cross_entropy(out.seq_relationship_logits, batch["next_sentence_label"])
    return mlm_loss + nsp_loss, mlm_loss, nsp_loss, out


def run_optimizer(mode, model, batch, names):
    """OPT_STEPS updates of `model` in place; returns loss, lr and pre-clip norm per step.

    mode "torch": torch.optim.AdamW + LambdaLR + clip_grad_norm_ (bias-corrected, eps 1e-8).
    mode "bert":  reference.bert_adam, the original AdamWeightDecay (no bias correction,
                  eps 1e-6, TF clipping).
    Both use the original schedule, so the first update has lr 0 (but still moves m and v).
    """
    named = dict(model.named_parameters())
    params = [named[n] for n in names]

    def schedule(step):
        return bert_learning_rate(step, PEAK_LR, WARMUP_STEPS, NUM_TRAIN_STEPS)

    if mode == "torch":
        groups = [
            dict(params=[named[n] for n in names if uses_weight_decay(n)],
                 weight_decay=WEIGHT_DECAY),
            dict(params=[named[n] for n in names if not uses_weight_decay(n)], weight_decay=0.0),
        ]
        optimizer = torch.optim.AdamW(groups, lr=PEAK_LR, betas=(0.9, 0.999), eps=1e-8)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer,
                                                      lambda step: schedule(step) / PEAK_LR)
    elif mode == "bert":
        optimizer = AdamWeightDecay([(n, named[n]) for n in names], WEIGHT_DECAY, 0.9, 0.999, 1e-6)
    else:
        raise ValueError(f"unknown optimizer mode {mode!r}, expected 'torch' or 'bert'")

    losses, lrs, norms = [], [], []
    for step in range(OPT_STEPS):
        model.zero_grad(set_to_none=True)
        loss, _, _, _ = pretraining_loss(model, batch)
        loss.backward()
        losses.append(loss.item())
        if mode == "torch":
            norms.append(torch.nn.utils.clip_grad_norm_(params, CLIP_NORM).item())
            lrs.append(optimizer.param_groups[0]["lr"])
            assert all(g["lr"] == lrs[-1] for g in optimizer.param_groups)
            optimizer.step()
            scheduler.step()
        else:
            norms.append(clip_by_global_norm([p.grad for p in params], CLIP_NORM))
            lrs.append(schedule(step))
            optimizer.step(lrs[-1])
    return np.array(losses), np.array(lrs), np.array(norms)


def make_fixture():
    """Build every array of the fixture (see the module docstring for the keys)."""
    rng = np.random.default_rng(SEED)
    model = build_model(rng)
    names = param_names(model)
    initial = {n: t.detach().clone() for n, t in model.state_dict().items()}
    batch_np = make_batch(rng)
    batch = {k: torch.from_numpy(v) for k, v in batch_np.items()}

    fixture = {"config_json": np.array(model.config.to_json_string())}
    fixture.update(batch_np)
    for n in names:
        fixture[f"param/{n}"] = initial[n].numpy().copy()

    # Keep the gradient of the embeddings output to check what padded positions receive.
    embedding_outputs = []

    def keep_grad(module, args, output):
        output.retain_grad()
        embedding_outputs.append(output)

    hook = model.bert.embeddings.register_forward_hook(keep_grad)
    model.zero_grad(set_to_none=True)
    loss, mlm_loss, nsp_loss, out = pretraining_loss(
        model, batch, labels=batch["labels"], next_sentence_label=batch["next_sentence_label"],
        output_hidden_states=True,
    )
    hook.remove()
    assert torch.allclose(loss, out.loss, rtol=1e-14, atol=0), (loss.item(), out.loss.item())
    loss.backward()

    hidden = out.hidden_states
    assert len(hidden) == CONFIG["num_hidden_layers"] + 1
    for i, h in enumerate(hidden):
        fixture[f"hidden/{i}"] = h.detach().numpy().copy()
    fixture["pooler_output"] = model.bert.pooler(hidden[-1]).detach().numpy().copy()
    fixture["prediction_logits"] = out.prediction_logits.detach().numpy().copy()
    fixture["seq_relationship_logits"] = out.seq_relationship_logits.detach().numpy().copy()
    fixture["mlm_loss"] = np.array(mlm_loss.item())
    fixture["nsp_loss"] = np.array(nsp_loss.item())
    fixture["loss"] = np.array(loss.item())
    named = dict(model.named_parameters())
    for n in names:
        fixture[f"grad/{n}"] = named[n].grad.numpy().copy()

    # Padded positions are masked out as keys and never predicted, so their embeddings get an
    # exactly zero gradient; hence nn.Embedding's padding_idx=0 rule (no gradient into the
    # [PAD] row) changes nothing here and a plain scatter-add must give the same grad.
    (emb_out,) = embedding_outputs
    padded = batch["attention_mask"] == 0
    assert emb_out.grad is not None and torch.all(emb_out.grad[padded] == 0)
    assert model.bert.embeddings.word_embeddings.padding_idx == PAD
    # decoder's part
    assert torch.any(named["bert.embeddings.word_embeddings.weight"].grad[PAD] != 0)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight

    # transformers adds finfo(float64).min at masked keys; the original adds -10000. Both
    # underflow to an exact 0 after softmax, so the outputs are bit-identical.
    with torch.no_grad():
        additive = (1.0 - batch["attention_mask"][:, None, None, :].to(torch.float64)) * -10000.0
        out_10000 = model(
            input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
            attention_mask=additive.expand(B, 1, T, T),
        )
    assert torch.equal(out_10000.prediction_logits, out.prediction_logits)

    fixture["opt/peak_lr"] = np.array(PEAK_LR)
    fixture["opt/warmup_steps"] = np.array(WARMUP_STEPS, dtype=np.int64)
    fixture["opt/num_train_steps"] = np.array(NUM_TRAIN_STEPS, dtype=np.int64)
    fixture["opt/weight_decay"] = np.array(WEIGHT_DECAY)
    fixture["opt/steps"] = np.array(OPT_STEPS, dtype=np.int64)
    for mode in ("torch", "bert"):
        model.load_state_dict(initial)
        losses, lrs, norms = run_optimizer(mode, model, batch, names)
        assert losses[0] == fixture["loss"], (losses[0], fixture["loss"])
        fixture[f"opt_{mode}/loss"] = losses
        fixture[f"opt_{mode}/lr"] = lrs
        fixture[f"opt_{mode}/grad_norm"] = norms
        for n, t in model.state_dict().items():
            if n in names:
                fixture[f"opt_{mode}/param/{n}"] = t.detach().numpy().copy()
    return fixture


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"npz to write (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    fixture = make_fixture()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **fixture)
    config = json.loads(str(fixture["config_json"]))
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, {len(fixture)} arrays, "
          f"L={config['num_hidden_layers']} H={config['hidden_size']})")
    print(f"mlm_loss {fixture['mlm_loss']:.17g}  nsp_loss {fixture['nsp_loss']:.17g}  "
          f"loss {fixture['loss']:.17g}")
    for mode in ("torch", "bert"):
        print(f"opt_{mode}/loss", np.array2string(fixture[f"opt_{mode}/loss"], precision=10))


if __name__ == "__main__":
    main()
