"""Triton's ``config.pbtxt`` (the ``ModelConfig`` protobuf in text form), read into tensorgate's configuration.

A repository made for Triton is served as it is: where a model directory has no ``config.yaml``,
its ``config.pbtxt`` is read and each key mapped onto the same setting here (``max_batch_size``,
``input``/``output`` with ``dims``, ``dynamic_batching`` and its queue policy, ``instance_group``,
``version_policy``, ``model_warmup``, ``parameters``, ``response_cache``, ``ensemble_scheduling``
as a pipeline). A key this server does not apply is refused with its path named, every one of them
at once, never ignored: a model that silently lost a setting would serve differently than its
owner expects.

The text format is read by a small parser of its own (tokens, nested messages, lists), which keeps
what it reads as plain lists per field; the mapping below knows which fields repeat.
"""

from __future__ import annotations

import re
from typing import Any

from tensorgate.errors import ConfigError

Message = dict[str, list[Any]]

_TOKEN = re.compile(
    r"""\s+|\#[^\n]*
    |(?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
    |(?P<number>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)[fF]?)
    |(?P<word>[-+]?[A-Za-z_][A-Za-z0-9_.]*)
    |(?P<punct>[{}\[\]<>:,;])""",
    re.VERBOSE,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v", "\\": "\\", "'": "'", '"': '"'}
_OCTAL = re.compile(r"[0-7]{1,3}")
_HEX = re.compile(r"[0-9A-Fa-f]{1,2}")


def parse_text_proto(text: str) -> Message:
    """A text-format protobuf message as ``{field: [values]}``; nested messages the same way."""
    tokens = _tokens(text)
    reader = _Reader(tokens)
    message = reader.message(end=None)
    return message


def _tokens(text: str) -> list[tuple[str, Any, int]]:
    out: list[tuple[str, Any, int]] = []
    position = 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            line = text.count("\n", 0, position) + 1
            raise ValueError(f"line {line}: unexpected {text[position : position + 20]!r}")
        position = match.end()
        kind = match.lastgroup
        if kind is None:  # whitespace or a comment
            continue
        line = text.count("\n", 0, match.start()) + 1
        value = match.group(kind)
        if kind == "string":
            value = _unquote(value[1:-1])
        out.append((kind, value, line))
    return out


def _unquote(body: str) -> str:
    """A text-format string's escapes (C's), as bytes read as UTF-8."""
    raw = bytearray()
    index = 0
    while index < len(body):
        char = body[index]
        if char != "\\":
            raw += char.encode()
            index += 1
            continue
        following = body[index + 1]
        if following in _ESCAPES:
            raw += _ESCAPES[following].encode()
            index += 2
        elif following in "xX" and (hexa := _HEX.match(body, index + 2)):
            raw.append(int(hexa.group(), 16))
            index = hexa.end()
        elif octal := _OCTAL.match(body, index + 1):
            raw.append(int(octal.group(), 8) & 0xFF)
            index = octal.end()
        else:
            raise ValueError(f"unknown escape \\{following} in a string")
    return raw.decode("utf-8", errors="replace")


class _Reader:
    def __init__(self, tokens: list[tuple[str, Any, int]]) -> None:
        self._tokens = tokens
        self._at = 0

    def _peek(self) -> tuple[str, Any, int] | None:
        return self._tokens[self._at] if self._at < len(self._tokens) else None

    def _take(self) -> tuple[str, Any, int]:
        token = self._peek()
        if token is None:
            raise ValueError("unexpected end of the file")
        self._at += 1
        return token

    def _is(self, value: str) -> bool:
        token = self._peek()
        return token is not None and token[0] == "punct" and token[1] == value

    def message(self, end: str | None) -> Message:
        fields: Message = {}
        while True:
            token = self._peek()
            if token is None:
                if end is not None:
                    raise ValueError(f"a message is not closed with '{end}'")
                return fields
            if end is not None and self._is(end):
                self._at += 1
                return fields
            kind, name, line = self._take()
            if kind != "word":
                raise ValueError(f"line {line}: expected a field name, found {name!r}")
            colon = self._is(":")
            if colon:
                self._at += 1
            values = self._values(line)
            fields.setdefault(name, []).extend(values)
            if self._is(",") or self._is(";"):
                self._at += 1

    def _values(self, line: int) -> list[Any]:
        if self._is("["):
            self._at += 1
            values: list[Any] = []
            while not self._is("]"):
                values.append(self._value(line))
                if self._is(","):
                    self._at += 1
            self._at += 1
            return values
        return [self._value(line)]

    def _value(self, line: int) -> Any:
        if self._is("{"):
            self._at += 1
            return self.message("}")
        if self._is("<"):
            self._at += 1
            return self.message(">")
        kind, value, at = self._take()
        if kind == "string":
            while self._peek() is not None and self._peek()[0] == "string":  # type: ignore[index]
                value += self._take()[1]  # adjacent strings concatenate, as in C
            return value
        if kind == "number":
            text = value.rstrip("fF")
            return float(text) if any(c in text for c in ".eE") else int(text)
        if kind == "word":
            lowered = value.lower()
            if lowered in ("true", "t"):
                return True
            if lowered in ("false", "f"):
                return False
            if lowered in ("inf", "infinity", "-inf", "-infinity", "nan"):
                return float(lowered.replace("infinity", "inf"))
            return value  # an enum's name
        raise ValueError(f"line {at}: expected a value, found {value!r}")


# -- Triton's ModelConfig -> tensorgate's configuration -------------------------------------------

# Triton's platforms and backends -> tensorgate's backends.
_BACKENDS = {
    "onnxruntime_onnx": "onnxruntime",
    "onnxruntime": "onnxruntime",
    "python": "python",
    "pytorch_libtorch": "torch",
    "pytorch": "torch",
    "ensemble": "pipeline",
}
_KINDS = {"KIND_CPU": "cpu", "KIND_GPU": "gpu", "KIND_AUTO": "cpu"}


class _Mapping:
    """Reads a parsed ``ModelConfig`` field by field, remembering every key it did not apply."""

    def __init__(self) -> None:
        self.unapplied: list[str] = []
        self.problems: list[str] = []

    def one(self, message: Message, key: str, where: str) -> Any:
        values = message.get(key, [])
        if len(values) > 1:
            self.problems.append(f"{where}{key} is given {len(values)} times")
        return values[-1] if values else None

    def rest(self, message: Message, used: set[str], where: str) -> None:
        for key in message:
            if key not in used:
                self.unapplied.append(f"{where}{key}")

    def refuse(self, path: str) -> None:
        self.unapplied.append(path)


def triton_config(text: str, source: str) -> dict[str, Any]:
    """``config.pbtxt``'s text as a ``config.yaml`` document (validated by the caller as a
    ModelConfig). Raises ConfigError naming every key that is not applied, or what is malformed."""
    try:
        message = parse_text_proto(text)
    except ValueError as exc:
        raise ConfigError(f"{source}: not a text-format model configuration: {exc}") from None
    mapping = _Mapping()
    document = _model(message, mapping)
    if mapping.unapplied:
        keys = ", ".join(mapping.unapplied)
        raise ConfigError(
            f"{source}: tensorgate does not apply {keys}; remove {'them' if len(mapping.unapplied) > 1 else 'it'} "
            "or write a config.yaml (docs/coming-from-triton.md says what maps to what)"
        )
    if mapping.problems:
        raise ConfigError(f"{source}: {'; '.join(mapping.problems)}")
    return document


def _model(message: Message, m: _Mapping) -> dict[str, Any]:
    used = {"name", "platform", "backend", "max_batch_size", "input", "output", "dynamic_batching"}
    used |= {"instance_group", "version_policy", "model_warmup", "parameters", "response_cache"}
    used |= {"ensemble_scheduling", "default_model_filename", "sequence_batching"}
    document: dict[str, Any] = {}
    name = m.one(message, "name", "")
    if name is not None:
        document["name"] = name
    platform, backend = m.one(message, "platform", ""), m.one(message, "backend", "")
    chosen = backend or platform
    if chosen:
        if chosen not in _BACKENDS:
            m.problems.append(f"{'backend' if backend else 'platform'} {chosen!r} is not one tensorgate serves")
        else:
            document["backend"] = _BACKENDS[chosen]
    filename = m.one(message, "default_model_filename", "")
    if filename is not None and filename not in ("model.onnx", "model.py", "model.pt", "model.pt2"):
        m.refuse("default_model_filename (tensorgate reads model.onnx, model.py, model.pt or model.pt2)")
    max_batch = int(m.one(message, "max_batch_size", "") or 0)
    document["max_batch_size"] = max_batch
    batch = [-1] if max_batch > 0 else []
    for key, target in (("input", "inputs"), ("output", "outputs")):
        tensors = message.get(key, [])
        if tensors:
            document[target] = [_tensor(t, batch, f"{key}[{i}].", m) for i, t in enumerate(tensors)]
    batching = m.one(message, "dynamic_batching", "")
    if batching is not None:
        document["dynamic_batching"] = _dynamic_batching(batching, m)
    sequencing = m.one(message, "sequence_batching", "")
    if sequencing is not None:
        document["sequence_batching"] = _sequence_batching(sequencing, m)
    groups = message.get("instance_group", [])
    if groups:
        document["instance_group"] = [_instance_group(g, f"instance_group[{i}].", m) for i, g in enumerate(groups)]
    policy = m.one(message, "version_policy", "")
    if policy is not None:
        document["version_policy"] = _version_policy(policy, m)
    warmups = message.get("model_warmup", [])
    if warmups:
        document["warmup"] = [_warmup(w, f"model_warmup[{i}].", m) for i, w in enumerate(warmups)]
    parameters = message.get("parameters", [])
    if parameters:
        document["parameters"] = _parameters(parameters, m)
    cache = m.one(message, "response_cache", "")
    if cache is not None:
        m.rest(cache, {"enable"}, "response_cache.")
        document["response_cache"] = {"enable": bool(m.one(cache, "enable", "response_cache."))}
    ensemble = m.one(message, "ensemble_scheduling", "")
    if ensemble is not None:
        document["steps"] = _ensemble(ensemble, m)
    m.rest(message, used, "")
    return document


def _datatype(value: Any, where: str, m: _Mapping) -> str:
    if not isinstance(value, str) or not value.startswith("TYPE_"):
        m.problems.append(f"{where}data_type {value!r} is not a Triton datatype")
        return "FP32"
    return "BYTES" if value == "TYPE_STRING" else value.removeprefix("TYPE_")


def _tensor(message: Message, batch: list[int], where: str, m: _Mapping) -> dict[str, Any]:
    m.rest(message, {"name", "data_type", "dims", "format"}, where)
    fmt = m.one(message, "format", where)
    if fmt not in (None, "FORMAT_NONE"):
        m.refuse(f"{where}format")
    return {
        "name": m.one(message, "name", where),
        "datatype": _datatype(m.one(message, "data_type", where), where, m),
        "shape": batch + [int(d) for d in message.get("dims", [])],
    }


def _sequence_batching(message: Message, m: _Mapping) -> dict[str, Any]:
    where = "sequence_batching."
    used = {"direct", "oldest", "max_sequence_idle_microseconds", "control_input", "state", "iterative_sequence"}
    m.rest(message, used, where)
    out: dict[str, Any] = {}
    idle = m.one(message, "max_sequence_idle_microseconds", where)
    if idle is not None:
        out["max_sequence_idle_microseconds"] = int(idle)
    if m.one(message, "iterative_sequence", where):
        m.refuse(f"{where}iterative_sequence (a sequence's requests come from its client here)")
    for strategy, keys in (
        ("direct", {"max_queue_delay_microseconds", "minimum_slot_utilization"}),
        (
            "oldest",
            {"max_candidate_sequences", "preferred_batch_size", "max_queue_delay_microseconds", "preserve_ordering"},
        ),
    ):
        given = m.one(message, strategy, where)
        if given is None:
            continue
        w = f"{where}{strategy}."
        m.rest(given, keys, w)
        settings: dict[str, Any] = {}
        for key in keys - {"preferred_batch_size"}:
            value = m.one(given, key, w)
            if value is not None:
                settings[key] = value
        if strategy == "oldest" and given.get("preferred_batch_size"):
            settings["preferred_batch_size"] = [int(v) for v in given["preferred_batch_size"]]
        out[strategy] = settings
    controls = []
    for i, control_input in enumerate(message.get("control_input", [])):
        w = f"{where}control_input[{i}]."
        m.rest(control_input, {"name", "control"}, w)
        kinds = []
        for j, control in enumerate(control_input.get("control", [])):
            cw = f"{w}control[{j}]."
            keys = {"kind", "int32_false_true", "fp32_false_true", "bool_false_true", "data_type"}
            m.rest(control, keys, cw)
            entry: dict[str, Any] = {"kind": m.one(control, "kind", cw)}
            for key in ("int32_false_true", "fp32_false_true", "bool_false_true"):
                if control.get(key):
                    entry[key] = list(control[key])
            data_type = m.one(control, "data_type", cw)
            if data_type is not None:
                entry["data_type"] = data_type
            kinds.append(entry)
        controls.append({"name": m.one(control_input, "name", w), "control": kinds})
    if controls:
        out["control_input"] = controls
    states = []
    for i, state in enumerate(message.get("state", [])):
        w = f"{where}state[{i}]."
        m.rest(state, {"input_name", "output_name", "data_type", "dims", "initial_state"}, w)
        entry = {
            "input_name": m.one(state, "input_name", w),
            "output_name": m.one(state, "output_name", w),
            "data_type": m.one(state, "data_type", w),
            "dims": [int(d) for d in state.get("dims", [])],
        }
        initial = []
        for j, start in enumerate(state.get("initial_state", [])):
            iw = f"{w}initial_state[{j}]."
            m.rest(start, {"name", "data_type", "dims", "zero_data", "data_file"}, iw)
            first: dict[str, Any] = {
                "name": m.one(start, "name", iw) or "",
                "data_type": m.one(start, "data_type", iw),
                "dims": [int(d) for d in start.get("dims", [])],
            }
            if m.one(start, "zero_data", iw):
                first["zero_data"] = True
            data_file = m.one(start, "data_file", iw)
            if data_file is not None:
                first["data_file"] = data_file
            initial.append(first)
        if initial:
            entry["initial_state"] = initial
        states.append(entry)
    if states:
        out["state"] = states
    return out


def _dynamic_batching(message: Message, m: _Mapping) -> dict[str, Any]:
    where = "dynamic_batching."
    used = {"preferred_batch_size", "max_queue_delay_microseconds", "priority_levels", "default_priority_level"}
    used |= {"default_queue_policy", "preserve_ordering"}
    m.rest(message, used, where)
    out: dict[str, Any] = {
        # Triton waits no time for company unless told to; so does this configuration.
        "max_queue_delay_ms": int(m.one(message, "max_queue_delay_microseconds", where) or 0) / 1000.0,
        "preferred_batch_sizes": [int(s) for s in message.get("preferred_batch_size", [])],
        "adaptive_delay": False,  # Triton's window, waited out as written
    }
    levels = int(m.one(message, "priority_levels", where) or 0)
    if levels:
        out["priority_levels"] = levels
        default = int(m.one(message, "default_priority_level", where) or 0)
        if default:
            out["default_priority"] = default
    # Answers are per request here, so their order across requests is already each client's own.
    m.one(message, "preserve_ordering", where)
    policy = m.one(message, "default_queue_policy", where)
    if policy is not None:
        w = where + "default_queue_policy."
        m.rest(
            policy, {"timeout_action", "default_timeout_microseconds", "allow_timeout_override", "max_queue_size"}, w
        )
        if m.one(policy, "timeout_action", w) not in (None, "REJECT"):
            m.refuse(f"{w}timeout_action DELAY (a request past its deadline is always answered 504 here)")
        if m.one(policy, "allow_timeout_override", w) is False:
            m.refuse(f"{w}allow_timeout_override false (a request's own timeout always wins here)")
        timeout = int(m.one(policy, "default_timeout_microseconds", w) or 0)
        if timeout:
            out["default_timeout_ms"] = timeout / 1000.0
        size = int(m.one(policy, "max_queue_size", w) or 0)
        if size:  # Triton's 0 is unbounded; every queue here is bounded, by its default when not set
            out["max_queue_size"] = size
    return out


def _instance_group(message: Message, where: str, m: _Mapping) -> dict[str, Any]:
    m.rest(message, {"name", "kind", "count", "gpus"}, where)
    kind = m.one(message, "kind", where) or "KIND_AUTO"
    if kind not in _KINDS:
        m.refuse(f"{where}kind {kind}")
    group: dict[str, Any] = {"count": int(m.one(message, "count", where) or 1), "kind": _KINDS.get(kind, "cpu")}
    gpus = [int(g) for g in message.get("gpus", [])]
    if gpus:
        group["devices"] = gpus
    return group


def _version_policy(message: Message, m: _Mapping) -> dict[str, Any]:
    where = "version_policy."
    m.rest(message, {"latest", "all", "specific"}, where)
    latest = m.one(message, "latest", where)
    if latest is not None:
        return {"latest": int(m.one(latest, "num_versions", where + "latest.") or 1)}
    if m.one(message, "all", where) is not None:
        return {"all": True}
    specific = m.one(message, "specific", where)
    if specific is not None:
        return {"specific": [int(v) for v in specific.get("versions", [])]}
    return {}


def _warmup(message: Message, where: str, m: _Mapping) -> dict[str, Any]:
    """Triton's warm-up sample: zero or random data of the inputs' shapes (a data file is refused:
    tensorgate's file form is a JSON request beside config.yaml)."""
    m.rest(message, {"name", "batch_size", "inputs", "count"}, where)
    kinds = set()
    for index, entry in enumerate(message.get("inputs", [])):
        value = (entry.get("value") or [{}])[0]
        w = f"{where}inputs[{index}]."
        if "input_data_file" in value:
            m.refuse(f"{w}input_data_file")
        kinds.add("random" if "random_data" in value else "zeros")
    return {
        "name": m.one(message, "name", where) or "warmup",
        "inputs": "random" if "random" in kinds else "zeros",
        "batch_size": max(1, int(m.one(message, "batch_size", where) or 1)),
        "count": max(1, int(m.one(message, "count", where) or 1)),
    }


def _parameters(entries: list[Any], m: _Mapping) -> dict[str, str]:
    out: dict[str, str] = {}
    for index, entry in enumerate(entries):
        where = f"parameters[{index}]."
        key = m.one(entry, "key", where)
        value = m.one(entry, "value", where) or {}
        text = m.one(value, "string_value", where + "value.")
        if not isinstance(key, str) or text is None:
            m.problems.append(f"{where[:-1]} needs a key and a value {{ string_value: ... }}")
            continue
        out[key] = str(text)
    return out


def _ensemble(message: Message, m: _Mapping) -> list[dict[str, Any]]:
    """Triton's ensemble steps as a pipeline's: ``input_map`` {model input: ensemble tensor} and
    ``output_map`` {model output: ensemble tensor} are exactly a step's ``inputs`` and ``outputs``."""
    where = "ensemble_scheduling."
    m.rest(message, {"step"}, where)
    steps = []
    for index, step in enumerate(message.get("step", [])):
        w = f"{where}step[{index}]."
        m.rest(step, {"model_name", "model_version", "input_map", "output_map"}, w)
        version = int(m.one(step, "model_version", w) or -1)
        steps.append(
            {
                "model": m.one(step, "model_name", w),
                "version": version if version > 0 else None,
                "inputs": _map(step.get("input_map", []), w + "input_map", m),
                "outputs": _map(step.get("output_map", []), w + "output_map", m),
            }
        )
    return steps


def _map(entries: list[Any], where: str, m: _Mapping) -> dict[str, str]:
    out: dict[str, str] = {}
    for entry in entries:
        key, value = m.one(entry, "key", where + "."), m.one(entry, "value", where + ".")
        if not isinstance(key, str) or not isinstance(value, str):
            m.problems.append(f"{where} entries need a key and a value")
            continue
        out[key] = value
    return out
