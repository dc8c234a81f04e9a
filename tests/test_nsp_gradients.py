"""bench/nsp_gradients.py: the NSP part it reports is the gradient of the NSP loss alone."""
import json
import pathlib

import numpy

import train
from bench import nsp_gradients
from nanobert import BertForPreTraining
from nanobert.data.pretraining_data import PretrainingDataset

ROOT = pathlib.Path(__file__).resolve().parent.parent
BROWN = ROOT / "data" / "brown"


def small_run(tmp_path):
    """Two steps of train.py on the held-out text: a checkpoint and held-out instances."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"vocab_size": 8192, "hidden_size": 32, "num_hidden_layers": 1,
                                  "num_attention_heads": 2, "intermediate_size": 64}))
    out = tmp_path / "run"
    heldout = str(BROWN / "heldout.txt.gz")
    train.main(["--data", heldout, "--heldout", heldout, "--vocab",
                str(BROWN / "vocab-uncased-8192.txt"), "--config", str(config),
                "--dupe-factor", "1", "--max-seq-length", "32", "--batch-size", "8",
                "--steps", "2", "--eval-batches", "1", "--out", str(out)])
    return out


def test_the_nsp_part_is_the_gradient_of_the_nsp_loss_alone(tmp_path, capsys):
    """MLM part + NSP part is the summed loss's gradient by construction; the NSP part must
    also equal the gradient of a batch with no masked-LM labels (the NSP loss alone), and each
    head gets only its own loss's part. Float64, so the subtraction is exact to rounding."""
    out = small_run(tmp_path)
    model = BertForPreTraining.from_pretrained(out / "checkpoint", dtype=numpy.float64)
    dataset = PretrainingDataset(next((out / "data").glob("heldout-*")))
    batch = dataset.batch(numpy.arange(8))
    parts = nsp_gradients.gradient_parts(model, batch)
    no_mlm = {**batch, "labels": numpy.full_like(batch["labels"], train.IGNORE_INDEX)}
    _, nsp_alone = model.loss_and_grads(no_mlm)
    # relative to the largest gradient: the key bias's is zero but for rounding (softmax
    # ignores a shift shared by every key)
    top = max(numpy.abs(g).max() for pair in parts.values() for g in pair)
    for k, (g_mlm, g_nsp) in parts.items():
        assert numpy.allclose(g_nsp, nsp_alone[k], rtol=0, atol=1e-12 * top), k
    assert not parts["cls.seq_relationship.weight"][0].any()            # MLM never reaches it
    assert not parts["cls.predictions.transform.dense.weight"][1].any()  # NSP never reaches it
    query = parts["bert.encoder.layer.0.attention.self.query.weight"]
    assert query[0].any() and query[1].any()                             # both reach the encoder

    assert nsp_gradients.main(["--run", str(out), "--batches", "2", "--batch-size", "8"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("encoder (embeddings and layers): NSP / MLM gradient norm ")
    assert last.endswith("(2 batches)")
