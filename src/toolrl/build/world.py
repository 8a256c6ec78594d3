"""Sources that need no LLM: tables of entities (a seeded synthetic world, or the user's files), and the tasks
of the four scenarios drawn from them with exact ground truth.

Tables map an entity type to its rows by name; each row's columns are relations (`person.birthplace`). A cell
that names a row of a table is a link, and links are what multi-hop tasks follow: "What is the currency of the
country of the birthplace of the person Orla Veskin?" needs three dependent calls.
"""

from __future__ import annotations

import csv
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolrl.build.artifacts import BuiltTask, FactRow, SubProblem
from toolrl.build.spec import BuildSpec, SyntheticSource, TableSource
from toolrl.errors import DataError

Tables = dict[str, dict[str, dict[str, Any]]]
"""entity type -> row name -> column -> value."""

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kl", "st", "th", "tr"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "nd", "rk", "sk"]


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)).title()


def _names(rng: random.Random, count: int, make) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        name = make(rng)
        if name not in names:
            names.append(name)
    return names


def synthetic_world(seed: int, size: SyntheticSource) -> Tables:
    """People, cities, countries and companies with made-up names, linked (birthplace, employer, headquarters,
    founder, country, capital): every fact is the world's own, so no model knows it without the tools."""
    rng = random.Random(seed)
    countries = _names(rng, size.countries, lambda r: _word(r, 2) + r.choice(["ia", "land", "mark", "ora"]))
    cities = _names(rng, size.cities, lambda r: _word(r, 2))
    people = _names(rng, size.people, lambda r: f"{_word(r, 1)} {_word(r, 2)}")
    suffixes = ["Works", "Labs", "Foods", "Motors", "Textiles", "Bank"]
    companies = _names(rng, size.companies, lambda r: f"{_word(r, 2)} {r.choice(suffixes)}")
    currencies = _names(rng, size.countries, lambda r: f"{_word(r, 1).lower()} {r.choice(['crown', 'mark', 'florin'])}")
    tables: Tables = {"country": {}, "city": {}, "person": {}, "company": {}}
    city_country = {city: countries[i % len(countries)] for i, city in enumerate(cities)}
    for i, country in enumerate(countries):
        own = [c for c in cities if city_country[c] == country]
        tables["country"][country] = {"capital": rng.choice(own), "currency": currencies[i]}
    for city in cities:
        tables["city"][city] = {"country": city_country[city], "population": rng.randrange(20, 3000) * 1000}
    for company in companies:
        tables["company"][company] = {"headquarters": rng.choice(cities), "founder": rng.choice(people)}
    for person in people:
        tables["person"][person] = {
            "birthplace": rng.choice(cities),
            "employer": rng.choice(companies),
            "birth year": rng.randrange(1940, 2006),
        }
    return tables


