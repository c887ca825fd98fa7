"""Chunking for retrieval: a document's text in, overlapping passages out. Pure: no I/O.

The text is first cut into **blocks** that must not be split when they fit a chunk:

- Markdown: a fenced code block (```` ``` ```` or ``~~~`` up to its closing fence) is one block;
  a heading line is a block of its own and names the section of what follows; the rest is
  paragraphs, separated by blank lines;
- plain text: paragraphs, separated by blank lines;
- source code: runs of lines separated by blank lines (a function, a class header, a comment).

Blocks are then packed greedily into chunks of at most ``max_chars``. A block longer than that
is split at line ends (code) or sentence ends (prose), and a single overlong line at spaces,
as a last resort. Each chunk after the first starts with the tail of the one before it (at most
``overlap_chars``): the last whole blocks that fit, else the last sentences or lines of the last
block, so a passage that straddles a boundary is found whole in one of the two; a fenced code
block is only ever carried whole. A heading is never left alone at the end of a chunk: it moves
to the next one, with its section.

Every chunk keeps its 1-based line range in the document and the heading it falls under, so a
source can be shown as ``docs/cache.md:12-40``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_CHARS = 1000  # about 250 tokens of all-MiniLM-L6-v2's 256: the embedding sees it all
OVERLAP_CHARS = 200
MARKDOWN = ("md", "markdown", "mdx", "rst")
CODE = ("py", "pyi", "rs", "go", "c", "h", "cc", "cpp", "hpp", "js", "ts", "tsx", "jsx", "java",
        "kt", "rb", "sh", "bash", "toml", "yaml", "yml", "json", "sql", "lua", "swift", "cs",
        "proto", "ini", "cfg")
_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+\S")
_SENTENCE_END = re.compile(r"(?<=[.!?:;])\s+")


@dataclass(frozen=True, slots=True)
class Block:
    start: int  # first line, 1-based
    end: int  # last line, inclusive
    text: str
    kind: str  # "para", "code" (a fenced block or source), "heading"


@dataclass(frozen=True, slots=True)
class Chunk:
    text: str
    start_line: int
    end_line: int
    heading: str = ""  # the Markdown heading this chunk starts under ("" if none)


def kind_of(name: str) -> str:
    """``markdown``, ``code`` or ``text`` from a file name's extension."""
    ext = name.rsplit(".", 1)[-1].lower() if "." in name else ""
    if ext in MARKDOWN:
        return "markdown"
    if ext in CODE:
        return "code"
    return "text"


