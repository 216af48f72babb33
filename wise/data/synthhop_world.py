"""A seeded world of invented entities for synthhop, with one passage per entity.

Kinds and attributes (values are other entities' names, years or small fixed words):

    city        country, founded, feature
    university  city, founded
    person      birth_city, birth_year, alma_mater, occupation, lived_in (optional)
    company     founder, headquarters, founded, product
    film        director, studio (a company), released, genre, setting (optional city)

Names are unique across the whole world (questions name entities, so each must be unambiguous)
but deliberately share parts within a kind: people share first or last names, companies and
universities share stems, films share words. Every attribute is stated in the owner's passage
and nowhere else, so a question's evidence is exactly the passages along its path. The optional
attributes (lived_in, setting) put a second city into a passage, which makes "where was X born"
require reading the right sentence rather than copying any city.
"""
from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field
from typing import Any

from wise.data.examples import Passage
from wise.data.names import WordSource

OCCUPATIONS = ("painter", "engineer", "physician", "architect", "composer", "novelist",
               "chemist", "teacher", "lawyer", "pilot")
CITY_FEATURES = ("harbor", "old bridges", "markets", "museums", "gardens", "textile mills")
PRODUCTS = ("bicycles", "radios", "shoes", "glass", "paper", "engines", "toys", "furniture")
FILM_NOUNS = ("Mirror", "Garden", "Letter", "River", "Winter", "Harbor", "Crown", "Lantern",
              "Road", "Silence", "Island", "Promise")
GENRES = ("drama", "comedy", "thriller", "western", "musical", "documentary")
COMPANY_SUFFIXES = ("Industries", "Works", "Group", "Motors", "Foods", "Records", "Pictures",
                    "Studios")
UNIVERSITY_SUFFIXES = ("University", "Institute", "College")


@dataclass(frozen=True)
class WorldSize:
    """Entity counts per kind. The defaults give about 200 passages (roughly 9-10K tokens at the
    project tokenizer), enough distractors from one world for a 4096-token context."""

    countries: int = 6
    cities: int = 24
    universities: int = 12
    people: int = 80
    companies: int = 30
    films: int = 50

    def scaled(self, scale: float) -> "WorldSize":
        if scale <= 0:
            raise ValueError(f"world_scale must be positive, got {scale}")
        return WorldSize(*(max(2, round(getattr(self, f) * scale)) for f in self.__dataclass_fields__))


@dataclass(frozen=True, eq=False)
class Entity:
    kind: str
    name: str
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class World:
    seed: int
    entities: dict[str, Entity]  # by name, in creation order
    passages: dict[str, Passage]  # by entity name; is_evidence=False (the question decides)

    def of_kind(self, kind: str) -> list[Entity]:
        return [e for e in self.entities.values() if e.kind == kind]


def _compound_names(words: WordSource, rng: random.Random, n: int, first_parts: int,
                    second_parts, taken: set[str]) -> list[tuple[str, str]]:
    """n distinct (first, second) name pairs drawn from small part pools, so parts repeat."""
    firsts = words.words(first_parts)
    seconds = list(second_parts) if not isinstance(second_parts, int) else words.words(second_parts)
    pairs: list[tuple[str, str]] = []
    while len(pairs) < n:
        pair = (rng.choice(firsts), rng.choice(seconds))
        if pair not in pairs and f"{pair[0]} {pair[1]}" not in taken:
            pairs.append(pair)
    return pairs


