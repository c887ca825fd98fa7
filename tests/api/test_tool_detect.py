"""Which real chat templates meshd takes for its hermes and llama3 tool families
(meshd.api.tool_template.detect), and which it leaves to the generic format.

``<tool_call>`` in a template is no proof of the hermes syntax: GLM-4.x and Spark write
``<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>``, Qwen3-Coder, Qwen3.5,
StepFun and Nemotron 3 ``<tool_call>\\n<function=name>\\n<parameter=k>...``, MiniMax-M3 a
namespaced ``<tool_call>`` around XML arguments. meshd's hermes grammar and parser would force and
read Qwen's JSON in those, which their models were not trained on.

The templates in tests/api/templates are copies of llama.cpp's (tests/api/templates/README.md),
so the table test runs in any checkout; where scripts/build_llama_cpp.sh has unpacked its sdist,
the detection runs over all of llama.cpp's templates and the sets must be exactly these.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from meshd.api import tool_template
from meshd.testing.llamacpp import vendored_templates

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from chat_templates import LLAMA32, QWEN25  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "templates"
SDIST = "llama_cpp_python-0.3.36"  # the sdist scripts/build_llama_cpp.sh pins

# each copied template, the family meshd must take it for (None: the generic format), and why
TABLE = {
    "Qwen-Qwen3-0.6B.jinja": "hermes",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "hermes",  # newlines typed raw
    "GLM-4.6.jinja": None,  # <tool_call>name\n<arg_key>...: lists tools in <tools> all the same
    "GLM-4.7-Flash.jinja": None,  # <tool_call>name<arg_key>...
    "MiniMax-M3.jinja": None,  # ]<]minimax[>[<tool_call> around XML arguments
    "Qwen3-Coder.jinja": None,  # <tool_call>\n<function=name>\n<parameter=...>
    # Qwen's call syntax, but the tools listed in <|function_list|>, not <tools>: not the
    # hermes family as meshd defines it
    "Bielik-11B-v3.0-Instruct.jinja": None,
}

# over all of llama.cpp's templates in SDIST (70 files): exactly these are hermes and llama3
VENDORED_HERMES = {
    "MiMo-VL.jinja",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
    "Qwen-QwQ-32B.jinja",
    "Qwen-Qwen2.5-7B-Instruct.jinja",
    "Qwen-Qwen3-0.6B.jinja",
    "Reka-Edge.jinja",
    "ibm-granite-granite-4.0.jinja",
    "ibm-granite-granite-4.1.jinja",
}
VENDORED_LLAMA3 = {
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "meta-llama-Llama-3.2-3B-Instruct.jinja",
    "meta-llama-Llama-3.3-70B-Instruct.jinja",
}
VENDORED_COUNT = 70
# templates that write <tool_call> and are not hermes (the defect this guards against)
VENDORED_TOOL_CALL_NOT_HERMES = {
    "Bielik-11B-v3.0-Instruct.jinja", "GLM-4.6.jinja", "GLM-4.7-Flash.jinja", "MiniMax-M3.jinja",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", "Qwen3-Coder.jinja", "Qwen3.5-4B.jinja",
    "Spark2.5.jinja", "StepFun3.5-Flash.jinja", "inclusionai-ling-3.0-flash.jinja",
    "poolside-Laguna-S-2.1.jinja", "poolside-Laguna-XS-2.1.jinja", "poolside-Laguna-XS.2.jinja",
    "unsloth-Apriel-1.5.jinja",
}


def family(template: str | None) -> str | None:
    found = tool_template.detect(template)
    return found.name if found is not None else None


@pytest.mark.parametrize(("name", "expected"), sorted(TABLE.items()))
def test_detect_on_real_templates(name: str, expected: str | None) -> None:
    text = (FIXTURES / name).read_text()
    assert "<tool_call>" in text  # every one writes the tag: only hermes may be taken for it
    assert family(text) == expected


def test_every_copied_template_is_in_the_table() -> None:
    assert {p.name for p in FIXTURES.glob("*.jinja")} == set(TABLE)


def test_the_templates_the_other_tests_render_stay_detected() -> None:
    assert tool_template.detect(QWEN25) is tool_template.HERMES
    assert tool_template.detect(LLAMA32) is tool_template.LLAMA3


@pytest.mark.parametrize(("template", "expected"), [
    # Qwen's whole markup, rendered: hermes
    ("{% if tools %}<tools>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>{% endif %}"
     "{% for m in messages %}{% for c in m.tool_calls or [] %}<tool_call>\n{\"name\": \""
     "{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}\n</tool_call>"
     "{% endfor %}{% endfor %}", "hermes"),
    # the same, failing on the probe chat: the generic format, no error
    ("{% if tools %}<tools>{{ raise_exception('no tools here') }}</tools>{% endif %}"
     "<tool_call>\n{\"name\": ", None),
    # the call without the tools listed in <tools>
    ("{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}"
     "{% for c in m.tool_calls or [] %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", "
     "\"arguments\": {{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}{% endfor %}",
     None),
    # a template that does not compile
    ("{% if tools %}<tools>{% generation %}<tool_call>", None),
])
def test_detect_renders_the_call(template: str, expected: str | None) -> None:
    assert family(template) == expected


def test_detect_over_every_template_llama_cpp_vendors() -> None:
    where = vendored_templates()
    if where is None:
        pytest.skip("llama.cpp's templates are not unpacked (scripts/build_llama_cpp.sh unpacks "
                    "them; .ci/run does): the table test above covers copies of a few")
    assert where.parents[3].name == SDIST, \
        f"{where}: not {SDIST}; update the expected sets with scripts/build_llama_cpp.sh's pin"
    found = {p.name: family(p.read_text()) for p in sorted(where.glob("*.jinja"))}
    assert len(found) == VENDORED_COUNT
    assert {n for n, f in found.items() if f == "hermes"} == VENDORED_HERMES
    assert {n for n, f in found.items() if f == "llama3"} == VENDORED_LLAMA3
    assert set(found.values()) == {"hermes", "llama3", None}
    writes_tag = {n for n in found if "<tool_call>" in (where / n).read_text()}
    assert writes_tag - VENDORED_HERMES == VENDORED_TOOL_CALL_NOT_HERMES
    for name in TABLE:  # the copies are the vendored files, byte for byte
        assert (FIXTURES / name).read_bytes() == (where / name).read_bytes(), name
