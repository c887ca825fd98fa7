"""Write benchmarks/data/tier_prompts.jsonl: prompts labelled simple / complex for the tier
classifier (issue 16; docs/tiers.md). Deterministic: re-running it rewrites the same file.

    .venv/bin/python benchmarks/data/make_tier_prompts.py

Each line: ``{"text", "label", "family", "template", "source", "split"}``. ``label`` is
``simple`` (a micro model can answer it) or ``complex`` (it needs a large model); the rule is in
benchmarks/data/README.md. ``family`` names the generator, ``template`` the phrasing inside it
(``hand:<n>`` for hand-written prompts); ``split`` is ``train`` or ``test``: one template in
five of every family (at least one) is held out whole, so no phrasing seen in training is
tested; hand-written prompts are split one in five by position.

Sources, all in this file or this repository: template families with slot vocabularies written
for this set, hand-written prompts (``HAND_SIMPLE``, ``HAND_COMPLEX``), passages of this
repository's own docs (docs/*.md) and functions of its own source (meshd/**/*.py).
"""

from __future__ import annotations

import ast
import json
import random
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "tier_prompts.jsonl"
PER_FAMILY = 100
HOLD_EVERY = 5

# ---------------------------------------------------------------- vocabularies
COUNTRIES = ["France", "Japan", "Kenya", "Peru", "Norway", "Canada", "Egypt", "Vietnam", "Chile",
             "Portugal", "Ghana", "Finland", "Mexico", "India", "Poland", "Morocco", "Greece"]
CITIES = ["Lisbon", "Osaka", "Nairobi", "Lima", "Bergen", "Toronto", "Cairo", "Hanoi", "Porto",
          "Accra", "Tampere", "Oaxaca", "Pune", "Krakow", "Fez", "Athens", "Seville"]
WORDS = ["necessary", "accommodate", "rhythm", "conscientious", "embarrass", "occurrence",
         "millennium", "definitely", "separate", "recommend", "liaison", "questionnaire",
         "bureaucracy", "entrepreneur", "mischievous", "threshold", "guarantee", "privilege"]
MISSPELT = ["neccessary", "acommodate", "rythm", "consciencious", "embarass", "occurence",
            "millenium", "definately", "seperate", "reccomend", "liason", "questionaire",
            "beaurocracy", "entrepeneur", "mischievious", "threshhold", "garantee", "priviledge"]
ADJS = ["ephemeral", "candid", "meticulous", "benevolent", "ubiquitous", "frugal", "lucid",
        "obstinate", "serene", "tenacious", "verbose", "wary", "aloof", "brisk", "earnest"]
LANGS = ["French", "Spanish", "German", "Italian", "Portuguese", "Dutch", "Swedish", "Polish"]
PHRASES = ["good morning", "thank you", "where is the station", "the bill, please", "I am lost",
           "how much is this", "see you tomorrow", "happy birthday", "open the window", "cheese"]
NAMES = ["Ana", "Bilal", "Chen", "Dagny", "Emeka", "Farah", "Goran", "Hana", "Ivo", "Jun",
         "Kofi", "Lena", "Mateo", "Nia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tariq"]
FOODS = ["apples", "loaves", "bottles of milk", "tickets", "pencils", "boxes", "eggs", "plants"]
TOPICS = ["the printing press", "antibiotics", "container shipping", "the telegraph",
          "public libraries", "vaccination", "the bicycle", "refrigeration", "the compass",
          "paper money", "railways", "the steam engine", "radio", "the transistor", "canals"]
FIELDS = ["urban planning", "agriculture", "public health", "education", "journalism",
          "logistics", "energy policy", "banking", "fisheries", "tourism", "insurance"]
SYSTEMS = ["a ride-sharing app", "a hospital appointment system", "a library catalogue",
           "a multiplayer chess server", "a photo-sharing service", "a payroll system",
           "an online exam platform", "a package-tracking service", "a chat application",
           "a ticket booking site", "a warehouse inventory system", "a URL shortener"]
