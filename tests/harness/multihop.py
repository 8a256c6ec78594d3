"""A hand-made multi-hop question set with its decompositions, in the shape published data sets give them
(MuSiQue-like chains, comparisons, fan-outs), for the builder's `source: decompositions`.

Real decompositions are written by many annotators, so one relation is named several ways ("person.birth_year",
"person.year_of_birth") and relations that look alike are not the same ("person.month_of_birth",
"person.death_year"). `TRUTH` says which kind names are one relation: what integration should merge, and only
that. The world is made-up (no model knows its facts) and seeded: `questions(n, seed)` is the same every time.
"""

from __future__ import annotations

import random
from typing import Any

RELATIONS: dict[str, tuple[str, str, list[str]]] = {
    # relation: (subject entity, what the answer is, the kind names annotators used)
    "birth_year": ("person", "year", ["person.birth_year", "person.year_of_birth", "person.born_in_year"]),
    "birth_month": ("person", "month", ["person.month_of_birth", "person.birth_month"]),
    "death_year": ("person", "year", ["person.death_year", "person.year_of_death"]),
    "birthplace": ("person", "city", ["person.birthplace", "person.birth_place"]),
    "deathplace": ("person", "city", ["person.place_of_death"]),
    "spouse": ("person", "person", ["person.spouse"]),
    "mother": ("person", "person", ["person.mother"]),
    "father": ("person", "person", ["person.father"]),
    "employer": ("person", "company", ["person.employer", "person.employed_by"]),
    "director": ("film", "person", ["film.director", "film.directed_by", "film.film_director"]),
    "producer": ("film", "person", ["film.producer"]),
    "release_year": ("film", "year", ["film.release_year", "film.year_of_release"]),
    "author": ("book", "person", ["book.author", "book.author_name"]),
    "publication_year": ("book", "year", ["book.publication_year", "book.year_of_publication"]),
    "performer": ("song", "person", ["song.performer", "song.performed_by"]),
    "population": ("city", "number", ["city.population", "city.total_population", "population"]),
    "city_country": ("city", "country", ["city.country", "city.located_in_country"]),
    "mayor": ("city", "person", ["city.mayor"]),
    "capital": ("country", "city", ["country.capital", "country.capital_city"]),
    "currency": ("country", "currency", ["country.currency"]),
    "head_of_state": ("country", "person", ["country.head_of_state"]),
    "founder": ("company", "person", ["company.founder", "company.founded_by"]),
    "founded_year": ("company", "year", ["company.founded_year", "company.year_founded", "company.founding_year"]),
    "headquarters": ("company", "city", ["company.headquarters", "company.headquarters_location"]),
    "members": ("band", "people", ["band.members"]),
}
TRUTH = {kind: relation for relation, (_, _, kinds) in RELATIONS.items() for kind in kinds}
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]  # fmt: skip
_SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "te", "vo", "zi", "da", "fe", "gu", "ho", "ja", "ki", "mu", "no",
              "pe", "qui", "ro", "su", "ta", "ve", "wo", "ya"]  # fmt: skip


def _name(rng: random.Random, parts: int) -> str:
    return " ".join("".join(rng.choice(_SYLLABLES) for _ in range(rng.choice((2, 3)))).title() for _ in range(parts))


def world(seed: int = 0) -> dict[str, dict[str, dict[str, Any]]]:
    rng = random.Random(seed)
    names: set[str] = set()

    def fresh(parts: int, suffix: str = "") -> str:
        while True:
            name = _name(rng, parts) + suffix
            if name not in names:
                names.add(name)
                return name

    people = [fresh(2) for _ in range(240)]
    cities = [fresh(1) for _ in range(40)]
    countries = [fresh(1, "ia") for _ in range(10)]
    tables: dict[str, dict[str, dict[str, Any]]] = {"person": {}, "city": {}, "country": {}, "company": {}}
    for i, country in enumerate(countries):
        tables["country"][country] = {"capital": cities[i], "currency": fresh(1).lower() + " dollar",
                                      "head_of_state": rng.choice(people)}  # fmt: skip
    for i, city in enumerate(cities):
        tables["city"][city] = {"population": rng.randrange(2_000, 9_000_000), "city_country": countries[i % 10],
                                "mayor": rng.choice(people)}  # fmt: skip
    companies = [fresh(1, " " + rng.choice(["Works", "Group", "Studios"])) for _ in range(30)]
    for company in companies:
        tables["company"][company] = {"founder": rng.choice(people), "founded_year": rng.randrange(1850, 2015),
                                      "headquarters": rng.choice(cities)}  # fmt: skip
    for person in people:
        born = rng.randrange(1900, 1990)
        tables["person"][person] = {
            "birth_year": born, "birth_month": rng.choice(MONTHS), "death_year": born + rng.randrange(40, 95),
            "birthplace": rng.choice(cities), "deathplace": rng.choice(cities), "spouse": rng.choice(people),
            "mother": rng.choice(people), "father": rng.choice(people), "employer": rng.choice(companies),
        }  # fmt: skip
    tables["film"] = {fresh(2): {"director": rng.choice(people), "producer": rng.choice(people),
                                 "release_year": rng.randrange(1930, 2020)} for _ in range(60)}  # fmt: skip
    tables["book"] = {fresh(2): {"author": rng.choice(people), "publication_year": rng.randrange(1800, 2020)}
                      for _ in range(50)}  # fmt: skip
    tables["song"] = {fresh(2): {"performer": rng.choice(people)} for _ in range(40)}
    tables["band"] = {fresh(1, "s"): {"members": rng.sample(people, rng.choice((2, 3, 4)))} for _ in range(20)}
    return tables


