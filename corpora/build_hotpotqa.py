"""Build the bundled HotpotQA-format default set: two-hop questions about fictional entities.

Real HotpotQA cannot be downloaded on every machine, so `trace/HotpotQA-v0` ships a
small stand-in built deterministically by this script. It is *HotpotQA-format*, not
HotpotQA: every record has the original fields (``_id``, ``question``, ``answer``,
``type`` bridge/comparison, ``level``, ``supporting_facts`` [[title, sent_id]...],
``context`` [[title, [sentences]]...] with 2 gold + 8 distractor paragraphs), and the
passages form a wiki-18-style corpus (``{"id", "contents": "\\"Title\\"\\ntext"}``).
Every entity (towns, people, films, companies, bands) is invented, so a language model
cannot answer from memory: the answer is only in the corpus, and the bridge entity only
in the first-hop passage.

Regenerate the bundled files (byte-identical for the same seed) with::

    python -m trace_gym.corpora.build_hotpotqa

`generate_world(...)` is also used by the retrieval benchmark to pad a corpus to 100k
passages. The question and sentence templates below are the source of truth that the
scripted policy in `trace_gym.envs.hotpotqa.scripted` parses.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trace_gym.cli import Parser

HERE = Path(__file__).resolve().parent
QUESTIONS_FILE = HERE / "hotpotqa_default.jsonl.gz"
CORPUS_FILE = HERE / "hotpotqa_default_corpus.jsonl.gz"
DEFAULT_SEED = 20260

_ONSETS = [
    "b",
    "d",
    "f",
    "g",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "kr",
    "tr",
    "st",
    "th",
    "sh",
    "ch",
    "gl",
    "pl",
    "vr",
    "qu",
    "h",
    "j",
    "y",
    "w",
]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou", "ia", "y"]
_CODAS = ["", "", "", "n", "r", "l", "s", "th", "m", "nd", "rk", "sk", "x", "lt"]
_ADJ = [
    "Silent",
    "Crimson",
    "Hollow",
    "Gilded",
    "Broken",
    "Distant",
    "Quiet",
    "Burning",
    "Pale",
    "Endless",
    "Hidden",
    "Iron",
    "Velvet",
    "Frozen",
    "Scarlet",
    "Wandering",
    "Copper",
    "Bitter",
    "Golden",
    "Lonely",
    "Restless",
    "Shattered",
    "Amber",
    "Midnight",
    "Wild",
    "Salt",
    "Paper",
    "Glass",
    "Northern",
    "Sunken",
]
_NOUN = [
    "Harbor",
    "Lantern",
    "Orchard",
    "Meridian",
    "Tide",
    "Citadel",
    "Garden",
    "Compass",
    "Archive",
    "Frontier",
    "Mirror",
    "Cathedral",
    "Voyage",
    "Ember",
    "Horizon",
    "Labyrinth",
    "Signal",
    "Summit",
    "Threshold",
    "Canyon",
    "Reverie",
    "Monument",
    "Pilgrim",
    "Tempest",
    "Chorus",
    "Atlas",
    "Beacon",
    "Carnival",
    "Delta",
    "Eclipse",
]
_PLURAL = [
    "Wolves",
    "Sparrows",
    "Pilots",
    "Saints",
    "Engines",
    "Ravens",
    "Tailors",
    "Comets",
    "Drifters",
    "Keepers",
    "Rivals",
    "Hermits",
    "Giants",
    "Lanterns",
    "Foxes",
    "Sailors",
]
_SUFFIX = [
    "Industries",
    "Holdings",
    "Works",
    "Systems",
    "Foods",
    "Motors",
    "Textiles",
    "Labs",
    "Shipping",
    "Mills",
    "Brewing",
    "Optics",
    "Instruments",
    "Press",
    "Logistics",
]
_FILM_GENRES = [
    "drama",
    "comedy",
    "thriller",
    "documentary",
    "science fiction",
    "western",
    "musical",
    "horror",
]
_BAND_GENRES = ["rock", "folk", "jazz", "punk", "electronic", "blues", "indie pop", "metal"]
_INDUSTRIES = [
    "textile",
    "shipping",
    "software",
    "food",
    "automotive",
    "publishing",
    "brewing",
    "optics",
]
_OCCUPATIONS = {
    "director": "film director",
    "singer": "singer",
    "founder": "businessperson",
    "writer": "novelist",
    "painter": "painter",
    "chemist": "chemist",
}
_FILLER = [
    "{n} studied at the conservatory in {t} before moving abroad.",
    "{n} has been married twice and has three children.",
    "In later life {n} taught evening classes at a local college.",
    "{n} received a regional award for lifetime achievement.",
    "Critics have described the early work of {n} as uneven but ambitious.",
]

# --------------------------------------------------------------------------- templates
#: bridge questions: (name, first-hop kind, relation to the bridge entity, attribute asked)
BRIDGE_TEMPLATES: dict[str, str] = {
    "film_director_birthplace": "In which town was the director of the film {e} born?",
    "film_director_birthyear": "In what year was the director of the film {e} born?",
    "company_founder_birthplace": "In which town was the founder of {e} born?",
    "band_singer_birthyear": "In what year was the lead singer of the band {e} born?",
    "person_birthplace_river": "Which river flows through the birthplace of {e}?",
    "company_hq_province": "In which province is the town where {e} has its headquarters?",
    "film_location_founded": "In what year was the town where the film {e} was shot founded?",
    "band_origin_province": "In which province is the town where the band {e} was formed?",
}
#: comparison questions over two entities of one kind
COMPARISON_TEMPLATES: dict[str, str] = {
    "person_born_first": "Who was born first, {a} or {b}?",
    "town_larger_population": "Which town has the larger population, {a} or {b}?",
    "film_released_first": "Which film was released earlier, {a} or {b}?",
    "company_founded_first": "Which company was founded earlier, {a} or {b}?",
}


@dataclass
class Entity:
    """One fictional entity: a title, its passage sentences and its attributes."""

    kind: str
    title: str
    attrs: dict[str, Any] = field(default_factory=dict)
    sentences: list[str] = field(default_factory=list)


@dataclass
class World:
    """All entities of a generated corpus, by kind."""

    entities: dict[str, list[Entity]]

    def all(self) -> list[Entity]:
        return [e for kind in sorted(self.entities) for e in self.entities[kind]]


class _Names:
    """Unique pronounceable fictional names from a seeded generator."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.used: set[str] = set()

    def word(self, syllables: int) -> str:
        parts = [self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(syllables)]
        return ("".join(parts) + self.rng.choice(_CODAS)).capitalize()

    def unique(self, make) -> str:
        for _ in range(1000):
            name = make()
            if name not in self.used:
                self.used.add(name)
                return name
        raise RuntimeError("name space exhausted; add syllables")

    def person(self) -> str:
        return self.unique(
            lambda: (
                f"{self.word(int(self.rng.integers(2, 4)))} {self.word(int(self.rng.integers(2, 4)))}"
            )
        )

    def town(self) -> str:
        return self.unique(
            lambda: (
                self.word(int(self.rng.integers(2, 4)))
                + str(self.rng.choice(["", "", "ford", "holm", "vik", "stead", "ton"]))
            )
        )

    def film(self) -> str:
        return self.unique(
            lambda: (
                f"The {self.rng.choice(_ADJ)} {self.rng.choice(_NOUN)}"
                if self.rng.random() < 0.3
                else f"{self.rng.choice(_ADJ)} {self.rng.choice(_NOUN)} of {self.word(2)}"
            )
        )

    def company(self) -> str:
        return self.unique(
            lambda: f"{self.word(int(self.rng.integers(2, 4)))} {self.rng.choice(_SUFFIX)}"
        )

    def band(self) -> str:
        return self.unique(
            lambda: (
                f"The {self.rng.choice(_ADJ)} {self.rng.choice(_PLURAL)}"
                if self.rng.random() < 0.3
                else f"{self.word(2)} {self.rng.choice(_PLURAL)}"
            )
        )