LANGS_CODE = ["Python", "Rust", "Go", "JavaScript", "TypeScript", "Java", "C++", "Kotlin"]
CODE_TASKS = ["parses a CSV file and returns the average of each numeric column",
              "implements an LRU cache with O(1) get and put",
              "finds the shortest path in a weighted graph with Dijkstra's algorithm",
              "merges overlapping intervals in a list",
              "validates a Sudoku board",
              "implements a thread-safe bounded queue",
              "serialises a binary tree to a string and back",
              "rate-limits calls with a token bucket",
              "computes the edit distance between two strings",
              "parses arithmetic expressions with operator precedence",
              "retries an HTTP request with exponential backoff and jitter",
              "detects a cycle in a directed graph",
              "streams a large file and counts word frequencies in constant memory",
              "implements a trie with prefix search"]
MOODS = ["positive", "negative"]
REVIEWS = ["The soup was cold and the waiter ignored us.", "Lovely room, friendly staff, great view!",
           "Battery died after two days.", "Fast delivery and it works perfectly.",
           "Terrible support, never again.", "Exactly what I needed, thanks.",
           "The film dragged on far too long.", "Best pizza in town, hands down.",
           "The app crashes every time I open it.", "Comfortable shoes that fit well."]
UNITS = [("kilometres", "metres", 1000), ("hours", "minutes", 60), ("kilograms", "grams", 1000),
         ("metres", "centimetres", 100), ("minutes", "seconds", 60), ("days", "hours", 24),
         ("litres", "millilitres", 1000), ("feet", "inches", 12)]
ANIMALS = ["octopus", "giraffe", "penguin", "honeybee", "camel", "owl", "salmon", "bat", "ant"]
CONCEPTS = ["recursion", "inflation", "photosynthesis", "entropy", "supply and demand",
            "natural selection", "compound interest", "plate tectonics", "opportunity cost",
            "the greenhouse effect", "herd immunity", "public-key cryptography"]
THEOREMS = ["there are infinitely many prime numbers", "the square root of 2 is irrational",
            "the sum of the first n odd numbers is n squared",
            "every tree with n nodes has n - 1 edges",
            "a graph is bipartite if and only if it has no odd cycle",
            "the product of two consecutive integers is even",
            "log2(n!) grows like n log n", "any two medians of a triangle intersect inside it",
            "there is no largest even number", "binary search runs in O(log n) comparisons"]


def pick(rng: random.Random, xs: list[Any]) -> Any:
    return xs[rng.randrange(len(xs))]


# ---------------------------------------------------------------- repository text
def doc_passages() -> list[str]:
    """Paragraphs of this repository's docs, 60 to 400 words (prose only)."""
    out: list[str] = []
    for p in sorted((ROOT / "docs").glob("*.md")):
        for para in re.split(r"\n\s*\n", p.read_text(encoding="utf-8")):
            text = " ".join(para.split())
            if text.startswith(("|", "```", "#", "-", "*")) or not 60 <= len(text.split()) <= 400:
                continue
            out.append(text)
    return out


def code_functions() -> list[tuple[str, str]]:
    """(name, source) of functions of meshd, 6 to 40 lines."""
    out: list[tuple[str, str]] = []
    for p in sorted((ROOT / "meshd").rglob("*.py")):
        src = p.read_text(encoding="utf-8")
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        lines = src.splitlines()
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno:
                n = node.end_lineno - node.lineno + 1
                if 6 <= n <= 40:
                    body = "\n".join(lines[node.lineno - 1:node.end_lineno])
                    out.append((node.name, _dedent(body)))
    return out


def _dedent(text: str) -> str:
    lines = text.splitlines()
    pad = min(len(x) - len(x.lstrip()) for x in lines if x.strip())
    return "\n".join(x[pad:] for x in lines)


def short_sentence(passages: list[str], rng: random.Random) -> str:
    p = pick(rng, passages)
    s = re.split(r"(?<=[.!?])\s+", p)
    return pick(rng, [x for x in s if 5 <= len(x.split()) <= 30] or [p[:160]])


# ---------------------------------------------------------------- families
# Each family: (name, label, [template, ...], filler(rng) -> slot dict). A template may also be
# a callable (rng, slots) -> text for shapes that do not fit one format string.
Family = tuple[str, str, list[Any], Any]


