"""float16 mixed precision, on the CPU with NumPy float16 (NVIDIA's BERT recipe): float32
master weights, float16 activations and matmuls, float32 LayerNorm / softmax statistics and
losses, dynamic loss scaling. The GPU runs the same code through CuPy (the branches are
checked against these numbers on the stand-in, tests/test_cupy_standin.py); tensor-core
rounding on a real GPU is not verified here."""
import numpy
import pytest

from conftest import record
from nanobert import AdamW, BertConfig, BertForPreTraining, clip_by_global_norm
from nanobert.formats import safetensors
from nanobert.model.optim import LossScaler

TINY = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=32)


def batch_of(config, B, T, seed):
    """Learnable sequences: each token is its predecessor + 1 (mod V, ids >= 5), 15% masked."""
    rng = numpy.random.default_rng(seed)
    V = config.vocab_size
    ids = 5 + (rng.integers(0, V - 5, size=(B, 1)) + numpy.arange(T)) % (V - 5)
    labels = numpy.where(rng.random((B, T)) < 0.15, ids, -100)
    labels[:, 1] = ids[:, 1]                                     # at least one per row
    masked = ids.copy()
    masked[labels != -100] = 4                                   # [MASK]
    return {"input_ids": masked, "attention_mask": numpy.ones((B, T), dtype=numpy.int64),
            "token_type_ids": numpy.zeros((B, T), dtype=numpy.int64), "labels": labels,
            "next_sentence_label": rng.integers(0, 2, size=B)}


def test_float16_keeps_float32_master_weights_and_gradients():
    model = BertForPreTraining(BertConfig(**TINY), dtype=numpy.float16)
    assert all(p.dtype == numpy.float32 for p in model.params.values())
    loss, grads = model.loss_and_grads(batch_of(model.config, 2, 16, 0), loss_scale=1024.0)
    assert isinstance(loss, float) and all(g.dtype == numpy.float32 for g in grads.values())
    assert model.weights["cls.predictions.bias"].dtype == numpy.float16


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_float16_gradients_match_float32_within_float16_tolerance(seed):
    """Same weights, dropout off, loss scale 2^10 then divided out. float16 keeps 11
    significant bits (4.9e-4) and the backward compounds a few dozen roundings: the largest
    error over all gradients is within 5e-3 of the largest gradient (measured 1.1-1.3e-3),
    and each tensor within 1e-2 of its own largest entry (measured <= 5.1e-3), or of 5% of
    the largest gradient for the tensors whose entries are sums that cancel (the NSP and
    pooler biases, 0.1 relative to their own ~0.01). The loss within 1e-4."""
    config = BertConfig(**TINY)
    batch = batch_of(config, 4, 16, seed)
    single = BertForPreTraining(config, seed=2).eval()
    half = BertForPreTraining(config, seed=2, dtype=numpy.float16).eval()
    loss32, grads32 = single.loss_and_grads(batch)
    loss16, grads16 = half.loss_and_grads(batch, loss_scale=1024.0)
    assert abs(loss16 - loss32) <= 1e-4 * abs(loss32), (loss16, loss32)
    largest = max(float(numpy.abs(g).max()) for g in grads32.values())
    worst = worst_tensor = 0.0
    for name, g32 in grads32.items():
        error = float(numpy.abs(grads16[name] / 1024.0 - g32).max())
        worst = max(worst, error / largest)
        if name.endswith("attention.self.key.bias"):   # true gradient 0: noise on both sides
            continue
        relative = error / max(float(numpy.abs(g32).max()), 0.05 * largest)
        worst_tensor = max(worst_tensor, relative)
        assert relative <= 1e-2, f"{name}: float16 gradient relative error {relative:.2e}"
    assert worst <= 5e-3, worst
    record("float16 vs float32 gradients, per tensor (mixed precision)", worst_tensor)
    record("float16 vs float32 gradients, of the largest (mixed precision)", worst)


def test_an_overflowing_step_is_skipped_and_the_scale_halved():
    config = BertConfig(**TINY)
    model = BertForPreTraining(config, dtype=numpy.float16).train()
    optimizer = AdamW(model.params, mode="torch")
    scaler = LossScaler(model.xp, init_scale=2.0 ** 40, growth_interval=2)   # overflows
    before = model.buffer.copy()
    _, grads = model.loss_and_grads(batch_of(config, 2, 16, 0), loss_scale=scaler.scale)
    scaler.unscale(grads)
    found_inf = scaler.update(clip_by_global_norm(grads, 1.0, mode="torch"))
    optimizer.step(grads, lr=1e-3, skip=found_inf)
    assert bool(found_inf)
    assert numpy.array_equal(model.buffer, before), "a skipped step changed the weights"
    assert not optimizer.flat_m.any() and not optimizer.flat_v.any()
    assert scaler.state_dict() == {"loss_scale": 2.0 ** 39, "clean_steps": 0}
    scaler.load_state_dict({"loss_scale": 2.0 ** 8, "clean_steps": 0})
    for step in range(2):                 # two clean steps: the scale doubles
        _, grads = model.loss_and_grads(batch_of(config, 2, 16, step), loss_scale=scaler.scale)
        scaler.unscale(grads)
        found_inf = scaler.update(clip_by_global_norm(grads, 1.0, mode="torch"))
        optimizer.step(grads, lr=1e-3, skip=found_inf)
        assert not bool(found_inf)
    assert scaler.state_dict() == {"loss_scale": 2.0 ** 9, "clean_steps": 0}
    assert not numpy.array_equal(model.buffer, before)


