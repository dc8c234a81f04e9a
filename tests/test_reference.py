"""nanobert against the PyTorch reference (transformers' BertForPreTraining, torch.optim.AdamW
and an independent torch AdamWeightDecay), tensor by tensor: every layer's hidden states,
the pooler, MLM and NSP logits, the losses, every parameter's gradient, and 5 optimizer steps
in both modes. The committed fixture needs no torch; with torch + transformers installed the
same checks run again on a fixture regenerated live (`python -m reference.pretraining`).
"""
import json
import pathlib

import numpy
import pytest

from nanobert import AdamW, BertConfig, BertForPreTraining, clip_by_global_norm, learning_rate
from conftest import assert_close, attended, reference_fixture

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "pretraining_float64.npz"
TOL = {numpy.float64: 1e-10, numpy.float32: 1e-4}
BATCH_KEYS = ("input_ids", "token_type_ids", "attention_mask", "labels", "next_sentence_label")


@pytest.fixture(params=["committed", "live"])
def ref(request):
    return reference_fixture(request.param, FIXTURE, "reference.pretraining")


def load_model(ref, dtype):
    config = BertConfig.from_dict(json.loads(str(ref["config_json"])))
    params = {k[len("param/"):]: ref[k] for k in ref if k.startswith("param/")}
    return BertForPreTraining(config, dtype=dtype, params=params).eval()


def batch_of(ref):
    return {k: ref[k] for k in BATCH_KEYS}


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32])
def test_forward_matches_reference_layer_by_layer(ref, dtype):
    model = load_model(ref, dtype)
    loss, _, out = model.loss_and_grads(batch_of(ref), return_outputs=True)
    tol, tag = TOL[dtype], numpy.dtype(dtype).name
    mask = ref["attention_mask"]                         # packed: compared where it attends
    for i, h in enumerate(out["hidden_states"]):
        assert_close(attended(h, mask), attended(ref[f"hidden/{i}"], mask), tol,
                     f"reference {tag} hidden_states")
    assert_close(out["pooler_output"], ref["pooler_output"], tol, f"reference {tag} pooler_output")
    masked = ref["labels"] != -100                       # nanobert computes MLM logits only here
    assert_close(out["mlm_logits"], ref["prediction_logits"][masked], tol,
                 f"reference {tag} MLM logits")
    assert_close(out["nsp_logits"], ref["seq_relationship_logits"], tol,
                 f"reference {tag} NSP logits")
    for key, value in (("mlm_loss", out["mlm_loss"]), ("nsp_loss", out["nsp_loss"]),
                       ("loss", loss)):
        assert_close(value, ref[key], tol, f"reference {tag} losses")


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32])
def test_full_sequence_logits_match_reference(ref, dtype):
    out = load_model(ref, dtype)(ref["input_ids"], ref["token_type_ids"], ref["attention_mask"])
    tag = numpy.dtype(dtype).name
    mask = ref["attention_mask"]
    assert_close(attended(out.prediction_logits, mask), attended(ref["prediction_logits"], mask),
                 TOL[dtype], f"reference {tag} MLM logits")
    assert_close(out.seq_relationship_logits, ref["seq_relationship_logits"], TOL[dtype],
                 f"reference {tag} NSP logits")


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32])
def test_every_gradient_matches_reference(ref, dtype):
    model = load_model(ref, dtype)
    _, grads = model.loss_and_grads(batch_of(ref))
    tag = numpy.dtype(dtype).name
    assert set(grads) == set(model.params)
    largest = max(numpy.abs(ref["grad/" + name]).max() for name in grads)
    for name, g in grads.items():
        expected = ref["grad/" + name]
        if name.endswith("attention.self.key.bias"):
            # Exactly zero in exact arithmetic: softmax ignores a shift shared by a row's
            # scores, and q.b_k shifts every key equally. Both sides hold only rounding
            # noise, so compare on the scale of the largest gradient instead.
            err = numpy.abs(g - expected).max() / largest
            assert err <= TOL[dtype], f"{name}: error {err:.2e} relative to the largest gradient"
            continue
        assert_close(g, expected, TOL[dtype], f"reference {tag} gradients")


@pytest.mark.parametrize("mode", ["torch", "bert"])
@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32])
def test_five_optimizer_steps_match_reference(ref, mode, dtype):
    model = load_model(ref, dtype).eval()
    peak, warmup, total = (float(ref["opt/peak_lr"]), int(ref["opt/warmup_steps"]),
                           int(ref["opt/num_train_steps"]))
    optimizer = AdamW(model.params, lr=peak, mode=mode, weight_decay=float(ref["opt/weight_decay"]))
    tag = f"{numpy.dtype(dtype).name} {mode}"
    losses, norms = [], []
    for step in range(int(ref["opt/steps"])):
        loss, grads = model.loss_and_grads(batch_of(ref))
        losses.append(loss)
        norms.append(clip_by_global_norm(grads, 1.0, mode=mode))
        lr = learning_rate(step, peak, warmup, total)
        assert abs(lr - ref[f"opt_{mode}/lr"][step]) <= 1e-15, (step, lr,
                                                                 ref[f"opt_{mode}/lr"][step])
        optimizer.step(grads, lr=lr)
    assert_close(losses, ref[f"opt_{mode}/loss"], TOL[dtype], f"reference {tag} AdamW losses")
    assert_close(norms, ref[f"opt_{mode}/grad_norm"], TOL[dtype],
                 f"reference {tag} AdamW grad norms")
    for name, p in model.params.items():
        expected = ref[f"opt_{mode}/param/{name}"]
        if dtype == numpy.float32 and name.endswith("attention.self.key.bias"):
            # Its gradient is rounding noise (see above): ~1e-17 in float64 but ~1e-9 in
            # float32, where Adam's m / (sqrt(v) + eps) turns noise comparable to eps into
            # steps of up to lr. Only bound the difference by the sum of the step sizes.
            bound = float(numpy.sum(ref[f"opt_{mode}/lr"]))
            assert numpy.abs(p - expected).max() <= bound, name
            continue
        assert_close(p, expected, TOL[dtype], f"reference {tag} AdamW weights")