def generate_world(seed: int = DEFAULT_SEED, scale: float = 1.0) -> World:
    """Generate towns, people, films, companies and bands (about 3,100 passages at scale 1).

    One generator draws everything, kind after kind in this order, so a seed gives the
    same world (and the committed corpus files stay reproducible).
    """
    rng = np.random.default_rng(seed)
    names = _Names(rng)
    n = {
        k: max(4, int(round(v * scale)))
        for k, v in {"town": 500, "person": 1400, "film": 600, "company": 350, "band": 250}.items()
    }
    provinces = [names.unique(lambda: names.word(3)) for _ in range(24)]
    rivers = [names.unique(lambda: names.word(2)) for _ in range(80)]
    towns = [_town(rng, names, provinces, rivers) for _ in range(n["town"])]
    people = _people(rng, names, n["person"], towns)
    by_role: dict[str, list[Entity]] = {}
    for p in people:
        by_role.setdefault(p.attrs["role"], []).append(p)
    films = [_film(rng, names, by_role["director"], towns) for _ in range(n["film"])]
    companies = [_company(rng, names, by_role["founder"], towns) for _ in range(n["company"])]
    bands = [_band(rng, names, by_role["singer"], towns) for _ in range(n["band"])]
    return World(
        {"town": towns, "person": people, "film": films, "company": companies, "band": bands}
    )