def generate_world(seed: int, size: WorldSize = WorldSize()) -> World:
    rng = random.Random(seed)
    words = WordSource(rng)
    entities: dict[str, Entity] = {}

    def add(kind: str, name: str, **attrs) -> Entity:
        assert name not in entities, name
        entities[name] = Entity(kind, name, attrs)
        return entities[name]

    countries = words.words(size.countries)
    cities = [
        add("city", w, country=rng.choice(countries), founded=rng.randint(1600, 1900),
            feature=rng.choice(CITY_FEATURES))
        for w in words.words(size.cities)
    ]
    universities = []
    for stem, suffix in _compound_names(words, rng, size.universities,
                                        max(2, size.universities * 2 // 3), UNIVERSITY_SUFFIXES,
                                        set(entities)):
        city = rng.choice(cities)
        universities.append(add("university", f"{stem} {suffix}", city=city.name,
                                founded=rng.randint(max(1750, city.attrs["founded"] + 1), 1960)))
    people = []
    for first, last in _compound_names(words, rng, size.people, max(2, size.people // 3),
                                       max(2, size.people * 9 // 20), set(entities)):
        birth_city = rng.choice(cities)
        lived_in = rng.choice([c for c in cities if c is not birth_city]) if rng.random() < 0.3 else None
        people.append(add("person", f"{first} {last}", birth_city=birth_city.name,
                          birth_year=rng.randint(1900, 1985),
                          alma_mater=rng.choice(universities).name,
                          occupation=rng.choice(OCCUPATIONS),
                          lived_in=lived_in.name if lived_in else None))
    companies = []
    for stem, suffix in _compound_names(words, rng, size.companies, max(2, size.companies * 2 // 3),
                                        COMPANY_SUFFIXES, set(entities)):
        founder = rng.choice(people)
        companies.append(add("company", f"{stem} {suffix}", founder=founder.name,
                             headquarters=rng.choice(cities).name,
                             founded=founder.attrs["birth_year"]
                             + rng.randint(22, min(55, 2015 - founder.attrs["birth_year"])),
                             product=rng.choice(PRODUCTS)))
    for word, noun in _compound_names(words, rng, size.films, max(2, size.films // 2), FILM_NOUNS,
                                      set(entities)):
        director, studio = rng.choice(people), rng.choice(companies)
        earliest = max(director.attrs["birth_year"] + 20, studio.attrs["founded"])
        setting = rng.choice(cities).name if rng.random() < 0.3 else None
        add("film", f"The {word} {noun}", director=director.name, studio=studio.name,
            released=rng.randint(earliest, min(earliest + 35, 2024)), genre=rng.choice(GENRES),
            setting=setting)

    passages = {name: Passage(name, _describe(entity, rng)) for name, entity in entities.items()}
    return World(seed=seed, entities=entities, passages=passages)


@functools.lru_cache(maxsize=64)
def cached_world(seed: int, size: WorldSize = WorldSize()) -> World:
    """Worlds are regenerated from their seed when a context variant needs their passages."""
    return generate_world(seed, size)


# --- passage text --------------------------------------------------------------------------
# Each kind: one opening sentence (always first, it names the entity) and further facts in a
# seeded order. Two or three phrasings per fact keep the language varied but learnable.

def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _describe(entity: Entity, rng: random.Random) -> str:
    n, a = entity.name, entity.attrs
    pick = rng.choice
    if entity.kind == "city":
        first = pick([f"{n} is a city in {a['country']}.", f"{n} is a town in {a['country']}."])
        rest = [pick([f"{n} was founded in {a['founded']}.",
                      f"The city of {n} was founded in {a['founded']}."]),
                pick([f"{n} is known for its {a['feature']}.",
                      f"Visitors come to {n} for its {a['feature']}."])]
    elif entity.kind == "university":
        first = pick([f"{n} is a university in {a['city']}.", f"{n} is located in {a['city']}."])
        rest = [pick([f"{n} was founded in {a['founded']}.", f"{n} was established in {a['founded']}."])]
    elif entity.kind == "person":
        first = pick([f"{n} was born in {a['birth_city']} in {a['birth_year']}.",
                      f"{n} was born in {a['birth_year']} in {a['birth_city']}.",
                      f"{n} is {_a(a['occupation'])} born in {a['birth_city']} in {a['birth_year']}."])
        rest = [pick([f"{n} studied at {a['alma_mater']}.", f"{n} graduated from {a['alma_mater']}."])]
        if a["occupation"] not in first:
            rest.append(pick([f"{n} works as {_a(a['occupation'])}.", f"{n} is known as {_a(a['occupation'])}."]))
        if a["lived_in"]:
            rest.append(pick([f"{n} later moved to {a['lived_in']}.", f"{n} now lives in {a['lived_in']}."]))
    elif entity.kind == "company":
        first = pick([f"{n} is a company headquartered in {a['headquarters']}.",
                      f"{n} is a company based in {a['headquarters']}."])
        rest = [pick([f"{n} was founded by {a['founder']} in {a['founded']}.",
                      f"{a['founder']} founded {n} in {a['founded']}."]),
                pick([f"{n} makes {a['product']}.", f"The company is known for its {a['product']}."])]
    elif entity.kind == "film":
        if rng.random() < 0.5:
            first = f"{n} is a {a['released']} {a['genre']} film directed by {a['director']}."
            rest = []
        else:
            first = f"{n} is {_a(a['genre'])} film directed by {a['director']}."
            rest = [pick([f"{n} was released in {a['released']}.", f"The film was released in {a['released']}."])]
        rest.append(pick([f"{n} was produced by {a['studio']}.", f"The film was produced by {a['studio']}."]))
        if a["setting"]:
            rest.append(pick([f"The story is set in {a['setting']}.", f"{n} was filmed in {a['setting']}."]))
    else:  # pragma: no cover - kinds are fixed above
        raise ValueError(entity.kind)
    rng.shuffle(rest)
    return " ".join([first, *rest])