def _table_rows(path: Path) -> list[dict[str, Any]]:
    text_suffix = path.suffix.lower()
    try:
        if text_suffix == ".csv":
            with path.open(encoding="utf-8", newline="") as f:
                return list(csv.DictReader(f))
        if text_suffix == ".jsonl":
            from toolrl.files import read_jsonl

            return read_jsonl(path, DataError)
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, csv.Error) as exc:
        raise DataError(f"{path}: cannot be read as a table ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, list):
        raise DataError(f"{path}: a JSON table is a list of objects, one per row")
    return data


def load_tables(sources: list[TableSource], base: Path | None = None) -> Tables:
    """The user's tables; a row without its key, a duplicate name, or an empty table is one line naming the
    file and the row."""
    tables: Tables = {}
    for source in sources:
        path = Path(source.path).expanduser()
        if base is not None and not path.is_absolute():
            path = base / path
        if not path.is_file():
            raise DataError(f"{path}: table not found (tables[].path)")
        rows = _table_rows(path)
        if not rows:
            raise DataError(f"{path}: the table has no rows")
        entity = (source.entity or path.stem).strip().lower()
        table = tables.setdefault(entity, {})
        for number, row in enumerate(rows, 1):
            if not isinstance(row, dict):
                raise DataError(f"{path}: row {number} is not an object of columns")
            key = source.key or next(iter(row))
            name = str(row.get(key) or "").strip()
            if not name:
                raise DataError(f"{path}: row {number}, field {key}: empty; every row needs its name")
            if name in table:
                raise DataError(f"{path}: row {number}, field {key}: {name!r} appears twice")
            table[name] = {
                str(c).strip(): v for c, v in row.items() if c != key and v not in (None, "") and str(c).strip()
            }
    return tables


@dataclass(frozen=True)
class Relation:
    entity: str
    column: str
    target: str | None
    """The entity type its values name (a link), or None for a plain value."""

    @property
    def kind(self) -> str:
        return f"{self.entity}.{self.column}"


def relations(tables: Tables) -> list[Relation]:
    found = []
    for entity, rows in tables.items():
        columns = sorted({c for row in rows.values() for c in row})
        for column in columns:
            values = [str(row[column]) for row in rows.values() if column in row]
            target = next((t for t, trows in tables.items() if values and all(v in trows for v in values)), None)
            found.append(Relation(entity, column, target))
    return found


def facts(tables: Tables) -> dict[str, list[FactRow]]:
    """Every relation as the table of the function that answers it: kind -> rows (arguments, answer)."""
    return {
        rel.kind: [
            FactRow(arguments={rel.entity: name}, answer=str(row[rel.column]))
            for name, row in tables[rel.entity].items()
            if rel.column in row
        ]
        for rel in relations(tables)
    }


def _phrase(rel: Relation, subject: str) -> str:
    return f"the {rel.column} of {subject}"


class TaskSampler:
    """Draws tasks of each scenario from the tables: chains follow links; answers are looked up, never guessed."""

    def __init__(self, tables: Tables, rng: random.Random):
        self.tables, self.rng = tables, rng
        self.relations = relations(tables)
        self.links = [r for r in self.relations if r.target]
        self.by_entity: dict[str, list[Relation]] = {}
        for rel in self.relations:
            self.by_entity.setdefault(rel.entity, []).append(rel)

    def _start(self, rel: Relation) -> str:
        return self.rng.choice([name for name, row in self.tables[rel.entity].items() if rel.column in row])

    def single(self, prefix: str) -> tuple[list[SubProblem], str, str]:
        """(sub-problems, the question's phrase, the answer) of one hop."""
        rel = self.rng.choice(self.relations)
        name = self._start(rel)
        answer = str(self.tables[rel.entity][name][rel.column])
        sub = SubProblem(
            id=f"{prefix}1",
            question=f"What is {_phrase(rel, f'the {rel.entity} {name}')}?",
            kind=rel.kind,
            arguments={rel.entity: name},
            answer=answer,
        )
        return [sub], _phrase(rel, f"the {rel.entity} {name}"), answer

    def chain(self, prefix: str, hops: int) -> tuple[list[SubProblem], str, str] | None:
        """A chain of `hops` dependent sub-problems (None when the tables have no such chain from the draw)."""
        starts = [r for r in self.links if any(n for n in self.by_entity.get(r.target or "", []))]
        if not starts:
            return None
        rel = self.rng.choice(starts)
        name = self._start(rel)
        subject, subs, seen = f"the {rel.entity} {name}", [], {name}
        for hop in range(hops):
            value = self.tables[rel.entity].get(name, {}).get(rel.column)
            if value is None:
                return None
            answer = str(value)
            sub_id = f"{prefix}{hop + 1}"
            question = f"What is {_phrase(rel, f'the {rel.entity} {name}')}?"
            subs.append(
                SubProblem(
                    id=sub_id,
                    question=question,
                    kind=rel.kind,
                    arguments={rel.entity: name},
                    answer=answer,
                    depends_on=[subs[-1].id] if subs else [],
                )
            )
            subject = _phrase(rel, subject)
            if hop == hops - 1:
                return (subs, subject, answer) if answer not in seen else None
            if rel.target is None or answer in seen:
                return None
            seen.add(answer)
            choices = [r for r in self.by_entity.get(rel.target, []) if (hop + 2 < hops) <= bool(r.target)]
            choices = [r for r in choices if r.target != rel.entity or r.column != rel.column]
            if not choices:
                return None
            name, rel = answer, self.rng.choice(choices)
        return None

    def draw(self, scenario: str, task_id: str, split: str) -> BuiltTask | None:
        parts: list[tuple[list[SubProblem], str, str]] = []
        count = {"single_hop": 1, "multi_hop": 1, "parallel_multi_hop": 2}.get(scenario) or self.rng.choice([2, 2, 3])
        for i in range(count):
            prefix = f"s{i + 1}." if count > 1 else "s"
            if scenario.endswith("multi_hop"):  # at most 4 sub-problems a task: a small model's context
                part = self.chain(prefix, self.rng.choice([2, 2, 3]) if count == 1 else 2)
            else:
                part = self.single(prefix)
            if part is None:
                return None
            parts.append(part)
        phrases = [phrase for _, phrase, _ in parts]
        if len(set(phrases)) < len(phrases):
            return None
        if len(parts) == 1:
            question = f"What is {phrases[0]}?"
        else:
            question = "What are " + ", ".join(phrases[:-1]) + f" and {phrases[-1]}? Give each answer."
        subs = [sub for group, _, _ in parts for sub in group]
        return BuiltTask(
            id=task_id,
            split=split,
            scenario=scenario,
            question=question[0].upper() + question[1:],
            answers=[answer for _, _, answer in parts],
            subproblems=subs,
        )


def sample_tasks(tables: Tables, spec: BuildSpec) -> list[BuiltTask]:
    """`test_per_scenario` then `train_per_scenario` tasks of each scenario, distinct questions, from one
    stream per scenario seeded by `spec.seed` (growing the train split never changes the test split)."""
    tasks: list[BuiltTask] = []
    for scenario in spec.scenarios:
        rng = random.Random(f"{spec.seed}:{scenario}")
        sampler, seen = TaskSampler(tables, rng), set()
        wanted = [("test", spec.test_per_scenario), ("train", spec.train_per_scenario)]
        for split, count in wanted:
            made = 0
            for _ in range(count * 200):
                if made == count:
                    break
                task = sampler.draw(scenario, f"{scenario}-{split}-{made}", split)
                if task is not None and task.question not in seen:
                    seen.add(task.question)
                    tasks.append(task)
                    made += 1
            if made < count:
                raise DataError(
                    f"the tables yield only {made} distinct {scenario} tasks for the {split} split "
                    f"(asked for {count}); add rows or links, or lower {split}_per_scenario"
                )
    return tasks