def _pick(rng: np.random.Generator, pool: list[Entity]) -> Entity:
    return pool[int(rng.integers(len(pool)))]


def _town(
    rng: np.random.Generator, names: _Names, provinces: list[str], rivers: list[str]
) -> Entity:
    t = names.town()
    a = {
        "province": str(rng.choice(provinces)),
        "river": str(rng.choice(rivers)),
        "founded": int(rng.integers(1100, 1900)),
        "population": int(rng.integers(2_000, 900_000)),
    }
    return Entity(
        "town",
        t,
        a,
        [
            f"{t} is a town in the province of {a['province']}.",
            f"It lies on the banks of the {a['river']} River.",
            f"The town was founded in {a['founded']}.",
            f"At the last census {t} had a population of {a['population']}.",
        ],
    )


def _people(
    rng: np.random.Generator, names: _Names, count: int, towns: list[Entity]
) -> list[Entity]:
    """`count` people: the first 80% cycle through the occupations, the rest draw one."""
    roles = list(_OCCUPATIONS)
    people = []
    for i in range(count):
        p = names.person()
        role = roles[i % len(roles)] if i < count * 0.8 else str(rng.choice(roles[3:]))
        home = towns[int(rng.integers(len(towns)))]
        a = {"role": role, "born": int(rng.integers(1890, 2000)), "birthplace": home.title}
        filler = str(rng.choice(_FILLER)).format(n=p, t=towns[int(rng.integers(len(towns)))].title)
        sentences = [
            f"{p} (born {a['born']}) is a {_OCCUPATIONS[role]}.",
            f"{p} was born in {home.title}.",
            filler,
        ]
        people.append(Entity("person", p, a, sentences))
    return people


def _film(
    rng: np.random.Generator, names: _Names, directors: list[Entity], towns: list[Entity]
) -> Entity:
    f, d, loc = names.film(), _pick(rng, directors), _pick(rng, towns)
    a = {
        "year": int(rng.integers(1930, 2024)),
        "director": d.title,
        "location": loc.title,
        "genre": str(rng.choice(_FILM_GENRES)),
    }
    return Entity(
        "film",
        f,
        a,
        [
            f"{f} is a {a['year']} {a['genre']} film.",
            f"It was directed by {d.title}.",
            f"The film was shot in {loc.title}.",
        ],
    )


def _company(
    rng: np.random.Generator, names: _Names, founders: list[Entity], towns: list[Entity]
) -> Entity:
    c, fo, hq = names.company(), _pick(rng, founders), _pick(rng, towns)
    a = {
        "founded": int(rng.integers(1850, 2020)),
        "founder": fo.title,
        "hq": hq.title,
        "industry": str(rng.choice(_INDUSTRIES)),
    }
    return Entity(
        "company",
        c,
        a,
        [
            f"{c} is a {a['industry']} company founded in {a['founded']}.",
            f"It was founded by {fo.title}.",
            f"Its headquarters are in {hq.title}.",
        ],
    )


