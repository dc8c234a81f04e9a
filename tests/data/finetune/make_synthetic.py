"""Writes the synthetic QA and multiple-choice files beside this script (no real SQuAD / SWAG
data is available offline). Invented towns, each with a founder, a founding year, a river
and a trade, stated at random places among filler sentences:

  squad_synthetic_{train,dev}.json   SQuAD v2.0: 5 questions per paragraph (4 answerable, 1
                                     about a fact the paragraph never states); at
                                     --max-seq-length 96 --doc-stride 32 each paragraph
                                     (~130 WordPieces) needs 2-4 windows, so answers fall in
                                     several windows and across window edges
  swag_synthetic_{train,dev}.csv     SWAG columns: sent1 states a fact, sent2 starts a
                                     sentence about it, one of four endings completes it

The dev files use towns that never occur in training. Regenerate: python make_synthetic.py
"""
import csv
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
SYLLABLES = ["var", "len", "hol", "dor", "mis", "tra", "bel", "kor", "sun", "wick", "ham", "ton",
             "ford", "mere", "by", "stad", "vik", "gard", "lin", "ros"]
FIRST = ["Anna", "Pieter", "Mara", "Johan", "Elise", "Tomas", "Ida", "Hugo", "Lena", "Oskar",
         "Greta", "Emil", "Nora", "Felix", "Clara", "Viktor"]
LAST = ["Brandt", "Holm", "Castellan", "Wren", "Dalby", "Okafor", "Marsh", "Lindqvist", "Ferreira",
        "Novak", "Ashdown", "Kowal"]
RIVERS = ["Olm", "Serra", "Blackwater", "Tane", "Vesk", "Amber", "Lune", "Corrin", "Drava",
          "Whitmoor"]
GOODS = ["blue pottery", "smoked eel", "clockmaking", "wool blankets", "rye bread", "glass beads",
         "copper kettles", "rope", "cider", "salt"]
FILLERS = [
    "The streets are narrow and paved with grey stone.",
    "Visitors often arrive by the morning train from the coast.",
    "In winter the hills around it are covered in snow for weeks.",
    "A market is held in the main square every Saturday.",
    "Most of the old houses have steep red roofs.",
    "The local school was rebuilt after a fire in the last century.",
    "Summers are short but warm, and the evenings are long.",
    "Several footpaths lead from the centre into the forest.",
    "The town hall has a clock tower that can be seen from far away.",
    "Fishing boats still leave the harbour before dawn.",
    "A small museum displays tools, maps and old photographs.",
    "Many families have lived there for generations.",
    "The library is open every day except Sunday.",
    "A stone bridge connects the two halves of the old quarter.",
    "Festivals with music and dancing take place in late summer.",
    "The surrounding farmland produces barley and potatoes.",
]
UNSTATED = ["What is the population of {t}?", "Which mountain overlooks {t}?",
            "Who is the mayor of {t}?"]


def towns(rng, n, taken):
    out = []
    while len(out) < n:
        name = "".join(rng.sample(SYLLABLES, 2)).capitalize()
        if name not in taken:
            taken.add(name)
            out.append(name)
    return out


def facts(rng, town):
    return {"town": town, "founder": f"{rng.choice(FIRST)} {rng.choice(LAST)}",
            "year": str(rng.randint(1150, 1890)), "river": rng.choice(RIVERS),
            "good": rng.choice(GOODS)}


def squad_paragraph(rng, f):
    t = f["town"]
    stated = [(f"{t} was founded in {f['year']} by {f['founder']}.",
               [(f"When was {t} founded?", f["year"]), (f"Who founded {t}?", f["founder"])]),
              (f"The river {f['river']} flows through {t}.",
               [(f"Which river flows through {t}?", f["river"])]),
              (f"Today {t} is best known for its {f['good']}.",
               [(f"What is {t} best known for?", f["good"])])]
    sentences = rng.sample(FILLERS, 9)
    for sentence, _ in stated:
        sentences.insert(rng.randint(0, len(sentences)), sentence)
    context = " ".join(sentences)
    qas = []
    for sentence, questions in stated:
        for question, answer in questions:
            start = context.index(answer, context.index(sentence))
            qas.append({"id": f"{t.lower()}-{len(qas)}", "question": question,
                        "answers": [{"text": answer, "answer_start": start}],
                        "is_impossible": False})
    qas.append({"id": f"{t.lower()}-{len(qas)}", "question": rng.choice(UNSTATED).format(t=t),
                "answers": [], "is_impossible": True})
    return {"context": context, "qas": qas}


def swag_rows(rng, f, start_id):
    t = f["town"]
    founders = [f"{a} {b}" for a, b in zip(rng.sample(FIRST, 6), rng.sample(LAST, 6))]
    items = [(f"{t} was founded in {f['year']} by {f['founder']}.", "Its founder was",
              f["founder"], founders),
             (f"The river {f['river']} flows through {t}.",
              "The river that flows through it is the", f["river"], RIVERS),
             (f"Today {t} is best known for its {f['good']}.", "People come to the town for its",
              f["good"], GOODS)]
    rows = []
    for sent1, sent2, right, pool in items:
        wrong = [x for x in rng.sample(pool, len(pool)) if x != right][:3]
        endings = wrong + [right + "."]
        endings[:3] = [w + "." for w in endings[:3]]
        rng.shuffle(endings)
        rows.append([start_id + len(rows), f"synthetic{start_id}", 0, f"{sent1} {sent2}", sent1,
                     sent2, "gold", *endings, endings.index(right + ".")])
    return rows


def main():
    rng = random.Random(2018)
    taken = set()
    for split, n in (("train", 30), ("dev", 10)):
        paragraphs = [squad_paragraph(rng, facts(rng, t)) for t in towns(rng, n, taken)]
        squad = {"version": "v2.0",
                 "data": [{"title": "synthetic towns", "paragraphs": paragraphs}]}
        with open(os.path.join(HERE, f"squad_synthetic_{split}.json"), "w", encoding="utf-8") as f:
            json.dump(squad, f, indent=1)
    for split, n in (("train", 80), ("dev", 20)):
        rows = []
        for t in towns(rng, n, taken):
            rows += swag_rows(rng, facts(rng, t), len(rows))
        path = os.path.join(HERE, f"swag_synthetic_{split}.csv")
        with open(path, "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["", "video-id", "fold-ind", "startphrase", "sent1", "sent2",
                             "gold-source", "ending0", "ending1", "ending2", "ending3", "label"])
            writer.writerows(rows)


if __name__ == "__main__":
    main()
