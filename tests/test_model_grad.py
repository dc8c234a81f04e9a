"""Central-difference checks (float64) of the whole pretraining loss (MLM + NSP) with respect
to every parameter tensor, on tiny BERTs whose shapes and batches hypothesis draws
(nanobert.testing.bert_cases): T = 1, one head, padded rows, a sequence that is all padding
but [CLS], repeated token ids, masked positions at the first and last index, dropout on (with
a replayed seed) and off. The check is nanobert.testing.check_model_gradients.
"""
import numpy
from hypothesis import example, given, settings, strategies as st

from nanobert import BertForPreTraining
from nanobert.testing import bert_cases, check_model_gradients, make_batch, tiny_bert_config
from conftest import record_errors

TOL = 1e-7
ENTRIES_PER_TENSOR = 6      # random entries of each tensor checked (all entries when fewer)


def case(seed, batch, seq_len, **config):
    config = tiny_bert_config(**config)
    return config, make_batch(numpy.random.default_rng(seed), config, "pretraining", batch, seq_len)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1),
       case=bert_cases("pretraining", vocab_size=(3, 9), heads=(1, 3), head_size=(1, 3),
                       layers=(1, 2), dropout=[0.0, 0.1]))
@example(seed=0, case=case(0, batch=1, seq_len=1, heads=1, head_size=3, layers=1, vocab_size=3))
@example(seed=1, case=case(1, batch=3, seq_len=5, heads=1, head_size=3, layers=2, vocab_size=4,
                           dropout=0.1))
def test_pretraining_loss_gradients_match_central_differences(seed, case):
    config, batch = case
    model = BertForPreTraining(config, seed=seed, dtype=numpy.float64).train()
    rng = numpy.random.default_rng(seed)
    for p in model.params.values():                 # move away from LN = 1 / bias = 0
        p += 0.1 * rng.standard_normal(p.shape)
    # the [PAD] row is not d loss / d row (padding_idx, as HF); tests/test_heads.py checks it
    record_errors("grad pretraining loss, every parameter",
                  check_model_gradients(model, batch, seed=seed, entries=ENTRIES_PER_TENSOR,
                                        tol=TOL))