def _band(
    rng: np.random.Generator, names: _Names, singers: list[Entity], towns: list[Entity]
) -> Entity:
    b, s, origin = names.band(), _pick(rng, singers), _pick(rng, towns)
    a = {
        "formed": int(rng.integers(1955, 2020)),
        "singer": s.title,
        "origin": origin.title,
        "genre": str(rng.choice(_BAND_GENRES)),
    }
    return Entity(
        "band",
        b,
        a,
        [
            f"{b} is a {a['genre']} band.",
            f"The band was formed in {origin.title} in {a['formed']}.",
            f"Its lead singer is {s.title}.",
        ],
    )


def passage_contents(e: Entity) -> str:
    """wiki-18 `contents`: the quoted title on the first line, then the text."""
    return f'"{e.title}"\n' + " ".join(e.sentences)


# --------------------------------------------------------------------------- questions
def _bridge(kind: str, first: Entity, idx: dict[str, Entity]) -> tuple[str, list, Entity]:
    """(answer, supporting facts, second-hop entity) of one bridge template on `first`."""
    a = first.attrs
    if kind == "film_director_birthplace":
        d = idx[a["director"]]
        return d.attrs["birthplace"], [[first.title, 1], [d.title, 1]], d
    if kind == "film_director_birthyear":
        d = idx[a["director"]]
        return str(d.attrs["born"]), [[first.title, 1], [d.title, 0]], d
    if kind == "company_founder_birthplace":
        f = idx[a["founder"]]
        return f.attrs["birthplace"], [[first.title, 1], [f.title, 1]], f
    if kind == "band_singer_birthyear":
        s = idx[a["singer"]]
        return str(s.attrs["born"]), [[first.title, 2], [s.title, 0]], s
    if kind == "person_birthplace_river":
        t = idx[a["birthplace"]]
        return f"{t.attrs['river']} River", [[first.title, 1], [t.title, 1]], t
    if kind == "company_hq_province":
        t = idx[a["hq"]]
        return t.attrs["province"], [[first.title, 2], [t.title, 0]], t
    if kind == "film_location_founded":
        t = idx[a["location"]]
        return str(t.attrs["founded"]), [[first.title, 2], [t.title, 2]], t
    if kind == "band_origin_province":
        t = idx[a["origin"]]
        return t.attrs["province"], [[first.title, 1], [t.title, 0]], t
    raise KeyError(kind)


_BRIDGE_FIRST_KIND = {
    "film_director_birthplace": "film",
    "film_director_birthyear": "film",
    "company_founder_birthplace": "company",
    "band_singer_birthyear": "band",
    "person_birthplace_river": "person",
    "company_hq_province": "company",
    "film_location_founded": "film",
    "band_origin_province": "band",
}
#: comparison template -> (entity kind, attribute, True when the smaller value wins, sentence id)
_COMPARISON = {
    "person_born_first": ("person", "born", True, 0),
    "town_larger_population": ("town", "population", False, 3),
    "film_released_first": ("film", "year", True, 0),
    "company_founded_first": ("company", "founded", True, 0),
}


