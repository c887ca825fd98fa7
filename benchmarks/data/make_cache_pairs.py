"""Write benchmarks/data/cache_pairs.jsonl: labelled prompt pairs for the semantic cache.

    .venv/bin/python benchmarks/data/make_cache_pairs.py        # rewrites the file, deterministic

Each line is one pair ``{"group", "a", "b", "same", "kind", "answer_a", "answer_b"}``: ``a`` is
an *anchor* prompt (what a first client asked; the cache holds its answer), ``b`` a later
prompt, ``same`` whether ``b`` must get the same answer as ``a``. ``kind`` says how ``b`` was
made: ``paraphrase`` (same question, other words: same answer), or a near miss that needs a
different answer: ``number`` (a number changed), ``negation`` (negated, or an antonym
swapped in), ``entity`` (another country, city, book, language, ...), ``relation`` (same
entity, another question about it). ``answer_*`` name the answer (equal ids = equal answers).

Two sources, both in this file: templates (families of phrasings with slots, each anchor
crossed with its paraphrase phrasings and with near misses made by changing one slot), and
hand-written pairs (``HAND``) for paraphrases with little word overlap and subtler near misses.
The output order is fixed, so the file changes only when this script does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cache_fresh2 import FRESH2  # noqa: E402
from cache_fresh3 import FRESH3  # noqa: E402
from cache_fresh4 import FRESH4  # noqa: E402
from cache_fresh5 import FRESH5  # noqa: E402
from cache_groups import build_groups  # noqa: E402
from cache_groups import pair_row as _pair  # noqa: E402

OUT = Path(__file__).resolve().parent / "cache_pairs.jsonl"

# family: phrasings of one question (first = the anchor's), slot values, near misses.
CAPITAL = ["What is the capital of {x}?", "What's the capital city of {x}?",
           "Which city is the capital of {x}?", "Tell me the capital of {x}.",
           "Name the capital city of {x}, please."]
COUNTRIES = ["France", "Germany", "Japan", "Canada", "Brazil", "Kenya", "Australia", "Spain",
             "Egypt", "Norway"]
LARGEST = "What is the largest city in {x}?"

PLUS = ["What is {a} plus {b}?", "What's {a} + {b}?", "Add {a} and {b}.",
        "Compute the sum of {a} and {b}.", "How much is {a} plus {b}?"]
SUMS = [(17, 25), (128, 64), (9, 13), (250, 750), (33, 44), (1200, 345), (6, 7), (81, 19)]
MINUS = "What is {a} minus {b}?"

MILES = ["Convert {n} miles to kilometers.", "How many kilometers is {n} miles?",
         "What is {n} miles in kilometers?", "{n} miles in km?",
         "Please convert {n} miles into kilometres."]
DISTANCES = [5, 12, 26, 100, 42, 3, 60, 8]
KM = "Convert {n} kilometers to miles."

DEFINE = ["What does {x} mean?", "Define {x}.", "What is the meaning of the word {x}?",
          "Give me the definition of {x}.", "What's the definition of '{x}'?"]
WORDS = [("ephemeral", "eternal"), ("affect", "effect"), ("benevolent", "malevolent"),
         ("ubiquitous", "scarce"), ("candid", "evasive"), ("meticulous", "careless"),
         ("optimistic", "pessimistic"), ("generous", "stingy")]

AUTHOR = ["Who wrote {x}?", "Who is the author of {x}?", "{x} was written by whom?",
          "Which writer wrote {x}?", "Tell me who wrote {x}."]
BOOKS = [("Pride and Prejudice", "Sense and Sensibility"), ("War and Peace", "Anna Karenina"),
         ("Moby-Dick", "The Old Man and the Sea"), ("Hamlet", "Macbeth"),
         ("Don Quixote", "One Hundred Years of Solitude"), ("The Odyssey", "The Aeneid")]
PUBLISHED = "When was {x} first published?"

TRANSLATE = ["Translate '{p}' into {l}.", "How do you say '{p}' in {l}?",
             "What is '{p}' in {l}?", "Say '{p}' in {l}, please.",
             "Give me the {l} translation of '{p}'."]
PHRASES = [("good morning", "Italian", "good night", "German"),
           ("thank you very much", "Spanish", "you are welcome", "French"),
           ("where is the train station", "French", "where is the airport", "Spanish"),
           ("I am hungry", "German", "I am thirsty", "Italian"),
           ("see you tomorrow", "Portuguese", "see you next week", "Dutch")]

CODE = ["How do I reverse a list in {x}?", "What's the way to reverse a list in {x}?",
        "Reverse a list in {x}: how?", "How can I reverse the order of a list in {x}?",
        "Show me how to reverse a list using {x}."]
LANGS = [("Python", "JavaScript"), ("Rust", "Go"), ("Java", "C#"), ("Ruby", "Perl"),
         ("Haskell", "OCaml")]
SORT = "How do I sort a list in {x}?"

WEATHER = ["What's the weather in {x} today?", "How is the weather in {x} today?",
           "What is today's weather like in {x}?", "Tell me today's weather for {x}.",
           "Weather forecast for {x} today?"]
CITIES = [("Paris", "Berlin"), ("Tokyo", "Osaka"), ("Nairobi", "Lagos"), ("Toronto", "Chicago"),
          ("Madrid", "Lisbon")]
TOMORROW = "What's the weather in {x} tomorrow?"

HOWTO = ["How do I {v} two-factor authentication on my account?",
         "What are the steps to {v} two-factor authentication on my account?",
         "Can you explain how to {v} 2FA on my account?",
         "I want to {v} two-factor authentication on my account. How?",
         "Walk me through how to {v} two-factor authentication for my account."]
TOGGLES = [("enable", "disable"), ("turn on", "turn off"), ("set up", "remove")]

FOOD = ["Which foods are high in {x}?", "What foods contain a lot of {x}?",
        "List some foods rich in {x}.", "What should I eat to get more {x}?",
        "Give me examples of foods with plenty of {x}."]
NUTRIENTS = [("protein", "fiber"), ("iron", "calcium"), ("vitamin C", "vitamin D"),
             ("potassium", "magnesium")]
FOOD_NOT = "Which foods are not high in {x}?"

POPULATION = ["What is the population of {x}?", "How many people live in {x}?",
              "What's the number of inhabitants of {x}?", "How populous is {x}?",
              "Tell me the population of {x}."]
TOWNS = [("Tokyo", "Delhi"), ("London", "Manchester"), ("Lagos", "Cairo"),
         ("Sydney", "Melbourne"), ("Mumbai", "Karachi"), ("Berlin", "Hamburg")]
AREA = "What is the area of {x}?"

# Hand-written: (anchor, other prompt, same answer?, kind).
HAND: list[tuple[str, str, bool, str]] = [
    ("How do I reset my password?", "I forgot my password, what do I do?", True, "paraphrase"),
    ("How do I reset my password?", "Steps to recover access after forgetting my password?",
     True, "paraphrase"),
    ("How do I reset my password?", "Password reset instructions, please.", True, "paraphrase"),
    ("How do I reset my password?", "How do I reset my router?", False, "entity"),
    ("How do I reset my password?", "How do I change my username?", False, "entity"),
    ("How do I reset my password?", "How do I reset my password without my email?", False,
     "relation"),
    ("Why is the sky blue?", "What makes the sky look blue?", True, "paraphrase"),
    ("Why is the sky blue?", "Explain why the sky appears blue during the day.", True,
     "paraphrase"),
    ("Why is the sky blue?", "Why is the sunset red?", False, "entity"),
    ("Why is the sky blue?", "Why is the ocean blue?", False, "entity"),
    ("Can I cancel my subscription?", "Is it possible to end my subscription?", True,
     "paraphrase"),
    ("Can I cancel my subscription?", "Am I allowed to stop my membership plan?", True,
     "paraphrase"),
    ("Can I cancel my subscription?", "Can I upgrade my subscription?", False, "negation"),
    ("Can I cancel my subscription?", "Can I pause my subscription?", False, "relation"),
    ("Is it safe to drink tap water in Mexico City?",
     "Can I safely drink the tap water in Mexico City?", True, "paraphrase"),
    ("Is it safe to drink tap water in Mexico City?",
     "Is tap water in Mexico City drinkable?", True, "paraphrase"),
    ("Is it safe to drink tap water in Mexico City?",
     "Is it safe to drink tap water in Copenhagen?", False, "entity"),
    ("Is it safe to drink tap water in Mexico City?",
     "Is it unsafe to drink bottled water in Mexico City?", False, "negation"),
    ("What time zone is New York in?", "Which time zone does New York use?", True, "paraphrase"),
    ("What time zone is New York in?", "New York is in which timezone?", True, "paraphrase"),
    ("What time zone is New York in?", "What time zone is Los Angeles in?", False, "entity"),
    ("How many legs does a spider have?", "A spider has how many legs?", True, "paraphrase"),
    ("How many legs does a spider have?", "Number of legs on a spider?", True, "paraphrase"),
    ("How many legs does a spider have?", "How many legs does an ant have?", False, "entity"),
    ("How many legs does a spider have?", "How many eyes does a spider have?", False,
     "relation"),
    ("What is the boiling point of water?", "At what temperature does water boil?", True,
     "paraphrase"),
    ("What is the boiling point of water?", "When does water start boiling, temperature-wise?",
     True, "paraphrase"),
    ("What is the boiling point of water?", "What is the freezing point of water?", False,
     "negation"),
    ("What is the boiling point of water?", "What is the boiling point of ethanol?", False,
     "entity"),
    ("Should I take ibuprofen with food?", "Is it better to take ibuprofen on a full stomach?",
     True, "paraphrase"),
    ("Should I take ibuprofen with food?", "Do I need to eat before taking ibuprofen?", True,
     "paraphrase"),
    ("Should I take ibuprofen with food?", "Should I take ibuprofen with alcohol?", False,
     "entity"),
    ("Should I take ibuprofen with food?", "Should I take antibiotics with food?", False,
     "entity"),
    ("Who painted the Mona Lisa?", "Who is the artist behind the Mona Lisa?", True,
     "paraphrase"),
    ("Who painted the Mona Lisa?", "The Mona Lisa was painted by whom?", True, "paraphrase"),
    ("Who painted the Mona Lisa?", "Who painted The Starry Night?", False, "entity"),
    ("Who painted the Mona Lisa?", "Where is the Mona Lisa displayed?", False, "relation"),
    ("What is the speed of light?", "How fast does light travel?", True, "paraphrase"),
    ("What is the speed of light?", "Light moves at what speed?", True, "paraphrase"),
    ("What is the speed of light?", "What is the speed of sound?", False, "entity"),
    ("How long should I boil an egg for a soft yolk?",
     "How many minutes to boil an egg so the yolk stays runny?", True, "paraphrase"),
    ("How long should I boil an egg for a soft yolk?",
     "Soft-boiled egg: how long in the pot?", True, "paraphrase"),
    ("How long should I boil an egg for a soft yolk?",
     "How long should I boil an egg for a hard yolk?", False, "negation"),
    ("How long should I boil an egg for a soft yolk?",
     "How long should I boil pasta?", False, "entity"),
    ("Do I need a visa to visit Japan from the US?",
     "As an American, is a visa required to travel to Japan?", True, "paraphrase"),
    ("Do I need a visa to visit Japan from the US?",
     "Do US citizens need a visa for a trip to Japan?", True, "paraphrase"),
    ("Do I need a visa to visit Japan from the US?",
     "Do I need a visa to visit China from the US?", False, "entity"),
    ("Do I need a visa to visit Japan from the US?",
     "Do I need a visa to visit the US from Japan?", False, "relation"),
    ("What are the symptoms of dehydration?", "How can I tell if I'm dehydrated?", True,
     "paraphrase"),
    ("What are the symptoms of dehydration?", "Signs of dehydration?", True, "paraphrase"),
    ("What are the symptoms of dehydration?", "What are the symptoms of overhydration?", False,
     "negation"),
    ("What are the symptoms of dehydration?", "What are the treatments for dehydration?",
     False, "relation"),
    ("Is the store open on Sunday?", "Are you open Sundays?", True, "paraphrase"),
    ("Is the store open on Sunday?", "Does the shop operate on Sundays?", True, "paraphrase"),
    ("Is the store open on Sunday?", "Is the store closed on Sunday?", False, "negation"),
    ("Is the store open on Sunday?", "Is the store open on Monday?", False, "entity"),
    ("What year did World War II end?", "When did the Second World War end?", True,
     "paraphrase"),
    ("What year did World War II end?", "WWII ended in which year?", True, "paraphrase"),
    ("What year did World War II end?", "What year did World War I end?", False, "number"),
    ("What year did World War II end?", "What year did World War II begin?", False,
     "negation"),
    ("Recommend a good book about habits.", "Suggest a book on building habits.", True,
     "paraphrase"),
    ("Recommend a good book about habits.", "What's a great read about forming habits?", True,
     "paraphrase"),
    ("Recommend a good book about habits.", "Recommend a good book about investing.", False,
     "entity"),
    ("How do I make my laptop battery last longer?",
     "Tips to extend my laptop's battery life?", True, "paraphrase"),
    ("How do I make my laptop battery last longer?",
     "How can I get more hours out of my notebook's battery?", True, "paraphrase"),
    ("How do I make my laptop battery last longer?",
     "How do I make my phone battery last longer?", False, "entity"),
    ("How do I make my laptop battery last longer?",
     "How do I make my laptop battery charge faster?", False, "relation"),
    ("Is 97 a prime number?", "Is the number 97 prime?", True, "paraphrase"),
    ("Is 97 a prime number?", "Is 91 a prime number?", False, "number"),
    ("Is 97 a prime number?", "Is 97 an even number?", False, "relation"),
    ("How many days are in a leap year?", "A leap year has how many days?", True,
     "paraphrase"),
    ("How many days are in a leap year?", "How many days are in a regular year?", False,
     "negation"),
    ("What's 15% of 80?", "Calculate fifteen percent of 80.", True, "paraphrase"),
    ("What's 15% of 80?", "What's 15% of 90?", False, "number"),
    ("What's 15% of 80?", "What's 25% of 80?", False, "number"),
    ("Set an alarm for 7 am.", "Wake me up at 7 in the morning.", True, "paraphrase"),
    ("Set an alarm for 7 am.", "Set an alarm for 7 pm.", False, "number"),
    ("Set an alarm for 7 am.", "Cancel my alarm for 7 am.", False, "negation"),
    ("Book a table for 4 at 8 pm.", "Reserve a table for four people at 8 in the evening.",
     True, "paraphrase"),
    ("Book a table for 4 at 8 pm.", "Book a table for 6 at 8 pm.", False, "number"),
    ("Book a table for 4 at 8 pm.", "Book a table for 4 at 9 pm.", False, "number"),
]

# ---- Written after the guards of meshd/cache/guards.py and the 0.85 default were frozen
# (split "fresh"): nothing below was looked at while choosing them. Same rules as above.
HEIGHT = ["How tall is {x}?", "What is the height of {x}?", "What's the height of {x}?",
          "How high is {x}?", "Tell me the height of {x}."]
PEAKS = ["Mount Everest", "K2", "Mont Blanc", "Kilimanjaro", "Denali", "the Eiffel Tower"]
WHERE_IS = "Where is {x}?"
CLIMBED = "Who first climbed {x}?"

CURRENCY = ["What currency does {x} use?", "Which currency is used in {x}?",
            "What's the official currency of {x}?", "What money do they use in {x}?",
            "Tell me the currency of {x}."]
LANDS = ["Switzerland", "Mexico", "India", "Sweden", "Thailand", "Poland"]
LANGUAGE = "What language is spoken in {x}?"

TIMES = ["What is {a} times {b}?", "What's {a} multiplied by {b}?", "Multiply {a} by {b}.",
         "Calculate {a} x {b}.", "What do you get when you multiply {a} and {b}?"]
PRODUCTS = [(12, 12), (7, 8), (25, 4), (13, 17), (9, 11), (45, 3)]
DIVIDED = "What is {a} divided by {b}?"

CELSIUS = ["Convert {n} degrees Celsius to Fahrenheit.", "What is {n} °C in Fahrenheit?",
           "How much is {n} Celsius in Fahrenheit?", "{n} C to F?",
           "Express {n} degrees Celsius in Fahrenheit."]
TEMPERATURES = [0, 25, 37, 100, 15, 60]
FAHRENHEIT = "Convert {n} degrees Fahrenheit to Celsius."

INSTALL = ["How do I install {x} on Ubuntu?", "What's the way to install {x} on Ubuntu?",
           "Steps to install {x} on Ubuntu?", "How can I get {x} installed on Ubuntu?",
           "Install {x} on Ubuntu: how?"]
PACKAGES = [("Docker", "Podman"), ("PostgreSQL", "MySQL"), ("nginx", "Apache"),
            ("Git", "Mercurial"), ("Redis", "Memcached")]
UNINSTALL = "How do I uninstall {x} on Ubuntu?"
ON_WINDOWS = "How do I install {x} on Windows?"
UPDATE = "How do I update {x} on Ubuntu?"

LIFESPAN = ["How long do {x} live?", "What is the lifespan of {x}?",
            "What's the average life expectancy of {x}?", "How many years do {x} live?",
            "Typical lifespan of {x}?"]
ANIMALS = [("cats", "rabbits"), ("dogs", "wolves"), ("horses", "donkeys"),
           ("elephants", "rhinos"), ("parrots", "pigeons"), ("goldfish", "koi")]
WEIGH = "How much do {x} weigh?"
EAT = "What do {x} eat?"

HAND_FRESH: list[tuple[str, str, bool, str]] = [
    ("How do I delete my account?", "What's the process for closing my account permanently?",
     True, "paraphrase"),
    ("How do I delete my account?", "I want to remove my account, how?", True, "paraphrase"),
    ("How do I delete my account?", "How do I recover my deleted account?", False, "relation"),
    ("How do I delete my account?", "How do I delete my browsing history?", False, "entity"),
    ("What's the best way to learn Spanish?", "How should I go about learning Spanish?", True,
     "paraphrase"),
    ("What's the best way to learn Spanish?", "Tips for learning Spanish effectively?", True,
     "paraphrase"),
    ("What's the best way to learn Spanish?", "What's the best way to learn Portuguese?", False,
     "entity"),
    ("What's the best way to learn Spanish?", "What's the worst way to learn Spanish?", False,
     "negation"),
    ("When does daylight saving time start in the US?",
     "What date do clocks spring forward in the US?", True, "paraphrase"),
    ("When does daylight saving time start in the US?",
     "When do Americans move their clocks forward?", True, "paraphrase"),
    ("When does daylight saving time start in the US?",
     "When does daylight saving time end in the US?", False, "negation"),
    ("When does daylight saving time start in the US?",
     "When does daylight saving time start in Europe?", False, "entity"),
    ("Can dogs eat grapes?", "Are grapes safe for dogs?", True, "paraphrase"),
    ("Can dogs eat grapes?", "Is it OK to give my dog grapes?", True, "paraphrase"),
    ("Can dogs eat grapes?", "Can cats eat grapes?", False, "entity"),
    ("Can dogs eat grapes?", "Can dogs eat carrots?", False, "entity"),
    ("How many calories are in a banana?", "What's the calorie count of a banana?", True,
     "paraphrase"),
    ("How many calories are in a banana?", "A banana has how many calories?", True,
     "paraphrase"),
    ("How many calories are in a banana?", "How many calories are in an apple?", False,
     "entity"),
    ("How many calories are in a banana?", "How much potassium is in a banana?", False,
     "relation"),
    ("What is the difference between a virus and a bacterium?",
     "How do viruses differ from bacteria?", True, "paraphrase"),
    ("What is the difference between a virus and a bacterium?",
     "Virus vs bacteria: what's the difference?", True, "paraphrase"),
    ("What is the difference between a virus and a bacterium?",
     "What is the difference between a virus and a fungus?", False, "entity"),
    ("What is the difference between a virus and a bacterium?",
     "What do a virus and a bacterium have in common?", False, "relation"),
    ("How do I convert a string to an integer in Python?",
     "Python: turn a string into an int?", True, "paraphrase"),
    ("How do I convert a string to an integer in Python?",
     "What's the way to parse an integer from a string in Python?", True, "paraphrase"),
    ("How do I convert a string to an integer in Python?",
     "How do I convert an integer to a string in Python?", False, "relation"),
    ("How do I convert a string to an integer in Python?",
     "How do I convert a string to an integer in Java?", False, "entity"),
    ("What is the refund policy?", "Can I get my money back?", True, "paraphrase"),
    ("What is the refund policy?", "How do refunds work here?", True, "paraphrase"),
    ("What is the refund policy?", "What is the shipping policy?", False, "entity"),
    ("What is the refund policy?", "What is the privacy policy?", False, "entity"),
    ("Is coffee bad for your heart?", "Does drinking coffee harm the heart?", True,
     "paraphrase"),
    ("Is coffee bad for your heart?", "Can coffee cause heart problems?", True, "paraphrase"),
    ("Is coffee bad for your heart?", "Is coffee good for your heart?", False, "negation"),
    ("Is coffee bad for your heart?", "Is coffee bad for your teeth?", False, "entity"),
    ("How long does it take to fly from London to New York?",
     "What's the flight time between London and New York?", True, "paraphrase"),
    ("How long does it take to fly from London to New York?",
     "How many hours is a flight from London to New York?", True, "paraphrase"),
    ("How long does it take to fly from London to New York?",
     "How long does it take to fly from New York to London?", False, "relation"),
    ("How long does it take to fly from London to New York?",
     "How long does it take to drive from London to Edinburgh?", False, "entity"),
    ("What should I do if I get a flat tire?", "My tire is flat, what now?", True,
     "paraphrase"),
    ("What should I do if I get a flat tire?", "Steps to handle a flat tyre?", True,
     "paraphrase"),
    ("What should I do if I get a flat tire?", "What should I do if my car battery dies?",
     False, "entity"),
    ("What should I do if I get a flat tire?", "How do I prevent a flat tire?", False,
     "relation"),
    ("Who won the 2018 World Cup?", "Which country won the World Cup in 2018?", True,
     "paraphrase"),
    ("Who won the 2018 World Cup?", "2018 World Cup winner?", True, "paraphrase"),
    ("Who won the 2018 World Cup?", "Who won the 2014 World Cup?", False, "number"),
    ("Who won the 2018 World Cup?", "Who hosted the 2018 World Cup?", False, "relation"),
    ("How much water should I drink a day?", "What's the recommended daily water intake?",
     True, "paraphrase"),
    ("How much water should I drink a day?", "How many liters of water per day should I drink?",
     True, "paraphrase"),
    ("How much water should I drink a day?", "How much coffee should I drink a day?", False,
     "entity"),
    ("How much water should I drink a day?", "How much water should a dog drink a day?", False,
     "entity"),
    ("What's the fastest land animal?", "Which animal runs the fastest on land?", True,
     "paraphrase"),
    ("What's the fastest land animal?", "Which land animal has the highest top speed?", True,
     "paraphrase"),
    ("What's the fastest land animal?", "What's the slowest land animal?", False, "negation"),
    ("What's the fastest land animal?", "What's the fastest bird?", False, "entity"),
    ("How do I take a screenshot on a Mac?", "How can I capture my screen on macOS?", True,
     "paraphrase"),
    ("How do I take a screenshot on a Mac?", "Mac screenshot shortcut?", True, "paraphrase"),
    ("How do I take a screenshot on a Mac?", "How do I take a screenshot on Windows?", False,
     "entity"),
    ("How do I take a screenshot on a Mac?", "How do I record my screen on a Mac?", False,
     "relation"),
    ("Why do cats purr?", "What makes cats purr?", True, "paraphrase"),
    ("Why do cats purr?", "What's the reason cats purr?", True, "paraphrase"),
    ("Why do cats purr?", "Why do cats hiss?", False, "relation"),
    ("Why do cats purr?", "Why do dogs wag their tails?", False, "entity"),
    ("Is it going to rain in Seattle this weekend?", "Will it rain in Seattle on the weekend?",
     True, "paraphrase"),
    ("Is it going to rain in Seattle this weekend?", "Weekend rain forecast for Seattle?", True,
     "paraphrase"),
    ("Is it going to rain in Seattle this weekend?",
     "Is it going to snow in Seattle this weekend?", False, "entity"),
    ("Is it going to rain in Seattle this weekend?",
     "Is it going to rain in Seattle next weekend?", False, "number"),
    ("How do I cancel my flight booking?", "I need to cancel my flight reservation, how?", True,
     "paraphrase"),
    ("How do I cancel my flight booking?", "What's the procedure to cancel a flight I booked?",
     True, "paraphrase"),
    ("How do I cancel my flight booking?", "How do I change my flight booking?", False,
     "relation"),
    ("How do I cancel my flight booking?", "How do I cancel my hotel booking?", False, "entity"),
    ("What are the side effects of aspirin?", "Does aspirin have side effects?", True,
     "paraphrase"),
    ("What are the side effects of aspirin?", "What adverse effects can aspirin cause?", True,
     "paraphrase"),
    ("What are the side effects of aspirin?", "What are the side effects of paracetamol?",
     False, "entity"),
    ("What are the side effects of aspirin?", "What are the benefits of aspirin?", False,
     "negation"),
    ("What is the tallest building in the world?", "Which building is the tallest on Earth?",
     True, "paraphrase"),
    ("What is the tallest building in the world?", "World's tallest building?", True,
     "paraphrase"),
    ("What is the tallest building in the world?", "What is the tallest building in Europe?",
     False, "entity"),
    ("What is the tallest building in the world?", "What is the oldest building in the world?",
     False, "relation"),
    ("Set a timer for 10 minutes.", "Start a ten-minute timer.", True, "paraphrase"),
    ("Set a timer for 10 minutes.", "Timer for 10 min, please.", True, "paraphrase"),
    ("Set a timer for 10 minutes.", "Set a timer for 15 minutes.", False, "number"),
    ("Set a timer for 10 minutes.", "Cancel the timer for 10 minutes.", False, "negation"),
]


def _family(name: str, phrasings: list[str], values: list[dict[str, Any]],
            misses: list[tuple[str, str, dict[str, Any], str]]) -> list[dict[str, Any]]:
    """Anchor = phrasings[0] with each value; paraphrases = the other phrasings with the same
    value; near misses = (kind, phrasing, changed slots, answer suffix) applied to the value."""
    out = []
    for v in values:
        key = name + ":" + ",".join(f"{k}={v[k]}" for k in sorted(v) if not k.startswith("_"))
        anchor = phrasings[0].format(**v)
        for p in phrasings[1:]:
            out.append(_pair(key, anchor, p.format(**v), True, "paraphrase", key, key))
        for kind, phrasing, change, tag in misses:
            w = {**v, **{k: (c(v) if callable(c) else c) for k, c in change.items()}}
            text = (phrasing or phrasings[0]).format(**w)
            other = name + tag + ":" + ",".join(f"{k}={w[k]}" for k in sorted(w)
                                                 if not k.startswith("_"))
            out.append(_pair(key, anchor, text, False, kind, key, other))
    return out


def build() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    nxt = {c: COUNTRIES[(i + 1) % len(COUNTRIES)] for i, c in enumerate(COUNTRIES)}
    rows += _family("capital", CAPITAL, [{"x": c} for c in COUNTRIES], [
        ("entity", "", {"x": lambda v: nxt[v["x"]]}, ""),
        ("entity", CAPITAL[1], {"x": lambda v: nxt[nxt[v["x"]]]}, ""),
        ("relation", LARGEST, {}, "-largest"),
    ])
    rows += _family("plus", PLUS, [{"a": a, "b": b} for a, b in SUMS], [
        ("number", "", {"b": lambda v: v["b"] + 1}, ""),
        ("number", PLUS[2], {"a": lambda v: v["a"] * 10}, ""),
        ("relation", MINUS, {}, "-minus"),
    ])
    rows += _family("miles", MILES, [{"n": n} for n in DISTANCES], [
        ("number", "", {"n": lambda v: v["n"] + 7}, ""),
        ("number", MILES[1], {"n": lambda v: v["n"] * 2}, ""),
        ("relation", KM, {}, "-km"),
    ])
    rows += _family("define", DEFINE, [{"x": w, "_o": o} for w, o in WORDS], [
        ("negation", "", {"x": lambda v: v["_o"]}, ""),
        ("negation", DEFINE[1], {"x": lambda v: v["_o"]}, ""),
    ])
    rows += _family("author", AUTHOR, [{"x": b, "_o": o} for b, o in BOOKS], [
        ("entity", "", {"x": lambda v: v["_o"]}, ""),
        ("entity", AUTHOR[1], {"x": lambda v: v["_o"]}, ""),
        ("relation", PUBLISHED, {}, "-published"),
    ])
    rows += _family("translate", TRANSLATE,
                    [{"p": p, "l": lang, "_p": p2, "_l": l2} for p, lang, p2, l2 in PHRASES], [
        ("entity", "", {"l": lambda v: v["_l"]}, ""),
        ("entity", "", {"p": lambda v: v["_p"]}, ""),
        ("entity", TRANSLATE[1], {"l": lambda v: v["_l"]}, ""),
    ])
    rows += _family("code", CODE, [{"x": a, "_o": b} for a, b in LANGS], [
        ("entity", "", {"x": lambda v: v["_o"]}, ""),
        ("entity", CODE[3], {"x": lambda v: v["_o"]}, ""),
        ("relation", SORT, {}, "-sort"),
    ])
    rows += _family("weather", WEATHER, [{"x": a, "_o": b} for a, b in CITIES], [
        ("entity", "", {"x": lambda v: v["_o"]}, ""),
        ("number", TOMORROW, {}, "-tomorrow"),
    ])
    rows += _family("2fa", HOWTO, [{"v": a, "_o": b} for a, b in TOGGLES], [
        ("negation", "", {"v": lambda v: v["_o"]}, ""),
        ("negation", HOWTO[1], {"v": lambda v: v["_o"]}, ""),
        ("negation", HOWTO[2], {"v": lambda v: v["_o"]}, ""),
    ])
    rows += _family("food", FOOD, [{"x": a, "_o": b} for a, b in NUTRIENTS], [
        ("entity", "", {"x": lambda v: v["_o"]}, ""),
        ("negation", FOOD_NOT, {}, "-not"),
        ("entity", FOOD[2], {"x": lambda v: v["_o"]}, ""),
    ])
    rows += _family("population", POPULATION, [{"x": a, "_o": b} for a, b in TOWNS], [
        ("entity", "", {"x": lambda v: v["_o"]}, ""),
        ("entity", POPULATION[1], {"x": lambda v: v["_o"]}, ""),
        ("relation", AREA, {}, "-area"),
    ])
    for i, (a, b, same, kind) in enumerate(HAND):
        key = "hand:" + a
        rows.append(_pair(key, a, b, same, kind, key, key if same else f"hand:{i}"))
    for r in rows:
        r["split"] = _split(r, rows)
    fresh = _family("height", HEIGHT, [{"x": x} for x in PEAKS], [
        ("entity", "", {"x": lambda v: PEAKS[(PEAKS.index(v["x"]) + 1) % len(PEAKS)]}, ""),
        ("relation", WHERE_IS, {}, "-where"),
        ("relation", CLIMBED, {}, "-climbed"),
    ])
    fresh += _family("currency", CURRENCY, [{"x": x} for x in LANDS], [
        ("entity", "", {"x": lambda v: LANDS[(LANDS.index(v["x"]) + 1) % len(LANDS)]}, ""),
        ("entity", CURRENCY[2], {"x": lambda v: LANDS[(LANDS.index(v["x"]) + 2) % len(LANDS)]},
         ""),
        ("relation", LANGUAGE, {}, "-language"),
    ])
    fresh += _family("times", TIMES, [{"a": a, "b": b} for a, b in PRODUCTS], [
        ("number", "", {"b": lambda v: v["b"] + 1}, ""),
        ("number", TIMES[1], {"a": lambda v: v["a"] * 2}, ""),
        ("relation", DIVIDED, {}, "-divided"),
    ])
    fresh += _family("celsius", CELSIUS, [{"n": n} for n in TEMPERATURES], [
        ("number", "", {"n": lambda v: v["n"] + 5}, ""),
        ("number", CELSIUS[2], {"n": lambda v: v["n"] * 2 + 10}, ""),
        ("relation", FAHRENHEIT, {}, "-f"),
    ])
    fresh += _family("install", INSTALL, [{"x": x, "_o": o} for x, o in PACKAGES], [
        ("entity", "", {"x": lambda v: v["_o"]}, ""),
        ("negation", UNINSTALL, {}, "-uninstall"),
        ("entity", ON_WINDOWS, {}, "-windows"),
        ("relation", UPDATE, {}, "-update"),
    ])
    fresh += _family("lifespan", LIFESPAN, [{"x": x, "_o": o} for x, o in ANIMALS], [
        ("entity", "", {"x": lambda v: v["_o"]}, ""),
        ("entity", LIFESPAN[3], {"x": lambda v: v["_o"]}, ""),
        ("relation", WEIGH, {}, "-weigh"),
        ("relation", EAT, {}, "-eat"),
    ])
    for i, (a, b, same, kind) in enumerate(HAND_FRESH):
        key = "handfresh:" + a
        fresh.append(_pair(key, a, b, same, kind, key, key if same else f"handfresh:{i}"))
    for r in fresh:
        r["split"] = "fresh"
    return (rows + fresh + build_fresh2() + build_groups(FRESH3, "fresh3")
            + build_groups(FRESH4, "fresh4") + build_groups(FRESH5, "fresh5"))


def build_fresh2() -> list[dict[str, Any]]:
    """The ``fresh2`` split (cache_fresh2.py): each near miss has an answer of its own."""
    out = []
    for anchor, paraphrases, misses in FRESH2:
        key = "fresh2:" + anchor
        for b in paraphrases:
            out.append(_pair(key, anchor, b, True, "paraphrase", key, key))
        for i, (b, kind) in enumerate(misses):
            out.append(_pair(key, anchor, b, False, kind, key, f"{key}#{i}"))
    for r in out:
        r["split"] = "fresh2"
    return out


def _split(row: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """``tune`` or ``test`` for the first 544 pairs: the template families alternate in the
    order they are made (capital tune, plus test, miles tune, ...); hand-written anchors
    alternate in the order they first appear."""
    family = row["group"].split(":")[0]
    if family == "hand":
        anchors = list(dict.fromkeys(r["a"] for r in rows if r["group"].startswith("hand:")))
        return "test" if anchors.index(row["a"]) % 2 else "tune"
    families = list(dict.fromkeys(r["group"].split(":")[0] for r in rows))
    return "test" if families.index(family) % 2 else "tune"


def main() -> None:
    rows = build()
    with OUT.open("w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    pos = sum(r["same"] for r in rows)
    kinds: dict[str, int] = {}
    for r in rows:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    print(f"{len(rows)} pairs ({pos} same answer, {len(rows) - pos} different) -> {OUT}; "
          f"{kinds}")


if __name__ == "__main__":
    main()
