"""Guards v3 (``meshd.cache.guards``, docstring 7-11): closed classes of words where one member
for another changes the answer: times, weather, arithmetic operations, units, on/off actions.
Each refuses only when both prompts name a member of its class (so a paraphrase that leaves
the word out passes), except the deictic times ("tomorrow", "next week", "tonight"), which
refuse when one prompt alone has one. Pure functions of the two texts.
"""

from __future__ import annotations

import re

from meshd.cache.lexical import numbers, stem, words

_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august",
           "september", "october", "november", "december")
_TIME_NOUNS = frozenset({
    "week", "weekend", "month", "year", "morning", "afternoon", "evening", "night", "noon",
    "midday", "midnight", "summer", "winter", "autumn", *_WEEKDAYS, *_MONTHS})
_TIME_SHIFT = frozenset({"next", "last", "previous", "coming", "past"})
_TIME_ALONE = {"tonight": "evening", "tomorrow": "tomorrow", "yesterday": "yesterday",
               "overnight": "evening"}
_TIME_CANON = {"night": "evening", "midday": "noon"}
_DEICTIC = frozenset({"tomorrow", "yesterday", "tonight"})  # and every "next"/"last" time


def times(text: str) -> set[str]:
    """The times a prompt names, canonical: "next weekend", "friday", "evening" (tonight),
    "tomorrow". "this X" is X; "today" and "now" name nothing (the default). "May" counts only
    when not the verb (capitalised, not opening a sentence)."""
    ws = [stem(w) if w.endswith("s") and stem(w) in _WEEKDAYS else w for w in words(text)]
    may = "may" in ws and bool(re.search(r"\w[^.?!]*\bMay\b", text))
    out: set[str] = set()
    for i, w in enumerate(ws):
        if w in _TIME_ALONE:
            out.add(_TIME_ALONE[w])
        elif w in _TIME_NOUNS and (w != "may" or may):
            t = _TIME_CANON.get(w, w)
            out.add(f"{ws[i - 1]} {t}" if i and ws[i - 1] in _TIME_SHIFT else t)
    return out


def time_differs(query: str, cached: str) -> bool:
    ta, tb = times(query), times(cached)
    if ta == tb:
        return False
    if ta and tb:
        return True
    one, text = (ta, query) if ta else (tb, cached)  # named in one prompt only:
    return (any(t.split()[0] in _TIME_SHIFT for t in one)  # next week, last Friday
            or any(w in _DEICTIC for w in words(text)))  # tomorrow, tonight


WEATHER: dict[str, tuple[str, ...]] = {
    "rain": ("rain", "raining", "rainy", "rainfall", "showers", "drizzle"),
    "snow": ("snow", "snowing", "snowy", "snowfall", "blizzard"),
    "sleet": ("sleet",), "hail": ("hail", "hailstorm"),
    "sun": ("sunny", "sunshine"), "cloud": ("cloudy", "overcast", "clouds"),
    "wind": ("wind", "windy", "gusts", "gusty"), "fog": ("fog", "foggy", "mist", "misty"),
    "storm": ("storm", "storms", "stormy", "thunderstorm", "thunder", "lightning"),
    "frost": ("frost", "frosty"), "heat": ("heatwave",), "humid": ("humid", "humidity"),
    "hurricane": ("hurricane",), "tornado": ("tornado",), "flood": ("flood", "flooding"),
}
_WEATHER = {w: kind for kind, ws in WEATHER.items() for w in ws}


def weather_differs(query: str, cached: str) -> bool:
    wa = {_WEATHER[w] for w in words(query) if w in _WEATHER}
    wb = {_WEATHER[w] for w in words(cached) if w in _WEATHER}
    return bool(wa and wb and wa != wb)


OPERATIONS: dict[str, tuple[str, ...]] = {
    "add": ("plus", "add", "added", "adding", "sum", "+"),
    "subtract": ("minus", "subtract", "subtracted", "subtracting", "-"),
    "multiply": ("times", "multiply", "multiplied", "multiplying", "product", "x", "*", "×"),
    "divide": ("divide", "divided", "dividing", "quotient", "/", "÷"),
    "power": ("power", "squared", "cubed", "^", "**"),
    "root": ("root", "sqrt", "√"),
    "percent": ("percent", "percentage", "%"),
    "mean": ("average", "mean"), "median": ("median",),
    "remainder": ("remainder", "modulo", "mod"),
}
OPERATION_OF = {w: op for op, ws in OPERATIONS.items() for w in ws}
_OP_SYMBOL = re.compile(r"\d\s*(\*\*|[-+*/x×÷^])\s*(?=[\d√])|\d\s*(%)|(√)")


def operations(text: str) -> set[str]:
    """The arithmetic operations a prompt names, in words or as symbols between numbers."""
    low = text.lower()
    ops = {OPERATION_OF[w] for w in words(low) if w in OPERATION_OF and w != "x"}
    ops |= {OPERATION_OF[next(g for g in m.groups() if g)] for m in _OP_SYMBOL.finditer(low)}
    return ops


def operation_differs(query: str, cached: str) -> bool:
    if not (numbers(query) and numbers(cached)):
        return False  # "the difference between ..." is not arithmetic
    oa, ob = operations(query), operations(cached)
    return bool(oa and ob and oa != ob)


