"""A seeded knowledge base of invented entities, rendered as short documents, with 2-hop questions.

Nothing in it can be known by heart, so an agent must search: "In which city was the founder of
Velmora Works born?" needs the company's document (its founder) and then the founder's (the
city). Records follow the HotpotQA layout the multi-hop task reads: ``question``, ``answer``,
``supporting`` (the titles of the two documents needed) and, for the whole base, ``documents``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "th", "br", "dr")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "eo")
_CODAS = ("", "n", "r", "l", "s", "th", "m")
_COMPANY_KINDS = ("Works", "Labs", "Foundry", "Systems", "Mills", "Dynamics")
_PRODUCTS = ("glass lenses", "river barges", "clock springs", "wool coats", "solar kettles")
_JOBS = ("engineer", "chemist", "painter", "architect", "sailor", "botanist")


def _word(rng: np.random.Generator, syllables: int) -> str:
    parts = [
        _ONSETS[int(rng.integers(len(_ONSETS)))]
        + _VOWELS[int(rng.integers(len(_VOWELS)))]
        + _CODAS[int(rng.integers(len(_CODAS)))]
        for _ in range(syllables)
    ]
    return "".join(parts).capitalize()


def _unique_names(rng: np.random.Generator, count: int, make: Any) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        name = make()
        if name not in names:
            names.append(name)
    return names


def synthetic_kb(
    *,
    people: int = 120,
    companies: int = 80,
    cities: int = 30,
    universities: int = 20,
    seed: int = 0,
) -> dict[str, Any]:
    """The documents and 2-hop question records of one seeded knowledge base; no question's
    answer is in its first document."""
    if min(people, companies, universities) < 1 or cities < 2:
        raise ValueError("need at least 1 person, company and university and 2 cities")
    rng = np.random.default_rng(seed)
    city_names = _unique_names(rng, cities, lambda: _word(rng, 2) + _word(rng, 1).lower())
    person_names = _unique_names(rng, people, lambda: f"{_word(rng, 2)} {_word(rng, 2)}")
    uni_names = _unique_names(rng, universities, lambda: f"University of {_word(rng, 3)}")
    company_names = _unique_names(
        rng,
        companies,
        lambda: f"{_word(rng, 3)} {_COMPANY_KINDS[int(rng.integers(len(_COMPANY_KINDS)))]}",
    )
    pick = lambda seq: seq[int(rng.integers(len(seq)))]  # noqa: E731
    uni_city = {u: pick(city_names) for u in uni_names}
    person = {}
    for name in person_names:  # born elsewhere than the university's city: two hops needed
        studied = pick(uni_names)
        born = pick([c for c in city_names if c != uni_city[studied]])
        person[name] = {"born": born, "studied": studied, "job": pick(_JOBS)}
    company = {c: {"founder": pick(person_names), "makes": pick(_PRODUCTS)} for c in company_names}
    documents = []
    for name, facts in person.items():
        documents.append(
            {
                "title": name,
                "text": f"{name} is {_a(facts['job'])} born in {facts['born']}. "
                f"{name.split()[0]} studied at the {facts['studied']}.",
            }
        )
    for name, facts in company.items():
        year = int(rng.integers(1890, 2015))
        documents.append(
            {
                "title": name,
                "text": f"{name} is a company that makes {facts['makes']}. "
                f"It was founded in {year} by {facts['founder']}.",
            }
        )
    for name, city in uni_city.items():
        documents.append({"title": name, "text": f"The {name} is a university in {city}."})
    for i, doc in enumerate(documents):
        doc["id"] = f"d{i}"
    records = []
    for name, facts in company.items():
        founder = facts["founder"]
        records.append(
            _record(
                f"In which city was the founder of {name} born?",
                person[founder]["born"],
                [name, founder],
                "founder_birthplace",
            )
        )
        records.append(
            _record(
                f"At which university did the founder of {name} study?",
                person[founder]["studied"],
                [name, founder],
                "founder_university",
            )
        )
    for name, facts in person.items():
        records.append(
            _record(
                f"In which city is the university where {name} studied?",
                uni_city[facts["studied"]],
                [name, facts["studied"]],
                "university_city",
            )
        )
    order = rng.permutation(len(records))
    return {"documents": documents, "records": [records[int(i)] for i in order]}


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _record(question: str, answer: str, supporting: list[str], kind: str) -> dict[str, Any]:
    return {"question": question, "answer": answer, "supporting": supporting, "kind": kind}