def blocks(text: str, kind: str) -> list[Block]:
    """The document cut into blocks (see the module's doc). ``kind``: markdown, code or text."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    out: list[Block] = []
    run: list[str] = []
    run_start = 0

    def flush(end: int, what: str = "para") -> None:
        nonlocal run
        while run and not run[-1].strip():
            run.pop()
            end -= 1
        if run:
            out.append(Block(run_start, end, "\n".join(run), what))
        run = []

    i = 0
    n = len(lines)
    code_kind = "code" if kind == "code" else "para"
    while i < n:
        line = lines[i]
        if kind == "markdown" and _FENCE.match(line):
            flush(i)
            fence = _FENCE.match(line).group(1)  # type: ignore[union-attr]
            j = i + 1
            while j < n and not lines[j].lstrip().startswith(fence):
                j += 1
            j = min(j, n - 1)
            out.append(Block(i + 1, j + 1, "\n".join(lines[i:j + 1]), "code"))
            i = j + 1
            continue
        if kind == "markdown" and _HEADING.match(line):
            flush(i)
            out.append(Block(i + 1, i + 1, line.strip(), "heading"))
            i += 1
            continue
        if not line.strip():
            flush(i, code_kind)
            i += 1
            continue
        if not run:
            run_start = i + 1
        run.append(line)
        i += 1
    flush(n, code_kind)
    return out


def _pieces(b: Block, max_chars: int) -> list[Block]:
    """``b`` as it is when it fits, else cut into pieces of at most ``max_chars``: at line ends
    (code, and prose with line breaks), then sentence ends, then spaces, then anywhere."""
    if len(b.text) <= max_chars:
        return [b]
    out: list[Block] = []
    cur: list[tuple[int, str]] = []  # (line number, text) of the piece being built
    for k, line in enumerate(b.text.split("\n")):
        for p in [line] if len(line) <= max_chars else _split_line(line, max_chars):
            if cur and sum(len(x) + 1 for _, x in cur) + len(p) > max_chars:
                out.append(Block(cur[0][0], cur[-1][0], "\n".join(x for _, x in cur), b.kind))
                cur = []
            cur.append((b.start + k, p))
    if cur:
        out.append(Block(cur[0][0], cur[-1][0], "\n".join(x for _, x in cur), b.kind))
    return out


def _split_line(line: str, max_chars: int) -> list[str]:
    """One overlong line as pieces of at most ``max_chars``: sentences, else words, else chars."""
    units = [s for s in _SENTENCE_END.split(line) if s]
    if any(len(u) > max_chars for u in units):
        units = [w for w in line.split(" ") if w]
    out: list[str] = []
    cur = ""
    for u in units:
        while len(u) > max_chars:  # a "word" longer than a chunk (minified code, a URL)
            if cur:
                out.append(cur)
                cur = ""
            out.append(u[:max_chars])
            u = u[max_chars:]
        if cur and len(cur) + 1 + len(u) > max_chars:
            out.append(cur)
            cur = u
        else:
            cur = f"{cur} {u}" if cur else u
    if cur:
        out.append(cur)
    return out


def _tail(b: Block, overlap_chars: int) -> Block | None:
    """The end of ``b`` to repeat at the start of the next chunk: its last sentences (prose) or
    lines (code not fenced) within ``overlap_chars``; None for a fenced block or a heading."""
    if b.kind == "heading" or b.text.lstrip().startswith(("```", "~~~")):
        return None
    lines = b.text.split("\n")
    if len(lines) > 1:
        keep: list[str] = []
        for line in reversed(lines):
            if sum(len(x) + 1 for x in keep) + len(line) > overlap_chars:
                break
            keep.insert(0, line)
        if keep:
            return Block(b.end - len(keep) + 1, b.end, "\n".join(keep), b.kind)
        if b.kind == "code":
            return None
    sentences = [s for s in _SENTENCE_END.split(lines[-1]) if s]
    keep = []
    for s in reversed(sentences[1:] if len(sentences) > 1 else []):
        if sum(len(x) + 1 for x in keep) + len(s) > overlap_chars:
            break
        keep.insert(0, s)
    if not keep:
        return None
    return Block(b.end, b.end, " ".join(keep), b.kind)


def chunk_text(text: str, kind: str = "text", *, max_chars: int = MAX_CHARS,
               overlap_chars: int = OVERLAP_CHARS) -> list[Chunk]:
    """The document as chunks of at most ``max_chars`` (plus nothing: the overlap counts), each
    after the first starting with up to ``overlap_chars`` of the one before."""
    if max_chars < 16:
        raise ValueError("max_chars must be at least 16")
    if not 0 <= overlap_chars < max_chars // 2:
        raise ValueError("overlap_chars must be in [0, max_chars / 2)")
    pieces = [p for b in blocks(text, kind) for p in _pieces(b, max_chars)]
    chunks: list[Chunk] = []
    cur: list[Block] = []
    fresh = 0  # blocks in cur that are not overlap
    heading = ""
    cur_heading = ""

    def size(bs: list[Block]) -> int:
        return sum(len(b.text) for b in bs) + 2 * max(0, len(bs) - 1)

    def emit() -> list[Block]:
        """Close the current chunk; return the blocks the next one starts with."""
        nonlocal cur, fresh
        carry_heading: list[Block] = []
        while cur and cur[-1].kind == "heading" and len(cur) > 1:  # a heading goes with its text
            carry_heading.insert(0, cur.pop())
        chunks.append(Chunk("\n\n".join(b.text for b in cur), cur[0].start, cur[-1].end,
                            cur_heading))
        if carry_heading:
            return carry_heading
        carry: list[Block] = []
        for b in reversed(cur):
            if b.kind == "heading" or size([b, *carry]) > overlap_chars:
                break
            carry.insert(0, b)
        if not carry and overlap_chars:
            t = _tail(cur[-1], overlap_chars)
            carry = [t] if t is not None else []
        if len(carry) == len(cur):  # never repeat a whole chunk
            carry = []
        return carry

    for p in pieces:
        if cur and fresh and size([*cur, p]) > max_chars:
            carry = emit()
            while carry and size([*carry, p]) > max_chars:
                carry.pop(0)
            cur, fresh = carry, 0
            cur_heading = heading
        if not cur:
            cur_heading = heading
        if p.kind == "heading":
            heading = p.text.lstrip("# ").strip()
            if not fresh:
                cur_heading = heading
        cur.append(p)
        fresh += 1
    if cur and fresh:
        chunks.append(Chunk("\n\n".join(b.text for b in cur), cur[0].start, cur[-1].end,
                            cur_heading))
    return chunks