UNITS: dict[str, tuple[str, tuple[str, ...]]] = {  # canonical: (dimension, spellings)
    "km": ("length", ("km", "kilometer", "kilometers", "kilometre", "kilometres")),
    "mile": ("length", ("mi", "mile", "miles")),
    "m": ("length", ("meter", "meters", "metre", "metres")),
    "cm": ("length", ("cm", "centimeter", "centimeters", "centimetre", "centimetres")),
    "mm": ("length", ("mm", "millimeter", "millimeters", "millimetre", "millimetres")),
    "ft": ("length", ("ft", "foot", "feet")), "inch": ("length", ("inch", "inches")),
    "yard": ("length", ("yard", "yards", "yd")),
    "kg": ("mass", ("kg", "kilo", "kilos", "kilogram", "kilograms", "kilogramme")),
    "g": ("mass", ("gram", "grams", "gramme", "grammes")),
    "lb": ("mass", ("lb", "lbs", "pound", "pounds")), "oz": ("mass", ("oz", "ounce", "ounces")),
    "ton": ("mass", ("ton", "tons", "tonne", "tonnes")),
    "l": ("volume", ("liter", "liters", "litre", "litres")),
    "ml": ("volume", ("ml", "milliliter", "milliliters", "millilitre", "millilitres")),
    "gallon": ("volume", ("gallon", "gallons", "gal")), "pint": ("volume", ("pint", "pints")),
    "cup": ("volume", ("cup", "cups")),
    "tbsp": ("volume", ("tbsp", "tablespoon", "tablespoons")),
    "tsp": ("volume", ("tsp", "teaspoon", "teaspoons")),
    "C": ("temperature", ("celsius", "centigrade", "°c")),
    "F": ("temperature", ("fahrenheit", "°f")), "K": ("temperature", ("kelvin",)),
    "second": ("time", ("seconds", "sec", "secs")),
    "minute": ("time", ("minute", "minutes", "min", "mins")),
    "hour": ("time", ("hour", "hours", "hr", "hrs")), "day": ("time", ("day", "days")),
    "week": ("time", ("week", "weeks")), "month": ("time", ("month", "months")),
    "year": ("time", ("year", "years")),
    "usd": ("money", ("dollar", "dollars", "usd", "$")),
    "eur": ("money", ("euro", "euros", "eur", "€")), "gbp": ("money", ("gbp", "£", "sterling")),
    "yen": ("money", ("yen", "jpy", "¥")),
    "mph": ("speed", ("mph",)), "kmh": ("speed", ("kph", "kmh")),
}
_UNIT = {sp: (canon, dim) for canon, (dim, sps) in UNITS.items() for sp in sps}
_UNIT_TOKEN = re.compile(r"[$€£¥]|°[cf]?|\d+(?:[.,:]\d+)*|[a-z]+")
_AFTER_NUMBER = {"c": "C", "f": "F"}  # "25 C to F": letters that are units after a number
_SKIP = frozenset({"degrees", "degree", "°", "square", "cubic"})


def units(text: str) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(the unit written after each number, {number: {unit}}; the units of each dimension
    named anywhere, {dimension: {unit}})."""
    toks = _UNIT_TOKEN.findall(text.lower())
    after: dict[str, set[str]] = {}
    named: dict[str, set[str]] = {}
    for i, tok in enumerate(toks):
        if tok in _UNIT:
            canon, dim = _UNIT[tok]
            named.setdefault(dim, set()).add(canon)
        if not tok[0].isdigit():
            continue
        n = tok.replace(",", "")
        if i and toks[i - 1] in "$€£¥" and toks[i - 1] in _UNIT:
            after.setdefault(n, set()).add(_UNIT[toks[i - 1]][0])
        j = i + 1
        while j < len(toks) and toks[j] in _SKIP:
            j += 1
        if j < len(toks) and (tok_u := toks[j]) in _UNIT:
            after.setdefault(n, set()).add(_UNIT[tok_u][0])
        elif j < len(toks) and toks[j] in _AFTER_NUMBER:
            after.setdefault(n, set()).add(_AFTER_NUMBER[toks[j]])
            named.setdefault("temperature", set()).add(_AFTER_NUMBER[toks[j]])
    return after, named


def units_differ(query: str, cached: str) -> bool:
    (aa, na), (ab, nb) = units(query), units(cached)
    if any(aa[n] != ab[n] for n in aa.keys() & ab.keys()):
        return True  # "3 kilometers" / "3 miles"
    return any(na[d] != nb[d] for d in na.keys() & nb.keys())


ON_VERBS = frozenset({
    "enable", "enabled", "enabling", "activate", "activated", "install", "installed",
    "installing", "start", "started", "starting", "create", "created", "subscribe", "connect",
    "set", "book", "schedule", "add", "open", "join"})
OFF_VERBS = frozenset({
    "disable", "disabled", "disabling", "deactivate", "deactivated", "uninstall",
    "uninstalled", "uninstalling", "stop", "stopped", "stopping", "remove", "removed",
    "removing", "delete", "deleted", "deleting", "cancel", "cancelled", "canceled",
    "cancelling", "unsubscribe", "disconnect", "close", "closing", "quit", "leave"})
_SWITCHES = frozenset({"turn", "turned", "turning", "switch", "switched", "switching"})


def polarity(text: str) -> set[str]:
    """"on" for a verb that creates or switches on, "off" for one that removes or switches
    off; "turn ... on/off" and "switch ... on/off" count, within three words."""
    ws = words(text)
    out = {"on" for w in ws if w in ON_VERBS} | {"off" for w in ws if w in OFF_VERBS}
    for i, w in enumerate(ws):
        if w in _SWITCHES:
            out |= {p for p in ws[i + 1:i + 5] if p in ("on", "off")}
        if w == "set" and i + 1 < len(ws) and ws[i + 1] == "up":
            out.add("on")
    return out


def action_differs(query: str, cached: str) -> bool:
    pa, pb = polarity(query), polarity(cached)
    return len(pa) == 1 and len(pb) == 1 and pa != pb
