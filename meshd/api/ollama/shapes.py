"""Ollama request bodies as SUBMIT fields. Pure: no I/O.

``chat_call`` (``POST /api/chat``) and ``generate_call`` (``POST /api/generate``) turn an Ollama
request into the SUBMIT-shaped fields that ``meshd.core.request.parse_submit`` checks, exactly as
the OpenAI API's ``meshd.api.shapes`` does, so both enter the mesh the same way. The rules
(docs/ollama.md):

- ``options`` that meshd's sampler honours are mapped (``OPTION_FIELDS``); ``num_ctx`` is checked
  against the model's context by the handler (``check_num_ctx``);
- options that would change the text and that meshd cannot honour are a 400 naming them, unless
  they carry their neutral value (``NEUTRAL_OPTIONS``);
- options that only say how a local Ollama should run the model (threads, GPU layers, memory
  mapping: ``RUNTIME_OPTIONS``) cannot change the text and are ignored (``OllamaCall.ignored``,
  logged at debug level); option names that are not Ollama's are ignored too, as Ollama ignores
  them, and logged as a warning (``OllamaCall.unknown``);
- a top-level field meshd cannot honour (``format``, ``tools``, images, ``think``, ``suffix``,
  ``template``, ``context``, ...) is a 400 naming it when it asks for something; its empty value
  (what the official client sends by default) is accepted. Other unknown top-level fields are
  ignored, as Ollama's own server ignores them.

Errors are ``ApiError`` (status 400), whose message starts with the field's name; the handler
answers them in Ollama's shape, ``{"error": message}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meshd.api.errors import bad_request, unsupported

# option -> SUBMIT field: honoured as they are
OPTION_FIELDS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "seed": "seed",
                 "repeat_penalty": "repetition_penalty", "stop": "stop", "num_predict": "max_tokens"}
# options that change the sampled text and that meshd's sampler does not have: only the value
# that changes nothing is accepted (repeat_last_n -1 is "the whole context", the window meshd's
# repetition penalty reads; penalize_newline true is what meshd does: newlines are penalized
# like every other token; mirostat's tau and eta mean nothing while mirostat is 0)
NEUTRAL_OPTIONS: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (0,), "frequency_penalty": (0,), "mirostat": (0,), "min_p": (0,),
    "typical_p": (1,), "tfs_z": (1,), "repeat_last_n": (-1,), "penalize_newline": (True,),
}
_MIROSTAT_ONLY = ("mirostat_tau", "mirostat_eta")
# options about how a local Ollama runs the model: they cannot change the text; ignored
RUNTIME_OPTIONS = frozenset({
    "numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only",
    "use_mmap", "use_mlock", "embedding_only", "num_thread", "num_keep", "num_gqa",
    "rope_frequency_base", "rope_frequency_scale",
})
# meshd's own request fields, accepted at the top level as the OpenAI API accepts them
EXTENSIONS = ("strategy", "residency", "pipeline", "cache", "rag", "allow_lower_tier")
STRUCTURED_OUTPUT = ("structured output (format \"json\" or a JSON schema) is not supported by "
                     "meshd yet")
NO_TOOLS = "tools are not supported by meshd yet"


@dataclass(frozen=True)
class OllamaCall:
    """A checked Ollama generation request."""

    kind: str  # "chat" or "generate"
    model: str  # as the client named it (answers echo it)
    fields: dict[str, Any]  # SUBMIT fields for parse_submit (without model and client)
    stream: bool = True  # Ollama streams unless told "stream": false
    num_ctx: int | None = None  # checked against the model's context by the handler
    load_only: bool = False  # no prompt: Ollama's "load the model" request, answered at once
    ignored: tuple[str, ...] = ()  # runtime options: accepted, without effect
    unknown: tuple[str, ...] = ()  # option names that are not Ollama's: ignored


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _empty(v: Any) -> bool:
    """What the official client sends for a field the caller did not set."""
    return v is None or v == "" or v == [] or v == {} or v is False


def _refuse_unless_empty(body: Mapping[str, Any], key: str, why: str) -> None:
    if not _empty(body.get(key)):
        raise unsupported(key, why)


@dataclass(frozen=True)
class Options:
    """An Ollama ``options`` object, checked."""

    fields: dict[str, Any]  # SUBMIT fields
    num_ctx: int | None = None
    ignored: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()


def options_fields(options: Any) -> Options:
    """The SUBMIT fields of an Ollama ``options`` object, and what was not used."""
    if options is None:
        return Options({})
    if not isinstance(options, dict):
        raise bad_request("options must be an object", "options")
    fields: dict[str, Any] = {}
    ignored: list[str] = []
    unknown: list[str] = []
    num_ctx = None
    for key in sorted(options):
        v = options[key]
        name = f"options.{key}"
        if v is None:
            continue
        if key in OPTION_FIELDS:
            fields[OPTION_FIELDS[key]] = _option_value(key, v, name)
        elif key == "num_ctx":
            if not _is_int(v) or v < 1:
                raise bad_request(f"{name} must be an integer >= 1", name)
            num_ctx = v
        elif key in NEUTRAL_OPTIONS:
            neutral = NEUTRAL_OPTIONS[key]
            if not any(v == n and isinstance(v, bool) == isinstance(n, bool) for n in neutral):
                raise unsupported(name, f"{v!r} is not supported by meshd (only {neutral[0]!r}, "
                                  f"which changes nothing, is accepted)")
        elif key in _MIROSTAT_ONLY or key in RUNTIME_OPTIONS:
            ignored.append(key)
        else:
            unknown.append(key)
    return Options(fields, num_ctx, tuple(ignored), tuple(unknown))


def _option_value(key: str, v: Any, name: str) -> Any:
    if key == "num_predict":
        if not _is_int(v):
            raise bad_request(f"{name} must be an integer", name)
        if v < 1:
            raise unsupported(name, f"{v} (until the context is full) is not supported by meshd: "
                              "give the most tokens to generate, >= 1")
        return v
    if key == "stop":
        if isinstance(v, str):
            return [v]
        if not isinstance(v, list):
            raise bad_request(f"{name} must be a list of strings", name)
        return v
    if key in ("top_k", "seed"):
        if not _is_int(v):
            raise bad_request(f"{name} must be an integer", name)
        return v
    if not _is_num(v):
        raise bad_request(f"{name} must be a number", name)
    return v


def _common(body: Any) -> tuple[str, bool, Options]:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model is required: the name of a model the mesh serves "
                          "(GET /api/tags lists them)", "model")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("stream must be true or false", "stream")
    # TODO(issue 30): map format to the structured output of the OpenAI API once it exists
    _refuse_unless_empty(body, "format", STRUCTURED_OUTPUT)
    _refuse_unless_empty(body, "think", "meshd's models do not think apart from their answer")
    _refuse_unless_empty(body, "logprobs", "log probabilities are not supported by meshd")
    _refuse_unless_empty(body, "top_logprobs", "log probabilities are not supported by meshd")
    keep_alive = body.get("keep_alive")
    if keep_alive is not None and not isinstance(keep_alive, str | int | float):
        raise bad_request("keep_alive must be a duration", "keep_alive")  # ignored: models stay
    opts = options_fields(body.get("options"))
    opts.fields["origin"] = "http"
    for key in EXTENSIONS:
        if body.get(key) is not None:
            opts.fields[key] = body[key]
    return model, stream is not False, opts


def _call(kind: str, model: str, stream: bool, opts: Options, *, load_only: bool = False
          ) -> OllamaCall:
    return OllamaCall(kind, model, opts.fields, stream, opts.num_ctx, load_only, opts.ignored,
                      opts.unknown)


def chat_call(body: Any) -> OllamaCall:
    """``POST /api/chat``: raises ``ApiError`` (400) naming the first bad field."""
    model, stream, opts = _common(body)
    # TODO(issue 30): tools and tool calls, once the OpenAI API has them
    _refuse_unless_empty(body, "tools", NO_TOOLS)
    raw = body.get("messages")
    if raw is None or raw == []:
        return _call("chat", model, stream, opts, load_only=True)
    opts.fields["messages"] = messages(raw)
    return _call("chat", model, stream, opts)


def messages(raw: Any) -> list[dict[str, str]]:
    """Ollama's chat messages as SUBMIT messages (role and text content)."""
    if not isinstance(raw, list):
        raise bad_request("messages must be a list of messages", "messages")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"{where} must be an object with role and content", where)
        if not _empty(m.get("images")):
            raise unsupported(f"{where}.images", "images are not supported: meshd's models read "
                              "text only")
        for key in ("tool_calls", "tool_name"):
            if not _empty(m.get(key)):
                raise unsupported(f"{where}.{key}", NO_TOOLS)
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise bad_request(f"{where}.role is required", f"{where}.role")
        content = m.get("content")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise bad_request(f"{where}.content must be a string", f"{where}.content")
        out.append({"role": role, "content": content})  # "thinking" of an earlier answer: dropped
    return out