def generate_questions(world: World, num_bridge: int, num_comparison: int, seed: int) -> list[dict]:
    """HotpotQA-format records (2 gold + 8 distractor context paragraphs each)."""
    rng = np.random.default_rng(seed + 1)
    idx = {e.title: e for e in world.all()}
    everything = world.all()
    out: list[dict] = []
    used: set[tuple] = set()
    bridge_kinds = list(BRIDGE_TEMPLATES)
    while len(out) < num_bridge:
        kind = bridge_kinds[len(out) % len(bridge_kinds)]
        pool = world.entities[_BRIDGE_FIRST_KIND[kind]]
        first = pool[int(rng.integers(len(pool)))]
        if (kind, first.title) in used:
            continue
        used.add((kind, first.title))
        answer, sp, second = _bridge(kind, first, idx)
        out.append(
            _record(
                f"bridge-{kind}",
                BRIDGE_TEMPLATES[kind].format(e=first.title),
                answer,
                "bridge",
                sp,
                [first, second],
                everything,
                rng,
            )
        )
    comp_kinds = list(COMPARISON_TEMPLATES)
    n_comp = 0
    while n_comp < num_comparison:
        kind = comp_kinds[n_comp % len(comp_kinds)]
        ek, attr, smaller, sid = _COMPARISON[kind]
        pool = world.entities[ek]
        i, j = (int(x) for x in rng.choice(len(pool), size=2, replace=False))
        a, b = pool[i], pool[j]
        if a.attrs[attr] == b.attrs[attr] or (kind, a.title, b.title) in used:
            continue
        used.add((kind, a.title, b.title))
        win = a if (a.attrs[attr] < b.attrs[attr]) == smaller else b
        q = COMPARISON_TEMPLATES[kind].format(a=a.title, b=b.title)
        out.append(
            _record(
                f"comparison-{kind}",
                q,
                win.title,
                "comparison",
                [[a.title, sid], [b.title, sid]],
                [a, b],
                everything,
                rng,
            )
        )
        n_comp += 1
    order = rng.permutation(len(out))
    records = [out[int(k)] for k in order]
    for k, r in enumerate(records):
        r["_id"] = f"syn-{k:04d}"
    return records


def _record(
    template: str,
    question: str,
    answer: str,
    qtype: str,
    sp: list,
    gold: list[Entity],
    everything: list[Entity],
    rng: np.random.Generator,
) -> dict:
    gold_titles = {g.title for g in gold}
    distractors: list[Entity] = []
    while len(distractors) < 8:
        e = everything[int(rng.integers(len(everything)))]
        if e.title not in gold_titles and e not in distractors:
            distractors.append(e)
    # as in real HotpotQA, every sentence after the first keeps its leading space
    context = [
        [e.title, [s if k == 0 else " " + s for k, s in enumerate(e.sentences)]]
        for e in gold + distractors
    ]
    perm = rng.permutation(len(context))
    return {
        "_id": "",
        "question": question,
        "answer": answer,
        "type": qtype,
        "level": "medium",
        "template": template,
        "supporting_facts": sp,
        "context": [context[int(k)] for k in perm],
    }


def corpus_rows(world: World, seed: int, prefix: str = "syn") -> list[dict]:
    """The world's passages as wiki-18 rows, in a seeded shuffled order."""
    ents = world.all()
    perm = np.random.default_rng(seed + 2).permutation(len(ents))
    return [
        {"id": f"{prefix}-p{k:06d}", "contents": passage_contents(ents[int(i)])}
        for k, i in enumerate(perm)
    ]


def _write_gz_jsonl(path: Path, rows: list[dict]) -> None:
    # mtime=0 keeps the gzip bytes identical across rebuilds
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        for r in rows:
            gz.write((json.dumps(r, ensure_ascii=False) + "\n").encode("utf-8"))


def build(
    out_dir: Path = HERE, seed: int = DEFAULT_SEED, num_bridge: int = 320, num_comparison: int = 60
) -> tuple[Path, Path]:
    """Write the question and corpus files; returns their paths."""
    world = generate_world(seed)
    questions = generate_questions(world, num_bridge, num_comparison, seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    qpath, cpath = out_dir / QUESTIONS_FILE.name, out_dir / CORPUS_FILE.name
    _write_gz_jsonl(qpath, questions)
    _write_gz_jsonl(cpath, corpus_rows(world, seed))
    return qpath, cpath


def main(argv: list[str] | None = None) -> int:
    """Regenerate the bundled HotpotQA-format files."""
    ap = Parser(description=main.__doc__)
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--bridge", type=int, default=320)
    ap.add_argument("--comparison", type=int, default=60)
    args = ap.parse_args(argv)
    q, c = build(args.out, args.seed, args.bridge, args.comparison)
    print(f"wrote {q} ({q.stat().st_size:,} bytes) and {c} ({c.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