def families(passages: list[str], funcs: list[tuple[str, str]]) -> list[Family]:
    def num(rng: random.Random) -> dict[str, Any]:
        return {"a": rng.randint(2, 99), "b": rng.randint(2, 99), "c": rng.randint(2, 12)}

    def any_slots(rng: random.Random) -> dict[str, Any]:
        i = rng.randrange(len(WORDS))
        a, b, f = pick(rng, UNITS)
        code_name, code = pick(rng, funcs)
        return {"country": pick(rng, COUNTRIES), "city": pick(rng, CITIES), "word": WORDS[i],
                "bad": MISSPELT[i], "adj": pick(rng, ADJS), "lang": pick(rng, LANGS),
                "phrase": pick(rng, PHRASES), "name": pick(rng, NAMES), "name2": pick(rng, NAMES),
                "food": pick(rng, FOODS), "topic": pick(rng, TOPICS), "field": pick(rng, FIELDS),
                "system": pick(rng, SYSTEMS), "pl": pick(rng, LANGS_CODE),
                "task": pick(rng, CODE_TASKS), "review": pick(rng, REVIEWS),
                "u_big": a, "u_small": b, "u_f": f, "animal": pick(rng, ANIMALS),
                "concept": pick(rng, CONCEPTS), "concept2": pick(rng, CONCEPTS),
                "theorem": pick(rng, THEOREMS), "code": code, "fn": code_name,
                "passage": pick(rng, passages), "sentence": short_sentence(passages, rng),
                "email": f"{pick(rng, NAMES).lower()}.{rng.randint(1, 99)}@example.org",
                "year": rng.randint(1850, 2025), "day": rng.randint(1, 28),
                "topic2": pick(rng, TOPICS), **num(rng)}

    S, C = "simple", "complex"
    return [
        ("spelling", S, [
            "How do you spell {word}?", "Is '{bad}' spelled correctly?",
            "Correct the spelling: {bad}", "spell check: {bad}",
            "What's the right spelling of '{bad}'?", "Fix the typo in this word: {bad}",
            "Which is correct, '{word}' or '{bad}'?"], any_slots),
        ("capital_fact", S, [
            "What is the capital of {country}?", "capital of {country}?",
            "Which country is {city} in?", "Name the currency used in {country}.",
            "What language do people speak in {country}?", "Is {city} a capital city?",
            "In which continent is {country}?"], any_slots),
        ("definition", S, [
            "Define '{adj}' in one sentence.", "What does {adj} mean?",
            "Give a synonym for {adj}.", "What is the opposite of {adj}?",
            "Use the word '{adj}' in a short sentence.", "Is '{adj}' an adjective or a noun?",
            "meaning of {adj}"], any_slots),
        ("translate_word", S, [
            "Translate '{phrase}' into {lang}.", "How do you say '{phrase}' in {lang}?",
            "'{phrase}' in {lang}?", "What is {lang} for '{phrase}'?",
            "Give me the {lang} words for '{phrase}'.", "{lang} translation of \"{phrase}\""],
         any_slots),
        ("arithmetic", S, [
            "What is {a} + {b}?", "{a} times {c}?", "Compute {a} - {b}.", "What's {a} divided by {c}?",
            "Is {a} an even number?", "Round {a}.{b} to the nearest whole number.",
            "What is {c} squared?", "Which is larger, {a} or {b}?"], any_slots),
        ("unit_convert", S, [
            "How many {u_small} are in {c} {u_big}?", "Convert {c} {u_big} to {u_small}.",
            "{c} {u_big} in {u_small}?", "What is {a} {u_small} in {u_big}, roughly?",
            "How many {u_small} make one {u_big}?"], any_slots),
        ("sentiment", S, [
            "Is this review positive or negative? \"{review}\"",
            "Sentiment of: {review}", "Label the tone of this comment: {review}",
            "One word: happy or unhappy customer? {review}",
            "Classify as positive/negative: {review}"], any_slots),
        ("extract", S, [
            "Extract the email address from this message: Hi, please write to {email} before {day} May.",
            "What date is mentioned here? 'The meeting moved to {day} March {year}.'",
            "Pull out the person's name: '{name} will bring the keys tomorrow.'",
            "Which city is mentioned in: 'We landed in {city} late on Sunday.'",
            "What number appears in this sentence: 'Order {a} {food} for the party.'",
            "Find the year in: 'The bridge opened in {year} after long delays.'"], any_slots),
        ("grammar_edit", S, [
            "Fix the grammar: '{name} don't like {food}.'", "Capitalise this: {sentence}",
            "Put this sentence in the past tense: '{name} walks to {city}.'",
            "Make this plural: '{adj} cat'", "Add the missing punctuation: {name} said hello",
            "Rewrite in lower case: {sentence}", "Remove the extra spaces: '{name}   and   {name2}'"],
         any_slots),
        ("chitchat", S, [
            "hi", "Hello! How are you?", "thanks, that helped", "good night {name}",
            "Tell me a one-line joke about {animal}s.", "What's a nice name for a pet {animal}?",
            "ok", "Say hello to {name} in {lang}."], any_slots),
        ("trivia", S, [
            "How many legs does a {animal} have?", "What colour is a ripe banana?",
            "Who painted the Mona Lisa?", "How many days are there in a leap year?",
            "What do {animal}s eat?", "Is a {animal} a mammal?", "What is the boiling point of water in Celsius?",
            "Which planet is closest to the sun?"], any_slots),
        ("code_lookup", S, [
            "What does len() return in Python?", "Which keyword defines a function in {pl}?",
            "What is the name of the function defined below?\n```\n{code}\n```",
            "How do I print hello world in {pl}?", "Is {pl} statically typed?",
            "What file extension do {pl} source files use?",
            "How many arguments does this function take?\n{code}"], any_slots),
        ("passage_lookup", S, [
            "What is the first word of this passage?\n\n{passage}",
            "Copy the last sentence of this text exactly:\n{passage}",
            "Does the following text mention the word 'node'? Answer yes or no.\n\n{passage}",
            "Give this paragraph a title of at most four words:\n{passage}",
            "Which language is this text written in?\n{passage}"], any_slots),
        ("list_edit", S, [
            "Sort these names alphabetically: {name}, {name2}, Zoe, Adam",
            "Reverse this list: {a}, {b}, {c}", "Which of these is a fruit: chair, apple, cloud?",
            "Count the words in: '{sentence}'", "Remove duplicates: {name}, {name2}, {name}",
            "Join with commas: {city} {country} {lang}"], any_slots),
        # ---------------------------------------------------------------- complex
        ("code_write", C, [
            "Write a {pl} function that {task}. Include tests.",
            "Implement, in {pl}, a module that {task}, and explain its time complexity.",
            "I need {pl} code that {task}; handle errors and edge cases.",
            "Can you write a class in {pl} which {task}? Add docstrings.",
            "Give me an efficient {pl} implementation that {task}, then compare it with a naive one.",
            "write {pl} that {task}"], any_slots),
        ("code_debug", C, [
            "This function has a bug when the input is empty. Find it and fix it:\n```python\n{code}\n```",
            "Explain step by step what this code does and how it could fail:\n{code}",
            "Refactor this function for readability and add type hints:\n```\n{code}\n```",
            "Write unit tests covering every branch of this function:\n{code}",
            "Port this function to {pl}, keeping its behaviour:\n```\n{code}\n```",
            "Review this code like a senior engineer: correctness, naming, performance.\n{code}"],
         any_slots),
        ("word_problem", C, [
            "{name} buys {a} {food} at {c} dollars each and sells them at {b} dollars each, "
            "but a fifth spoil. How much profit is made? Show your reasoning.",
            "A train leaves {city} at {c}:00 going {a} km/h; another leaves an hour later at {b} km/h "
            "on the same track. When does the second catch up, if ever? Explain.",
            "If {a} workers build a wall in {c} days, how long do {b} workers need, and what "
            "assumptions does that answer make?",
            "A tank fills in {c} hours and drains in {a} hours. Starting empty with both open, when is "
            "it full? Work it out step by step.",
            "{name} has {a} coins, gives {name2} a third, then doubles what is left and loses {c}. "
            "How many remain? Explain each step.",
            "What is the probability of getting at least two sixes in {c} rolls of a fair die? "
            "Derive it."], any_slots),
        ("proof", C, [
            "Prove that {theorem}.", "Give a rigorous proof that {theorem}.",
            "Explain why {theorem}, as you would to a first-year student, with a proof.",
            "Is it true that {theorem}? Prove or disprove it.",
            "Sketch two different proofs that {theorem} and compare them."], any_slots),
        ("essay", C, [
            "Write a 600-word essay on how {topic} changed {field}.",
            "Write a detailed article about the history of {topic}, with sections and a conclusion.",
            "Compose a persuasive op-ed arguing that {field} should adopt lessons from {topic}.",
            "Write a short story of about 800 words in which {name} discovers {topic}.",
            "Draft a long-form explainer on {concept} for a general audience, with examples.",
            "essay: the impact of {topic} on {field} (at least five paragraphs)"], any_slots),
        ("compare_analyse", C, [
            "Compare {topic} and {topic2} in their effects on {field}, and say which mattered more and why.",
            "Analyse the trade-offs between {concept} and {concept2} as explanations in {field}.",
            "What are the strongest arguments for and against relying on {topic} in {field}? Weigh them.",
            "Critically evaluate the claim that {topic} did more for {field} than any other invention.",
            "Explain {concept} and {concept2}, how they interact, and give a worked example of each.",
            "Contrast how {field} worked before and after {topic}, citing at least three mechanisms."],
         any_slots),
        ("system_design", C, [
            "Design the architecture of {system}: components, data model, scaling and failure modes.",
            "How would you build {system} to serve ten million users? Walk through the design.",
            "Propose a database schema and API for {system}, and justify your choices.",
            "Plan the migration of {system} from a monolith to services without downtime.",
            "What are the main security risks of {system} and how would you mitigate each?",
            "Design {system} in {pl}; describe modules, concurrency and testing strategy."], any_slots),
        ("planning", C, [
            "Make a detailed 12-week study plan for learning {concept} from scratch, with milestones.",
            "Plan a two-week trip through {country} visiting {city}, with a budget and daily schedule.",
            "Create a step-by-step project plan to introduce {topic} into a small {field} organisation.",
            "Draft a business plan for a startup in {field}: market, costs, risks, and first-year goals.",
            "Outline a research proposal on {concept} in {field}: question, method, and evaluation."],
         any_slots),
        ("passage_reason", C, [
            "Summarise the following passage in three bullet points, then critique its argument:\n\n{passage}",
            "Read this and explain the design decision it describes, its alternatives and their costs:\n{passage}",
            "Rewrite this text for a non-technical reader, keeping every fact:\n\n{passage}",
            "What assumptions does this passage make, and which of them could fail in practice?\n{passage}",
            "Turn this passage into five exam questions with model answers:\n\n{passage}"], any_slots),
        ("explain_deep", C, [
            "Explain {concept} in depth, including the mathematics behind it.",
            "Why does {concept} happen? Give the mechanism, an analogy, and a common misconception.",
            "Teach me {concept} step by step, checking my understanding with questions as you go.",
            "How is {concept} modelled quantitatively, and where do the models break down?",
            "Derive the key equation of {concept} and interpret each term."], any_slots),
        ("multi_step_task", C, [
            "Translate this paragraph into {lang}, then explain three idioms you had to adapt:\n{sentence} {sentence}",
            "Given {a} {food} split among {c} friends with the remainder donated, write a Python "
            "script that prints each share and then prove it is fair.",
            "Read these reviews, group them by theme, and write a report with recommendations: "
            "{review} | {review} | {review} | {review}",
            "Create a SQL schema for {system}, write three queries for common reports, and explain the indexes.",
            "First list the causes of {concept}, then rank them by importance, then propose a policy for each."],
         any_slots),
    ]