def generate_call(body: Any) -> OllamaCall:
    """``POST /api/generate``. Without ``raw`` the prompt is rendered with the model's chat
    template as one user message (after ``system`` when given), as Ollama renders it; with
    ``raw: true`` it goes to the model as it is."""
    model, stream, opts = _common(body)
    _refuse_unless_empty(body, "images", "images are not supported: meshd's models read text only")
    _refuse_unless_empty(body, "suffix", "fill-in-the-middle (suffix) is not supported by meshd")
    _refuse_unless_empty(body, "template", "meshd renders prompts with the model's own chat "
                         "template; send raw: true with a prompt you rendered yourself instead")
    _refuse_unless_empty(body, "context", "meshd does not continue from a token context: send "
                         "the conversation to /api/chat instead")
    for key in ("width", "height", "steps"):
        _refuse_unless_empty(body, key, "image generation is not supported by meshd")
    raw = body.get("raw")
    if raw is not None and not isinstance(raw, bool):
        raise bad_request("raw must be true or false", "raw")
    prompt = body.get("prompt")
    system = body.get("system")
    for key, v in (("prompt", prompt), ("system", system)):
        if v is not None and not isinstance(v, str):
            raise bad_request(f"{key} must be a string", key)
    fields = opts.fields
    if not prompt:
        return _call("generate", model, stream, opts, load_only=True)
    if raw:
        if system:
            raise bad_request("system needs the model's template, which raw: true leaves out",
                              "system")
        fields["prompt"] = prompt
    elif system:
        fields["messages"] = [{"role": "system", "content": system},
                              {"role": "user", "content": prompt}]
    else:  # one user message: the text travels, so any node serving the model can render it
        fields["prompt"] = prompt
        fields["chat"] = True
    return _call("generate", model, stream, opts)


