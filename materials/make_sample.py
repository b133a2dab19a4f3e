"""Generate a small TinyStories-style sample corpus for this project.

The stories are composed from templates and word lists written for this
project (nothing is copied from TinyStories). Output has the same schema as
roneneldan/TinyStories: splits ``train`` and ``validation``, one JSON object
per line with a single key ``text``.

Standard library only and fully deterministic: the same ``--seed`` always
gives byte-identical files.

    python materials/make_sample.py                 # writes materials/tinystories_sample/
    python materials/make_sample.py --out /tmp/x --seed 7
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

DEFAULT_SEED = 20240531
DEFAULT_OUT = Path(__file__).resolve().parent / "tinystories_sample"

# ---------------------------------------------------------------- word lists

GIRLS = [
    "Lily",
    "Sue",
    "Mia",
    "Anna",
    "Lucy",
    "Emma",
    "Sara",
    "Amy",
    "Kate",
    "Ella",
    "Rosa",
    "Molly",
    "Jenny",
    "Daisy",
    "Sophie",
    "Ivy",
    "Ruby",
    "Nora",
    "Hana",
    "May",
]
BOYS = [
    "Tom",
    "Ben",
    "Max",
    "Sam",
    "Tim",
    "Jack",
    "Leo",
    "Finn",
    "Joe",
    "Jake",
    "Noah",
    "Ollie",
    "Dan",
    "Eli",
    "Bob",
    "Pete",
    "Ravi",
    "Kai",
    "Luca",
    "Ned",
]
ACCENTED = [
    ("Zoë", "f"),
    ("José", "m"),
    ("Chloé", "f"),
    ("André", "m"),
    ("Inés", "f"),
    ("Søren", "m"),
    ("Renée", "f"),
    ("Łukasz", "m"),
]
KIDS = {
    "f": ["girl", "little girl", "happy girl", "curious girl"],
    "m": ["boy", "little boy", "happy boy", "curious boy"],
}
ANIMALS = [
    ("cat", "Mittens", "f"),
    ("puppy", "Spot", "m"),
    ("bunny", "Fluffy", "f"),
    ("bird", "Pip", "m"),
    ("bear", "Bongo", "m"),
    ("frog", "Hoppy", "m"),
    ("duck", "Dot", "f"),
    ("mouse", "Nibbles", "f"),
    ("fox", "Rusty", "m"),
    ("lamb", "Snowy", "f"),
    ("turtle", "Shelly", "f"),
    ("pig", "Pinky", "f"),
]
PARENTS = [
    ("mom", "Mom", "f"),
    ("dad", "Dad", "m"),
    ("grandma", "Grandma", "f"),
    ("grandpa", "Grandpa", "m"),
]
PRONOUNS = {"f": ("she", "her", "her"), "m": ("he", "him", "his")}

TOYS = [
    "ball",
    "kite",
    "teddy bear",
    "toy car",
    "doll",
    "hat",
    "boat",
    "rock",
    "book",
    "box of crayons",
    "toy train",
    "drum",
    "balloon",
    "spinning top",
    "blanket",
]
ADJS = [
    "red",
    "big",
    "soft",
    "shiny",
    "little",
    "new",
    "yellow",
    "blue",
    "fluffy",
    "tiny",
    "green",
    "pretty",
    "round",
    "striped",
    "old",
]
PLACES = [
    "park",
    "garden",
    "beach",
    "forest",
    "farm",
    "backyard",
    "lake",
    "meadow",
    "playground",
    "hill",
    "field",
    "river",
]
HOMES = [
    "small house",
    "big blue house",
    "little town",
    "cozy cottage",
    "busy city",
    "quiet village",
    "house by the sea",
    "tall building",
]
ACTIVITIES = [
    "play in the sun",
    "run and jump",
    "sing songs",
    "draw pictures",
    "look at the clouds",
    "dig in the sand",
    "read books",
    "pick flowers",
    "climb trees",
    "dance",
    "play games",
    "build things",
    "help in the garden",
]
SPOTS = [
    "under the big tree",
    "behind the bench",
    "in the tall grass",
    "near the pond",
    "in the sandbox",
    "by the gate",
    "under a pile of leaves",
    "next to the swings",
    "inside a bush",
    "on top of a rock",
    "by the fence",
    "under the slide",
]
JUNK = [
    "a stick",
    "an old shoe",
    "a small bug",
    "a leaf",
    "a feather",
    "a snail",
    "a button",
    "a pine cone",
    "a spoon",
]
SAID = ["said", "said", "said", "asked", "shouted", "whispered", "cried", "called"]
TIMES = [
    "One day",
    "One sunny day",
    "One morning",
    "One afternoon",
    "One windy day",
    "One bright morning",
    "Last summer",
    "One cold day",
]


def cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def a_an(word: str) -> str:
    return ("an " if word[:1] in "aeiou" else "a ") + word


class Story:
    """Holds the cast and a random stream; renders templates into sentences."""

    def __init__(self, rng: random.Random, accent_p: float):
        self.rng = rng
        self.ctx: dict[str, str] = {}
        self.person("", accent_p, allow_animal=True)
        self.person("f_", accent_p, allow_animal=False, avoid=self.ctx["name"])
        pw, pcap, pg = rng.choice(PARENTS)
        ps, po, pp = PRONOUNS[pg]
        self.ctx.update(parent=pw, Parent=pcap, p_he=ps, p_He=cap(ps), p_him=po, p_his=pp)
        self.ctx.update(
            obj=rng.choice(TOYS),
            adj=rng.choice(ADJS),
            place=rng.choice(PLACES),
            home=rng.choice(HOMES),
            activity=rng.choice(ACTIVITIES),
            time=rng.choice(TIMES),
        )
        self.ctx["a_adj"] = a_an(self.ctx["adj"])

    def person(self, pre: str, accent_p: float, allow_animal: bool, avoid: str = "") -> None:
        rng = self.rng
        if allow_animal and rng.random() < 0.25:
            kind, name, g = rng.choice(ANIMALS)
        else:
            if rng.random() < accent_p:
                name, g = rng.choice([a for a in ACCENTED if a[0] != avoid])
            else:
                g = rng.choice("fm")
                name = rng.choice([n for n in (GIRLS if g == "f" else BOYS) if n != avoid])
            kind = rng.choice(KIDS[g])
        he, him, his = PRONOUNS[g]
        self.ctx.update(
            {
                pre + "name": name,
                pre + "kind": kind,
                pre + "he": he,
                pre + "He": cap(he),
                pre + "him": him,
                pre + "his": his,
                pre + "His": cap(his),
            }
        )

    def f(self, template: str, **extra: str) -> str:
        return template.format(**self.ctx, **extra)

    def pick(self, options: list[str], **extra: str) -> str:
        return self.f(self.rng.choice(options), **extra)

    def said(self) -> str:
        return self.rng.choice(SAID)


# ---------------------------------------------------------------- story parts


def opening(s: Story) -> str:
    first = s.rng.choice(
        [
            "Once upon a time, there was a {kind} named {name}.",
            "Once upon a time, in a {home}, there lived a {kind} named {name}.",
            "There was once a {kind} called {name}.",
            "{name} was a {kind} who loved to {activity}.",
            "{name} woke up early and looked out the window.",
        ]
    )
    if "woke up" in first:
        s.ctx["time"] = "That morning"
    extras = [
        "{He} lived with {his} {parent} in a {home}.",
        "{He} had {a_adj} {obj} that {he} loved very much.",
        "Every day, {he} liked to {activity}.",
        "{His} best friend was {f_name}, a {f_kind} who lived next door.",
        "{name} was always smiling.",
        "{He} was small, but {he} was very brave.",
    ]
    extras = [t for t in extras if not ("{activity}" in t and "{activity}" in first)]
    n = s.rng.choice([0, 1, 1, 2, 2, 3])
    return " ".join([s.f(first)] + [s.f(t) for t in s.rng.sample(extras, n)])


def plot_lost(s: Story) -> list[str]:
    r = s.rng
    paras = [
        s.pick(
            [
                "{time}, {name} took {his} {obj} to the {place}. {He} played with it all morning.",
                "{name} and {his} {obj} went to the {place} to play. The sun was warm and the sky was blue.",
            ]
        ),
        s.pick(
            [
                "When it was time to go home, {name} could not find {his} {obj}. {He} looked around, but it was gone.",
                "Then {name} put the {obj} down to chase a butterfly. When {he} came back, the {obj} was not there!",
            ]
        )
        + " "
        + s.pick(
            [
                '"Where is my {obj}?" {name} {s}.',
                '"Oh no! My {obj} is lost!" {name} {s}. {He} felt very sad.',
            ],
            s=r.choice(["cried", "said", "shouted"]),
        ),
    ]
    steps = []
    spots = r.sample(SPOTS, r.randint(2, 5))
    hide = spots.pop()
    for spot, junk in zip(spots, r.sample(JUNK, len(spots))):
        steps.append(
            s.pick(
                [
                    "{He} looked {spot}, but it was not there.",
                    "{name} ran to check {spot}. {He} only found {junk}.",
                    "Maybe it was {spot}? No, there was only {junk}.",
                ],
                spot=spot,
                junk=junk,
            )
        )
    paras.append(" ".join(steps))
    paras.append(
        s.f(
            '{f_name} saw {name} and walked over. "What is wrong?" {f_he} asked. '
            '{name} told {f_him} about the {obj}. "I will help you," said {f_name}.'
        )
    )
    paras.append(
        s.f(
            'Together, they looked {hide}. There it was! "My {obj}!" {name} {s}. '
            '{He} gave {f_name} a big hug. "Thank you for helping me."',
            hide=hide,
            s=r.choice(["shouted", "said", "laughed"]),
        )
    )
    s.ctx["moral"] = s.pick(
        [
            "{name} learned to always keep {his} things close.",
            "From that day on, {name} was more careful with {his} toys.",
            "Good friends help each other look for lost things.",
        ]
    )
    return paras


def plot_share(s: Story) -> list[str]:
    r = s.rng
    paras = [
        s.pick(
            [
                "{name} had a new {obj}. It was the best {obj} in the world, and {name} did not want anyone else to touch it.",
                "{His} {parent} gave {name} {a_adj} {obj}. {name} held it tight all day.",
            ]
        ),
        s.f(
            'Then {f_name} came over. "Can I play with your {obj}?" {f_he} asked. '
            '"No! It is mine," said {name}. {f_name} looked sad and walked away.'
        ),
    ]
    lonely = [
        "{name} played with the {obj} alone. But it was not much fun.",
        "{He} threw the {obj} up high and caught it. Then {he} did it again. It was boring.",
        "{He} looked over at {f_name}, who was sitting all alone on the grass.",
        "{He} tried to play a game, but games need two players.",
        "The {obj} did not seem so special anymore.",
    ]
    paras.append(" ".join(s.f(t) for t in r.sample(lonely, r.randint(1, 4))))
    paras.append(
        s.pick(
            [
                '{His} {parent} sat down next to {him}. "Sharing makes playing more fun," {p_he} said.',
                '{His} {parent} saw what happened. "How would you feel if {f_name} did not share with you?" {p_he} asked.',
            ]
        )
    )
    paras.append(
        s.f(
            '{name} thought about it. Then {he} walked to {f_name}. "I am sorry. Do you want to play with my {obj}?" '
            '{f_name} smiled a big smile. "Yes, please!"'
        )
    )
    paras.append(
        s.pick(
            [
                "They played together until the sun went down. {name} was happy, and so was {f_name}.",
                "They took turns with the {obj} and laughed and laughed. It was the best day.",
            ]
        )
    )
    s.ctx["moral"] = s.pick(
        ["{name} learned that sharing is caring.", "Sharing made the day better for everyone."]
    )
    return paras


FEARS = [
    (
        "the dark",
        "Every night, when the lights went off, {he} pulled the blanket over {his} head.",
        "{He} opened {his} eyes and looked around {his} room.",
        "It was just {his} room, with {his} toys and {his} bed. Nothing scary at all.",
    ),
    (
        "the big slide",
        "{He} always watched the other kids go down, but {he} never climbed up.",
        "{He} climbed the ladder one step at a time and sat at the top.",
        "Whoosh! {He} slid down fast and landed in the sand, laughing.",
    ),
    (
        "the water at the lake",
        "{He} liked to sit on the shore, but {he} never went in.",
        "{He} put one foot in the water. It was cool and nice. Then {he} put in the other foot.",
        "Soon {he} was splashing and kicking with a big smile.",
    ),
    (
        "the big dog next door",
        "The dog was brown and had a very loud bark.",
        "{He} held out {his} hand slowly. The dog sniffed it.",
        "Then the dog licked {his} hand and wagged its tail. It was a friendly dog!",
    ),
    (
        "thunder",
        "When a storm came, {he} hid under the kitchen table.",
        "{He} sat by the window with {his} {parent} and counted after each flash of light.",
        "The storm moved far away, and the thunder got quiet, like a sleepy drum.",
    ),
]


def plot_fear(s: Story) -> list[str]:
    r = s.rng
    fear, habit, attempt, result = r.choice(FEARS)
    paras = [s.f("{name} was scared of " + fear + ". " + habit)]
    worry = [
        '"I do not like ' + fear + '," {name} {s}.',
        "{He} wished {he} could be brave like {f_name}.",
        "{His} tummy felt funny just thinking about it.",
        '"What if something bad happens?" {he} asked.',
        "{He} did not tell anyone, but {he} felt sad about it.",
    ]
    paras.append(" ".join(s.f(t, s=s.said()) for t in r.sample(worry, r.randint(1, 3))))
    paras.append(
        s.pick(
            [
                '"It is okay to be scared," said {his} {parent}. "Being brave means trying even when you are scared."',
                '{His} {parent} held {his} hand. "I am right here with you," {p_he} said. "Let us try together."',
            ]
        )
    )
    paras.append(s.f(attempt) + " " + s.f(result))
    paras.append(
        s.pick(
            [
                '"I did it!" {name} shouted. {His} {parent} clapped and cheered.',
                '{name} felt proud. "That was not so scary after all," {he} said.',
            ]
        )
    )
    s.ctx["moral"] = s.pick(
        [
            "{name} learned that being brave is not about not being scared. It is about trying anyway.",
            "After that day, {name} was not scared of " + fear + " anymore.",
        ]
    )
    return paras


CRITTERS = [
    ("bird", "wing", "seeds"),
    ("kitten", "paw", "milk"),
    ("duck", "leg", "bread crumbs"),
    ("squirrel", "tail", "nuts"),
    ("puppy", "paw", "food"),
    ("bunny", "ear", "carrots"),
]


def plot_help(s: Story) -> list[str]:
    r = s.rng
    critter, part, food = r.choice(CRITTERS)
    s.ctx.update(critter=critter, part=part, food=food)
    paras = [
        s.f(
            "{time}, {name} was walking in the {place} when {he} heard a small sound. "
            "{He} looked down and saw a little {critter}. Its {part} was hurt."
        ),
        s.pick(
            [
                '"Poor little {critter}," said {name}. "I will help you."',
                '{name} knelt down. "Do not be afraid," {he} whispered. "I am your friend."',
            ]
        ),
    ]
    care = [
        "{He} carried it home in {his} hat.",
        "{He} made a soft bed in a box.",
        "{His} {parent} helped {him} wrap its {part} with a clean cloth.",
        "Every day, {name} gave it water and {food}.",
        "{f_name} came to visit and brought a little blanket.",
        "At night, {name} sang quiet songs to help it sleep.",
    ]
    paras.append(" ".join(s.f(t) for t in care[:2] + r.sample(care[2:], r.randint(1, 4))))
    end = "After many days, the {critter} was strong again. " + r.choice(
        [
            "It hopped to the door, looked back at {name}, and then ran off into the {place}.",
            "It did not want to leave, so {name}'s {parent} said it could stay.",
            "{name} took it back to the {place} and watched it go home.",
        ]
    )
    paras.append(
        s.f(end)
        + " "
        + s.pick(["{name} felt warm inside.", "{name} waved goodbye with a happy heart."])
    )
    s.ctx["moral"] = s.pick(
        [
            "Being kind to animals is a good thing to do.",
            "Even small hands can do big, kind things.",
        ]
    )
    return paras


PROJECTS = [
    ("a sandcastle", "a big wave came and washed it away", "shells and a flag made from a leaf"),
    ("a tower of blocks", "the cat jumped on it and it fell down", "a red block on the very top"),
    (
        "a cake for {his} {parent}",
        "{he} dropped the bowl and the batter went everywhere",
        "pink icing and sprinkles",
    ),
    (
        "a picture for {f_name}",
        "{he} spilled water on it and the colors ran",
        "a yellow sun and a purple tree",
    ),
    ("a kite", "the wind tore the paper", "a long tail with bows"),
    (
        "a snowman",
        "the sun came out and made its head fall off",
        "a carrot nose and two stick arms",
    ),
]


def plot_make(s: Story) -> list[str]:
    r = s.rng
    thing, mishap, deco = r.choice(PROJECTS)
    paras = [s.f("{time}, {name} wanted to make " + thing + ". {He} worked very hard.")]
    work = [
        "First, {he} got everything {he} needed.",
        "Then {he} started slowly and carefully.",
        "{He} added " + deco + ".",
        "{He} hummed a little song while {he} worked.",
        "It took a long time, but {he} did not give up.",
        '"This will be the best one ever," {he} said.',
    ]
    paras.append(" ".join(s.f(t) for t in work[:1] + r.sample(work[1:], r.randint(1, 4))))
    paras.append(
        s.f("But then " + mishap + ". ")
        + s.pick(
            ['"Oh no!" {name} {s}. {He} sat down and cried.', "{name} felt like giving up."],
            s=r.choice(["gasped", "said", "shouted"]),
        )
    )
    paras.append(
        s.pick(
            [
                '{f_name} came over. "Don\'t be sad," {f_he} said. "We can make it again, together!"',
                '{His} {parent} gave {him} a hug. "Mistakes happen. Let\'s try again," {p_he} said.',
            ]
        )
    )
    paras.append(
        s.f(
            "So they started again. This time it was even better than before. "
            "{name} smiled from ear to ear."
        )
    )
    s.ctx["moral"] = s.pick(
        [
            "If at first you don't succeed, try, try again.",
            "{name} learned that mistakes are just a part of making things.",
        ]
    )
    return paras


RULES = [
    (
        "the vase on the table",
        "It is very old and it can break",
        "The vase fell and broke into pieces.",
    ),
    (
        "the cookie jar",
        "The cookies are for after dinner",
        "The jar slipped and cookies rolled across the floor.",
    ),
    ("the paint", "It makes a big mess", "The paint spilled all over the rug."),
    (
        "{his} {parent}'s glasses",
        "They are not a toy",
        "One of the lenses popped out and rolled under the sofa.",
    ),
    (
        "the fish tank",
        "The fish need to be left alone",
        "Water splashed everywhere and the fish swam in circles.",
    ),
]


def plot_rule(s: Story) -> list[str]:
    r = s.rng
    item, why, accident = r.choice(RULES)
    item = s.f(item)
    paras = [
        s.f('{His} {parent} said, "Please do not touch ' + item + ". " + why + '." {name} nodded.')
    ]
    tempt = [
        "But {name} kept looking at it.",
        '"Just one little touch," {he} whispered.',
        "{His} {parent} went to the kitchen. {name} was alone.",
        "{He} tiptoed closer and closer.",
        "{His} heart went thump, thump, thump.",
    ]
    paras.append(" ".join(s.f(t) for t in r.sample(tempt, r.randint(2, 5))))
    paras.append(s.f("{name} reached out, and then oops! " + accident))
    paras.append(
        s.pick(
            [
                '{name} felt very bad. {He} went to {his} {parent}. "I am sorry. I did not listen," {he} said.',
                "{name} wanted to hide, but {he} knew that was wrong. {He} told {his} {parent} the truth.",
            ]
        )
    )
    paras.append(
        s.pick(
            [
                '{His} {parent} hugged {him}. "Thank you for telling me the truth," {p_he} said. "Let\'s clean up together."',
                '{His} {parent} was a little sad, but {p_he} said, "I am glad you told me. Next time, please listen."',
            ]
        )
    )
    s.ctx["moral"] = s.pick(
        [
            "{name} learned to listen to {his} {parent}.",
            "Telling the truth is always the right thing to do.",
        ]
    )
    return paras


TRIPS = {
    "farm": [
        "a cow that said moo",
        "pink pigs in the mud",
        "a big red barn",
        "little yellow chicks",
        "a tall brown horse",
    ],
    "beach": [
        "white shells",
        "a crab walking sideways",
        "big blue waves",
        "seagulls in the sky",
        "a boat far away",
    ],
    "zoo": [
        "a sleepy lion",
        "monkeys swinging from ropes",
        "a very tall giraffe",
        "an elephant spraying water",
        "a penguin",
    ],
    "forest": [
        "tall green trees",
        "red mushrooms",
        "a shy deer",
        "a bright blue bug",
        "a squirrel with a nut",
    ],
    "market": [
        "shiny apples",
        "warm bread",
        "many flowers",
        "a man selling balloons",
        "a cat asleep on a box",
    ],
}


def plot_trip(s: Story) -> list[str]:
    r = s.rng
    where = r.choice(list(TRIPS))
    s.ctx["where"] = where
    paras = [
        s.pick(
            [
                "{time}, {name} and {his} {parent} went to the {where}. {name} was so excited!",
                '"Today we are going to the {where}," said {his} {parent}. {name} jumped up and down.',
            ]
        )
    ]
    seen = []
    for sight in r.sample(TRIPS[where], r.randint(2, 5)):
        seen.append(
            s.pick(
                [
                    "{He} saw {x}.",
                    "Then {he} saw {x}!",
                    "Look, {x}!",
                    '"Look!" {name} said, pointing at {x}.',
                ],
                x=sight,
            )
        )
    paras.append(" ".join(seen))
    if r.random() < 0.6:
        paras.append(
            s.pick(
                [
                    'After a while, {name} was hungry. They sat down and ate sandwiches. "Yum!" said {name}.',
                    "Then it started to rain a little. They hid under a tree until it stopped.",
                    '{name} got tired, so {his} {parent} carried {him} for a while. "You are getting heavy!" {p_he} laughed.',
                ]
            )
        )
    paras.append(
        s.pick(
            [
                "When the sun went down, they went home. {name} fell asleep in the car.",
                'That night, {name} told {f_name} all about the {where}. "Can we go again?" {he} asked.',
            ]
        )
    )
    s.ctx["moral"] = s.pick(
        [
            "It was a day {name} would never forget.",
            "There are so many wonderful things to see in the world.",
        ]
    )
    return paras


def plot_rain(s: Story) -> list[str]:
    r = s.rng
    paras = [
        s.f(
            'It was raining outside. {name} wanted to go to the {place}. "Can we go out?" {he} asked. '
            '"Not now, it is too wet," said {his} {parent}.'
        )
    ]
    inside = [
        "They built a fort from pillows and blankets.",
        "{name} drew a picture of the sun.",
        "{He} played with {his} {obj} on the floor.",
        "{His} {parent} read {him} a book about a dragon.",
        "They baked cookies and the house smelled sweet.",
        "{He} watched the raindrops race down the window.",
        '{He} called {f_name} on the phone. "I am bored," {he} said. "Me too!" said {f_name}.',
    ]
    paras.append(" ".join(s.f(t) for t in r.sample(inside, r.randint(2, 5))))
    paras.append(
        s.pick(
            [
                'Then the rain stopped. "Look!" said {his} {parent}. There was a big rainbow in the sky.',
                "After lunch, the sun came out. Everything was wet and shiny.",
            ]
        )
    )
    paras.append(
        s.pick(
            [
                "{name} put on {his} boots and jumped in every puddle. Splash! Splash!",
                "{name} ran outside to find {f_name}. They splashed in the puddles together.",
            ]
        )
    )
    s.ctx["moral"] = s.pick(
        [
            "Even a rainy day can be a fun day.",
            "{name} learned that every day has something good in it.",
        ]
    )
    return paras


def plot_gift(s: Story) -> list[str]:
    s.ctx["moral"] = s.pick(
        ["A small gift can make a big smile.", "Giving feels as good as getting."]
    )
    return [
        s.pick(
            [
                "{time}, {name} found {a_adj} {obj} in the {place}. {He} wanted to give it to {f_name}.",
                "{name} saved {his} coins for a long time and bought {a_adj} {obj} for {f_name}.",
            ]
        ),
        s.pick(
            [
                "{He} wrapped it in paper and tied a bow on top. Then {he} ran all the way to {f_name}'s house.",
                "{He} hid it behind {his} back and knocked on {f_name}'s door. {His} heart was beating fast.",
            ]
        ),
        s.f(
            '"This is for you," said {name}. {f_name} opened {f_his} eyes wide. "Thank you! I love it!" {f_he} said.'
        ),
    ]


def plot_bedtime(s: Story) -> list[str]:
    s.ctx["moral"] = s.f("{name} knew that {he} was loved.")
    return [
        s.f("It was bedtime. {name} brushed {his} teeth and put on {his} soft pajamas."),
        s.pick(
            [
                '"One more story, please," {he} said. {His} {parent} laughed and read one more.',
                '{His} {parent} tucked {him} in. "Good night, little one," {p_he} whispered.',
            ]
        ),
        s.f("{name} hugged {his} {obj} and closed {his} eyes. Soon {he} was fast asleep."),
    ]


PLOTS = [plot_lost, plot_share, plot_fear, plot_help, plot_make, plot_rule, plot_trip, plot_rain]
SHORT_PLOTS = [plot_gift, plot_bedtime]


def plot_robot(s: Story) -> list[str]:
    """One story that contains GPT-2's special-token text as plain dialogue."""
    return [
        s.f("{name} had a toy robot named Bip. When you pressed its button, it said funny words."),
        s.f(
            '{f_name} pressed the button. "Beep boop! <|endoftext|>!" said the robot. '
            '"What does that mean?" asked {f_name}. "It means the story is over," said {name}, '
            '"but our story is not over yet!"'
        ),
        s.f(
            "They pressed the button again and again, and laughed every time. When the robot got tired, "
            'its eyes blinked slowly and it said, "Beep... good night." {name} put Bip on the shelf '
            "next to {his} {obj}."
        ),
    ]