def train(dtype, steps, config, seed=0):
    model = BertForPreTraining(config, seed=seed, dtype=dtype).train()
    optimizer = AdamW(model.params, mode="torch", weight_decay=0.01)
    scaler = LossScaler(model.xp) if dtype == numpy.float16 else None
    for step in range(steps):
        model.rng = numpy.random.default_rng([seed, step])
        batch = batch_of(config, 16, 16, 1000 + step)
        scale = None if scaler is None else scaler.scale
        _, grads = model.loss_and_grads(batch, loss_scale=scale)
        if scaler is not None:
            scaler.unscale(grads)
        norm = clip_by_global_norm(grads, 1.0, mode="torch")
        skip = None if scaler is None else scaler.update(norm)
        lr = 2e-3 * min(1.0, (step + 1) / 20)
        optimizer.step(grads, lr=lr, skip=skip)
    model.eval()
    held_out = [batch_of(config, 32, 16, seed) for seed in range(3)]
    return numpy.mean([model.loss(b, return_outputs=True)[1]["mlm_loss"] for b in held_out])


@pytest.mark.parametrize("steps", [300])
def test_float16_training_reaches_the_float32_mlm_loss(steps):
    """The learning check, small: a tiny BERT trained 300 steps from the same start in
    float32 and in float16 (loss scaling, float32 master weights) ends within 0.1 nats of
    the float32 held-out MLM loss (measured 0.005: 2.281 and 2.286), and float32 learned
    (more than a nat below log V = 4.16, the uniform guess)."""
    config = BertConfig(**TINY)
    loss32, loss16 = train(numpy.float32, steps, config), train(numpy.float16, steps, config)
    print(f"held-out MLM loss after {steps} steps: float32 {loss32:.4f}, float16 {loss16:.4f} "
          f"(log V = {numpy.log(config.vocab_size):.2f})")
    record("float16 - float32 held-out MLM loss (nats)", abs(loss16 - loss32))
    assert loss32 < numpy.log(config.vocab_size) - 1.0, loss32
    assert abs(loss16 - loss32) <= 0.1, (loss16, loss32)


def test_float16_checkpoint_saves_the_float32_master_weights(tmp_path):
    model = BertForPreTraining(BertConfig(**TINY), dtype=numpy.float16)
    model.params["cls.predictions.bias"][:] = 1.0 + 2.0 ** -20   # not a float16 number
    model.save_pretrained(tmp_path)
    tensors = safetensors.load_file(tmp_path / "model.safetensors")
    for name, p in model.params.items():
        assert tensors[name].dtype == numpy.float32
        assert numpy.array_equal(tensors[name], p), name
    loaded = BertForPreTraining.from_pretrained(tmp_path, dtype=numpy.float16)
    assert loaded.params["cls.predictions.bias"][0] == numpy.float32(1.0 + 2.0 ** -20)


def test_both_command_lines_train_in_float16_and_save_float32(tmp_path):
    """--dtype float16 end to end: train.py takes steps and checkpoints float32 master
    weights with the loss scale in trainer_state.json; finetune.py's training loss falls and
    best/ holds float32 weights."""
    import json

    import finetune
    from nanobert.formats import safetensors
    from test_finetune import assert_loss_falls, data, make_tiny_bert
    from test_train import run
    out = tmp_path / "pretrain"
    run(tmp_path, out, "--steps", "3", "--dtype", "float16")
    state = json.loads((out / "checkpoint" / "trainer_state.json").read_text())
    assert state["loss_scaler"]["loss_scale"] == 2.0 ** 16, state["loss_scaler"]
    weights = safetensors.load_file(out / "checkpoint" / "model.safetensors")
    assert {w.dtype for w in weights.values()} == {numpy.dtype(numpy.float32)}
    tiny = make_tiny_bert(tmp_path / "tiny")
    tuned = tmp_path / "finetune"
    assert finetune.main(["--glue-task", "sst-2", "--train", data("sst2_train.tsv"), "--dev",
                          data("sst2_dev.tsv"), "--model", tiny, "--out", str(tuned),
                          "--epochs", "20", "--batch-size", "4", "--lr", "1e-3",
                          "--dtype", "float16"]) == 0
    assert_loss_falls(tuned)
    best = safetensors.load_file(tuned / "best" / "model.safetensors")
    assert {w.dtype for w in best.values()} == {numpy.dtype(numpy.float32)}