def check_num_ctx(num_ctx: int | None, model: str, context: int | None) -> None:
    """``options.num_ctx`` may not ask for more context than the model has (meshd does not
    change a model's context: a smaller one is accepted, and the prompt plus num_predict are
    checked against the model's own)."""
    if num_ctx is not None and context and num_ctx > context:
        raise unsupported("options.num_ctx", f"{num_ctx} is more than model {model}'s context "
                          f"of {context} tokens")


def resolve_model(name: str, served: Any) -> str:
    """The mesh's name for a model an Ollama client names: ``NAME:latest`` (Ollama's default
    tag, which clients add) is ``NAME`` when the mesh serves ``NAME`` and not the tagged name."""
    if name in served:
        return name
    base, sep, tag = name.rpartition(":")
    if sep and tag == "latest" and base in served:
        return base
    return name


def embed_input(body: Any) -> tuple[str, list[str]]:
    """``POST /api/embed``: (model, texts). ``truncate: false`` and ``dimensions`` are refused:
    meshd's embedding model truncates every input to its own limit, and its vectors have the
    model's own size."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model is required: the name of this node's embedding model", "model")
    texts = body.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if (not isinstance(texts, list) or not texts or len(texts) > 2048
            or not all(isinstance(t, str) and t for t in texts)):
        raise bad_request("input must be a non-empty string or a list of 1 to 2,048 of them",
                          "input")
    if body.get("truncate") is False:
        raise unsupported("truncate", "false is not supported: meshd's embedding model truncates "
                          "every input to its own limit (256 tokens)")
    if body.get("dimensions") is not None:
        raise unsupported("dimensions", "not supported: vectors have the model's own size")
    return model, texts


def embeddings_input(body: Any) -> tuple[str, str]:
    """``POST /api/embeddings`` (Ollama's older endpoint): (model, prompt)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    model, prompt = body.get("model"), body.get("prompt")
    if not isinstance(model, str) or not model:
        raise bad_request("model is required: the name of this node's embedding model", "model")
    if not isinstance(prompt, str) or not prompt:
        raise bad_request("prompt must be a non-empty string", "prompt")
    return model, prompt


def show_name(body: Any) -> str:
    """``POST /api/show``: the model named (``model``, or ``name`` as older clients send)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request("model is required", "model")
    return name


def embed_model_matches(asked: str, model: str) -> bool:
    return resolve_model(asked, {model}) == model