HAND_SIMPLE = [
    "What time zone is London in?", "How many minutes are in an hour?", "Spell 'colour' the American way.",
    "Is it 'its' or 'it's' in: the dog wagged ___ tail?", "What's the plural of mouse?",
    "Name a primary colour.", "Who is the author of Hamlet?", "What is 15% of 200?",
    "Give me a word that rhymes with cat.", "What is the chemical symbol for gold?",
    "Say 'yes' in Japanese.", "Convert 100 Fahrenheit to Celsius.", "How many sides does a hexagon have?",
    "What's the first letter of the Greek alphabet?", "Is Pluto a planet?", "what day comes after monday",
    "Translate 'dog' to German.", "Shorten 'for example' to its abbreviation.",
    "What's 2 to the power of 10?", "Which is heavier, a kilo of feathers or a kilo of iron?",
    "Give me the antonym of 'ancient'.", "How many continents are there?", "What's the square root of 81?",
    "Fix: 'i has a apple'", "Is 'recieve' spelled right?", "Is JSON a programming language?",
    "What port does HTTPS use by default?", "What does CPU stand for?", "What does `git status` do?",
    "What is the file extension of a Markdown file?", "Lowercase this: HELLO WORLD",
    "Which month has 28 days in a common year?", "Name the largest ocean.", "What's the opposite of 'up'?",
    "How do you say thank you in Spanish?", "Thanks a lot!", "bonjour", "Wie spät ist es? Antworte kurz.",
    "¿Cuál es la capital de España?", "Quelle est la couleur du ciel ?", "Wer hat Faust geschrieben?",
    "Extract the number: 'Room 314 is on the third floor.'", "Is this a question: 'Close the door.'",
    "Is 97 a prime number?", "What is 12 times 12?", "Put these in order: 3, 1, 2",
    "What's the capital of Australia?", "Define 'algorithm' in one line.", "How many bytes in a kilobyte?",
    "What does the abbreviation 'e.g.' mean?", "Which animal says moo?", "Reply with OK if you can read this.",
    "What's the freezing point of water in Fahrenheit?", "Name one noble gas.", "Is Python case-sensitive?",
    "What does HTML stand for?", "Give me a synonym for 'happy'.", "How many hours are in a week?",
    "Is the sentence 'She run fast' correct?", "What's the past tense of 'go'?",
]

