"""Central-difference checks (float64) of the whole pretraining loss (MLM + NSP) with respect
to every parameter tensor, on tiny BERTs whose shapes and batches hypothesis draws:
T = 1, one head, padded rows, a sequence that is all padding but [CLS], repeated token ids,
masked positions at the first and last index, dropout on (with a replayed seed) and off.
"""
import numpy
from hypothesis import assume, example, given, settings, strategies as st

from nanobert import BertConfig, BertForPreTraining
from nanobert.backend import default_rng
from conftest import numerical_grad, record

TOL = 1e-7
ENTRIES_PER_TENSOR = 6      # random entries of each tensor checked (all entries when fewer)


def make_case(seed, batch, seq_len, heads, head_size, layers, vocab, act, dropout):
    config = BertConfig(vocab_size=vocab, hidden_size=heads * head_size, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=5, max_position_embeddings=8,
                        hidden_act=act, hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout)
    model = BertForPreTraining(config, seed=seed, dtype=numpy.float64)
    rng = numpy.random.default_rng(seed)
    for name, p in model.params.items():            # move away from LN=1 / bias=0
        p += 0.1 * rng.standard_normal(p.shape)
    ids = rng.integers(0, vocab, size=(batch, seq_len))          # small vocab: repeated ids
    mask = (rng.random((batch, seq_len)) < 0.7).astype(numpy.int64)
    mask[:, 0] = 1
    mask[0] = numpy.arange(seq_len) == 0            # row 0: padding everywhere but [CLS]
    labels = numpy.full((batch, seq_len), -100)
    labels[0, 0] = ids[0, 0]                        # first index
    labels[-1, -1] = ids[-1, -1]                    # last index
    extra = rng.random((batch, seq_len)) < 0.3
    labels[extra] = rng.integers(0, vocab, size=int(extra.sum()))
    batch_dict = {"input_ids": ids, "token_type_ids": rng.integers(0, 2, size=(batch, seq_len)),
                  "attention_mask": mask, "labels": labels,
                  "next_sentence_label": rng.integers(0, 2, size=batch)}
    return model, batch_dict


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 3), seq_len=st.integers(1, 5),
       heads=st.integers(1, 3), head_size=st.integers(1, 3), layers=st.integers(1, 2),
       vocab=st.integers(3, 9), act=st.sampled_from(["gelu", "gelu_new"]),
       dropout=st.sampled_from([0.0, 0.1]))
@example(seed=0, batch=1, seq_len=1, heads=1, head_size=3, layers=1, vocab=3, act="gelu",
         dropout=0.0)
@example(seed=1, batch=3, seq_len=5, heads=1, head_size=3, layers=2, vocab=4, act="gelu",
         dropout=0.1)
def test_pretraining_loss_gradients_match_central_differences(
        seed, batch, seq_len, heads, head_size, layers, vocab, act, dropout):
    assume(heads * head_size >= 3)      # LayerNorm of 2 features is constant: zero gradients
    model, batch_dict = make_case(seed, batch, seq_len, heads, head_size, layers, vocab, act,
                                  dropout)
    model.train()

    def loss():
        model.rng = default_rng(numpy, 99)          # the same dropout masks every call
        return model.loss_and_grads(batch_dict)[0]

    loss()
    model.rng = default_rng(numpy, 99)
    _, grads = model.loss_and_grads(batch_dict)
    pick = numpy.random.default_rng(seed)
    largest = max(float(numpy.abs(g).max()) for g in grads.values())
    for name, p in model.params.items():
        candidates = numpy.arange(p.size)
        if name == "bert.embeddings.word_embeddings.weight":
            # the [PAD] row (id 0) takes no gradient through the lookup, as HF's
            # nn.Embedding(padding_idx=0); tests/test_heads.py checks that row on its own
            candidates = candidates[p.shape[1]:]
        n = len(candidates)
        index = (candidates if n <= ENTRIES_PER_TENSOR
                 else pick.choice(candidates, ENTRIES_PER_TENSOR, replace=False))
        numeric = numerical_grad(loss, p, index, h=3e-5, five_point=True)
        analytic = grads[name].reshape(-1)[index]
        # relative to the whole tensor's gradient, so entries near 0 don't divide by ~0; and
        # at least 1e-2 of the largest gradient: a key bias's gradient is exactly 0 (softmax
        # ignores a shift shared by all keys), both sides hold only rounding noise.
        scale = max(float(numpy.abs(grads[name]).max()), 1e-2 * largest)
        err = numpy.abs(analytic - numeric).max() / scale
        record("grad pretraining loss, every parameter", err)
        assert err <= TOL, f"{name}: relative error {err:.3e}"
