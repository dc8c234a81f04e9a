"""Attention maps: where every head of every layer looks, for one sentence (or an A/B pair),
drawn as a grid of heads (rows) x layers (columns) with the WordPieces on the axes.

    python -m nanobert.attention "The cat sat on the mat." --out attention.png
    python -m nanobert.attention "The cat sat." "It was tired." --model runs/pretrain/checkpoint

Row t of a map is the softmax of position t's query over every key (the model's
`output_attentions=True`); each row sums to 1, and the colour scale is the same, 0 to 1, in
every map. Needs matplotlib: pip install -e ".[plot]".
"""
import os

import numpy

from nanobert import BertModel, flags
from nanobert.backend import to_host
from nanobert.data.tokenizer import BertTokenizer
from nanobert.formats.fileio import atomic_open, output_folder
from nanobert.formats.hub import resolve_model
from nanobert.training.run import run_command, setup_device

PANEL_INCHES = 1.3        # one map's side; longer sentences get more (0.11 in a WordPiece)
DPI = 100


def parse_args(argv=None):
    p = flags.parser(__doc__, prog="python -m nanobert.attention")
    p.add_argument("sentence", help="the text to look at (segment A)")
    p.add_argument("sentence_b", nargs="?", help="an optional second sentence (segment B)")
    flags.add(p, "--model")
    p.add_argument("--out", metavar="PNG", default=os.path.join("runs", "attention.png"),
                   help="the picture to write (default runs/attention.png)")
    flags.add(p, "--device", "--no-tf32")
    return p.parse_args(argv)


def encode(tokenizer, config, sentence, sentence_b=None):
    """[CLS] A [SEP] (B [SEP]) -> (input_ids [1, T], token_type_ids [1, T]); a text longer than
    the model's positions is a ValueError (the picture of a cut sentence would mislead)."""
    encoded = tokenizer(sentence, sentence_b, return_tensors="np")
    T = encoded["input_ids"].shape[1]
    if T > config.max_position_embeddings:
        raise ValueError(f"the text is {T} WordPieces with [CLS] and [SEP], but the model takes "
                         f"at most {config.max_position_embeddings} "
                         f"(max_position_embeddings): give a shorter sentence")
    return encoded["input_ids"], encoded["token_type_ids"]


def attention_maps(model, input_ids, token_type_ids):
    """-> float32 [L, A, T, T] on the host: the attention probabilities of one sequence."""
    attentions = model(input_ids, token_type_ids, output_attentions=True).attentions
    return numpy.stack([to_host(probs[0]) for probs in attentions]).astype(numpy.float32)


def import_pyplot():
    """matplotlib.pyplot with a file-only backend, or one line saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit('error: the attention picture needs matplotlib: '
                         'pip install -e ".[plot]" (or pip install matplotlib)') from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def attention_figure(maps, tokens, title=""):
    """maps [L, A, T, T], tokens (T WordPieces) -> a matplotlib Figure: A rows (heads) x L
    columns (layers) of maps, queries down the left column, keys along the bottom row."""
    plt = import_pyplot()
    L, A, T, _ = maps.shape
    side = max(PANEL_INCHES, 0.11 * T)
    fig, axes = plt.subplots(A, L, figsize=(side * L + 1.5, side * A + 1.2), dpi=DPI,
                             squeeze=False, layout="constrained")
    for a in range(A):
        for layer in range(L):
            ax = axes[a, layer]
            image = ax.imshow(maps[layer, a], vmin=0.0, vmax=1.0, cmap="viridis")
            ax.set_xticks(range(T), tokens if a == A - 1 else [], rotation=90, fontsize=6)
            ax.set_yticks(range(T), tokens if layer == 0 else [], fontsize=6)
            ax.tick_params(length=0)
            if a == 0:
                ax.set_title(f"layer {layer + 1}", fontsize=9)
            if layer == 0:
                ax.set_ylabel(f"head {a + 1}", fontsize=9)
    fig.colorbar(image, ax=axes, shrink=0.3, label="attention (each row sums to 1)")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def draw(args):
    plt = import_pyplot()                        # before the model: fail fast without it
    folder = resolve_model(args.model)
    tokenizer = BertTokenizer.from_pretrained(folder)
    model = BertModel.from_pretrained(folder, device=args.device)
    input_ids, token_type_ids = encode(tokenizer, model.config, args.sentence, args.sentence_b)
    maps = attention_maps(model, input_ids, token_type_ids)
    tokens = tokenizer.convert_ids_to_tokens(input_ids[0].tolist())
    fig = attention_figure(maps, tokens, title=f"{args.model}: attention of each head, row = "
                                               f"query, column = key")
    output_folder(os.path.dirname(args.out) or ".", "--out's folder")
    with atomic_open(args.out, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
    L, A = maps.shape[:2]
    print(f"wrote {args.out}: {A} heads x {L} layers, {len(tokens)} WordPieces: "
          + " ".join(tokens))
    return 0


def main(argv=None):
    args = parse_args(argv)
    args.dtype = "float32"
    setup_device(args)
    return draw(args)


if __name__ == "__main__":
    run_command(main)