def _relations_from(entity: str, answer_is: str | None = None) -> list[str]:
    return [r for r, (subject, what, _) in RELATIONS.items() if subject == entity and answer_is in (None, what)]


def questions(n: int, seed: int = 0, argument: str | None = None) -> list[dict[str, Any]]:
    """`n` questions with their decompositions (rows of a decompositions file), shapes mixed as in multi-hop
    sets: chains of 2-4 hops (most), comparisons of two entities, fan-outs over a list, and single hops. Each
    call's argument is named by its entity (`person`), or `argument` for all (a set wrapped with one name)."""
    tables, rng = world(seed), random.Random(f"{seed}:questions")
    rows: list[dict[str, Any]] = []

    def sub(sid: str, relation: str, entity_name: str, depends: list[str]) -> dict[str, Any]:
        subject, _, kinds = RELATIONS[relation]
        answer = tables[subject][entity_name][relation]
        kind = rng.choice(kinds)  # a list answer (a band's members) stays a list, as the file format allows
        value = answer if isinstance(answer, list) else str(answer)
        return {"id": sid, "question": f"What is the {relation.replace('_', ' ')} of {entity_name}?", "kind": kind,
                "arguments": {argument or subject: entity_name}, "answer": value, "depends_on": depends}  # fmt: skip

    def chain(hops: int) -> list[dict[str, Any]]:
        entity = rng.choice(["film", "book", "song", "company", "person", "city"])
        name = rng.choice(sorted(tables[entity]))
        subs: list[dict[str, Any]] = []
        for hop in range(hops):
            last = hop == hops - 1
            choices = [r for r in _relations_from(entity) if last or RELATIONS[r][1] in tables]
            relation = rng.choice(choices)
            subs.append(sub(f"s{hop + 1}", relation, name, [f"s{hop}"] if hop else []))
            entity, name = RELATIONS[relation][1], subs[-1]["answer"]
            if entity not in tables:
                break
        return subs

    while len(rows) < n:
        answer = title = None
        shape = rng.choices(["chain", "compare", "fan", "single"], weights=[6, 2, 1, 1])[0]
        if shape == "chain":
            subs = chain(rng.choice((2, 2, 3, 4)))
        elif shape == "compare":
            relation = rng.choice(["birth_year", "founded_year", "release_year", "population", "publication_year"])
            a, b = rng.sample(sorted(tables[RELATIONS[relation][0]]), 2)
            subs = [sub("a", relation, a, []), sub("b", relation, b, [])]
            smaller = a if int(subs[0]["answer"]) <= int(subs[1]["answer"]) else b
            answer = smaller  # the task's answer is neither sub-problem's
            title = f"Which has the smaller {relation.replace('_', ' ')}: {a} or {b}?"
        elif shape == "fan":
            band = rng.choice(sorted(tables["band"]))
            subs = [sub("m", "members", band, [])]
            relation = rng.choice(_relations_from("person"))
            subs += [sub(f"p{i}", relation, p, ["m"]) for i, p in enumerate(tables["band"][band]["members"])]
            subs[0]["answer"] = ", ".join(subs[0]["answer"]) if rng.random() < 0.5 else subs[0]["answer"]
        else:
            entity = rng.choice(["person", "film", "city", "country"])
            subs = [sub("s1", rng.choice(_relations_from(entity)), rng.choice(sorted(tables[entity])), [])]
        question = title or " then ".join(s["question"] for s in subs)
        rows.append({"id": f"q{len(rows)}", "question": question, "subproblems": subs}
                    | ({"answer": answer} if answer else {}))  # fmt: skip
    return rows


def merge_quality(tools: list[dict[str, Any]]) -> dict[str, float | int]:
    """Pairwise precision and recall of integration against TRUTH: over pairs of kinds, a pair in one tool is
    right when the kinds are one relation; recall counts the pairs of one relation that ended in one tool."""
    together: set[frozenset[str]] = set()
    for tool in tools:
        kinds = sorted(k for k in tool["kinds"] if k in TRUTH)
        together |= {frozenset((a, b)) for i, a in enumerate(kinds) for b in kinds[i + 1 :]}
    seen = sorted({k for tool in tools for k in tool["kinds"] if k in TRUTH})
    same = {frozenset((a, b)) for i, a in enumerate(seen) for b in seen[i + 1 :] if TRUTH[a] == TRUTH[b]}
    right = len(together & same)
    split = {k for k in seen if sum(1 for t in tools if k in t["kinds"]) > 1}
    return {
        "merge_precision": round(right / len(together), 4) if together else 1.0,
        "merge_recall": round(right / len(same), 4) if same else 1.0,
        "false_merges": len(together - same),
        "missed_merges": len(same - together),
        "kinds_in_several_tools": len(split),
    }