HAND_COMPLEX = [
    "Explain why the Monty Hall problem's answer is to switch, and simulate it in Python.",
    "Design a gossip protocol for 10,000 nodes that detects failures within 5 seconds; analyse its bandwidth.",
    "Write a compiler front end for arithmetic expressions in Rust: lexer, parser, and AST evaluator.",
    "Compare consensus algorithms Raft and Paxos: safety, liveness, and operational complexity.",
    "Why did the Roman Republic fall? Weigh the economic, military and political explanations.",
    "Prove that a greedy algorithm gives an optimal solution to interval scheduling.",
    "My Kubernetes pods restart every few minutes with OOMKilled but memory graphs look fine. How do I investigate?",
    "Write a cover letter for a senior data engineer role, tailored to a logistics company, about 400 words.",
    "Derive the formula for the variance of a binomial distribution.",
    "Plan a database migration from MySQL to PostgreSQL for a 2 TB production system with no downtime.",
    "Explain backpropagation with the chain rule, using a two-layer network as a worked example.",
    "Draft a privacy policy for a fitness app that stores heart-rate data, covering GDPR obligations.",
    "What would happen to the global economy if shipping costs doubled overnight? Reason it through.",
    "Solve: find all integer solutions of x^2 - y^2 = 45, and explain the method.",
    "Write a bash script that backs up a directory incrementally with rotation, then explain each part.",
    "Critique this argument: 'Since crime fell after cameras were installed, cameras reduce crime.'",
    "Outline a semester-long syllabus for an introductory course on distributed systems.",
    "Write a sonnet about the sea in iambic pentameter and explain its rhyme scheme.",
    "How does TCP congestion control work? Cover slow start, AIMD and fast recovery with a timeline.",
    "Refactor a 2,000-line Python module into packages: propose the layout and the order of steps.",
    "Given a stream of a billion integers, estimate the number of distinct values in 1 MB of memory. Explain the algorithm and its error.",
    "Explain the differences between processes, threads and async tasks, with examples where each wins.",
    "Write a negotiation email to a supplier asking for a 10% discount, anticipating their objections.",
    "Design an experiment to test whether a new onboarding flow improves 30-day retention.",
    "Erkläre ausführlich, wie ein Transformer-Modell funktioniert, mit Formeln.",
    "Explique en détail les causes de la Révolution française et leurs conséquences à long terme.",
    "Escribe un programa en Python que resuelva el problema de las ocho reinas y explica el algoritmo.",
    "Why is P vs NP important? Explain reductions with an example.",
    "Write a threat model for a peer-to-peer inference network whose nodes are run by strangers.",
    "Explain how a B-tree keeps itself balanced on insert and delete, with a worked example.",
    "Write a SQL query for the top 3 customers by revenue per region per month, and explain window functions.",
    "Reconcile these two accounts of the same event and say which is more credible and why: (a) the bridge fell because of the flood; (b) the bridge fell because of neglected maintenance.",
    "A company's revenue grew 20% but profit fell 30%. List plausible causes and how to test each.",
    "Create a detailed recipe for sourdough bread with a feeding schedule and troubleshooting guide.",
    "Implement a lock-free single-producer single-consumer ring buffer in C and argue its correctness.",
    "Explain general relativity's prediction of gravitational time dilation and how GPS corrects for it.",
    "Prove that the halting problem is undecidable.", "Write a regex engine supporting . * and | in Python.",
    "How should a city choose between building a tram line and a bus rapid transit line? Lay out the analysis.",
    "Summarise the arguments of both sides in the debate over nuclear power and give your assessment.",
    "Write a Dockerfile and a CI pipeline for a Python web service, and explain the caching strategy.",
    "What are the ethical issues of using AI in hiring, and what safeguards would you recommend?",
    "Teach me dynamic programming using the knapsack problem, with code and a table walkthrough.",
    "Model the spread of a rumour in a social network and explain what the parameters mean.",
    "Write an async Python web crawler with a politeness delay, a depth limit and deduplication.",
    "Explain the CAP theorem and classify five real databases under it, justifying each.",
    "Draft the architecture decision record for moving our queue from RabbitMQ to Kafka.",
    "Diagnose: my React app re-renders a list of 10k rows on every keystroke. Fix it with code.",
    "Explain how public-key certificates chain to a root CA and what happens when one is revoked.",
    "Write a 1,000-word short story set on a generation ship, with a twist ending.",
    "Why does ice float? Explain at the level of hydrogen bonding and compare with other solids.",
    "Compute the expected number of coin flips to see two heads in a row, with a derivation.",
    "Build a budget spreadsheet model for a family of four, then explain how to stress-test it.",
    "Analyse the time and space complexity of merge sort, quicksort and heapsort, and when to use each.",
    "Write Terraform for a VPC with public and private subnets and a NAT gateway; explain the routing.",
    "Explain how vaccines train the immune system and why some need boosters.",
    "Translate this legal clause into plain English and list the obligations it creates: 'The Licensee shall indemnify and hold harmless the Licensor from any claims arising out of the Licensee's use of the Software.'",
    "Write a Python class for a bank account with overdraft rules, interest, and a full pytest suite.",
    "Explain why the sky is blue and sunsets are red, including the wavelength dependence of scattering.",
    "Propose three research questions about edge inference and a method to answer each.",
]