def fancy(text: str) -> str:
    """Typographic style: curly quotes and apostrophes, em dashes."""
    out, open_q = [], True
    for ch in text:
        if ch == '"':
            out.append("\u201c" if open_q else "\u201d")
            open_q = not open_q
        elif ch == "'":
            out.append("\u2019")
        else:
            out.append(ch)
    return "".join(out).replace(". Then ", "\u2014then ", 1)


def make_story(rng: random.Random, plot=None, accent_p: float = 0.01, fancy_p: float = 0.01) -> str:
    s = Story(rng, accent_p)
    if plot is None:
        plot = rng.choice(SHORT_PLOTS if rng.random() < 0.1 else PLOTS)
    paras = [opening(s)] + plot(s)
    if plot in PLOTS and rng.random() < 0.2:  # a second adventure makes a longer story
        s.ctx.update(
            obj=rng.choice(TOYS),
            place=rng.choice(PLACES),
            time=rng.choice(
                ["The next day", "A week later", "The next morning", "Some days later"]
            ),
        )
        paras += rng.choice([p for p in PLOTS if p is not plot])(s)
    if plot is not plot_bedtime and rng.random() < 0.3:
        paras.append(
            s.pick(
                [
                    "That night, {name} told {his} {parent} all about {his} day. {His} {parent} smiled and kissed {him} good night.",
                    "The next day, {name} met {f_name} and told {f_him} everything. Then they played all afternoon.",
                    "Later, {name} drew a picture of everything that happened and hung it on the wall.",
                ]
            )
        )
    if "moral" in s.ctx and rng.random() < 0.6:
        paras.append(s.ctx["moral"])
    if rng.random() < 0.15:
        paras.append("The end.")
    text = "\n\n".join(paras) if rng.random() < 0.5 else " ".join(paras)
    assert text.count('"') % 2 == 0
    return fancy(text) if rng.random() < fancy_p else text


def make_split(seed: int, split: str, n: int, with_robot: bool) -> list[str]:
    rng = random.Random(f"{seed}-{split}")
    stories = [make_story(rng) for _ in range(n)]
    if with_robot:
        stories[rng.randrange(n)] = make_story(rng, plot=plot_robot, fancy_p=0.0)
    return stories


def write_jsonl(path: Path, texts: list[str]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for t in texts:
            f.write(json.dumps({"text": t}, ensure_ascii=False, sort_keys=True) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)"
    )
    ap.add_argument(
        "--seed", type=int, default=DEFAULT_SEED, help="random seed (default: %(default)s)"
    )
    ap.add_argument("--train", type=int, default=1800, help="number of train stories")
    ap.add_argument("--validation", type=int, default=180, help="number of validation stories")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", args.train), ("validation", args.validation)):
        texts = make_split(args.seed, split, n, with_robot=(split == "train"))
        write_jsonl(args.out / f"{split}.jsonl", texts)
        print(f"{split}: {len(texts)} stories -> {args.out / f'{split}.jsonl'}")


if __name__ == "__main__":
    main()