def generate() -> list[dict[str, Any]]:
    passages, funcs = doc_passages(), code_functions()
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for fi, (name, label, templates, filler) in enumerate(families(passages, funcs)):
        rng = random.Random(1000 + fi)
        order = list(range(len(templates)))
        random.Random(7 + fi).shuffle(order)
        held = set(order[:max(1, round(len(templates) * 0.22))])
        made, tries = 0, 0
        while made < PER_FAMILY and tries < PER_FAMILY * 20:
            tries += 1
            ti = made % len(templates) if tries <= PER_FAMILY else rng.randrange(len(templates))
            text = templates[ti].format(**filler(rng))
            if text in seen:
                continue
            seen.add(text)
            source = ("repo-docs" if "{passage}" in templates[ti] or "{sentence}" in templates[ti]
                      else "repo-code" if "{code}" in templates[ti] else "template")
            rows.append({"text": text, "label": label, "family": name, "template": f"{name}:{ti}",
                         "source": source, "split": "test" if ti in held else "train"})
            made += 1
    for label, hand in (("simple", HAND_SIMPLE), ("complex", HAND_COMPLEX)):
        for i, text in enumerate(hand):
            rows.append({"text": text, "label": label, "family": f"hand_{label}",
                         "template": f"hand:{label}:{i}", "source": "hand-written",
                         "split": "test" if i % HOLD_EVERY == 2 else "train"})
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> dict[str, int]:
    """Write ``rows`` one JSON object a line; returns the count of each label."""
    with path.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return {k: sum(1 for r in rows if r["label"] == k) for k in ("simple", "complex")}


def main() -> None:
    rows = generate()
    n = write_jsonl(OUT, rows)
    t = sum(1 for r in rows if r["split"] == "test")
    print(f"wrote {OUT} rows={len(rows)} simple={n['simple']} complex={n['complex']} test={t}")


if __name__ == "__main__":
    main()
