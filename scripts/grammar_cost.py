"""What one token costs under a schema's grammar in llama.cpp's own grammar engine.

    .venv/bin/python scripts/grammar_cost.py [--model PATH.gguf] [--timeout 60] [--cases NAME...]

For each case (a JSON schema and an answer that fits it) the schema goes through llama-cpp-python's
converter as written (not through router.structured.grammars, so refused schemas are measured too), the GBNF
is parsed by llama.cpp over the model's vocabulary (`vocab_only`), and the answer's tokens are fed
one by one as the engine feeds them: a one-token check (`llama_sampler_apply` on the sampled token,
the common path) and `llama_sampler_accept`. Printed per case: the grammar's size, the time to
parse it, the largest and mean time per token, and the time of one 256-candidate check (the path
taken when the sampled token is refused). Each case runs in a child process killed after
--timeout seconds, since a single C call cannot be interrupted: "timeout" is itself the finding.

These are the figures behind router.structured.grammar_bound's limits (docs: security, structured output).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing as mp
import time
from pathlib import Path
from typing import Any


def _string(pattern: str) -> dict[str, Any]:
    return {"type": "object", "required": ["x"], "properties": {"x": {"type": "string", "pattern": pattern}}}


def _nested_arrays(levels: int, items: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "string", "minLength": 8, "maxLength": 64}
    for _ in range(levels):
        node = {"type": "array", "items": node, "minItems": items, "maxItems": 64}
    return {"type": "object", "required": ["x"], "properties": {"x": node}}


def _nested_answer(levels: int, items: int) -> str:
    inner: str = '"abcdefgh"'
    for _ in range(levels):
        inner = "[" + ",".join([inner] * items) + "]"
    return '{"x":' + inner + "}"


def _anyof_chain(depth: int) -> dict[str, Any]:
    # each level's two branches begin alike ({"p": <next level>) and so stay alive together
    defs: dict[str, Any] = {f"d{depth}": {"type": "string"}}
    for i in range(depth - 1, -1, -1):
        nxt = {"$ref": f"#/$defs/d{i + 1}"}
        defs[f"d{i}"] = {
            "anyOf": [
                {"type": "object", "properties": {"p": nxt}, "required": ["p"], "additionalProperties": False},
                {
                    "type": "object",
                    "properties": {"p": nxt, "q": {"type": "integer"}},
                    "required": ["p", "q"],
                    "additionalProperties": False,
                },
            ]
        }
    return {**defs.pop("d0"), "$defs": defs}


def _alike_recursive() -> dict[str, Any]:
    # two object types with the same first property, each holding a list of either: alive together
    union = {"anyOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}]}
    kids = {"type": "array", "items": union}
    return {
        "type": "object",
        "properties": {"item": union},
        "required": ["item"],
        "$defs": {
            "A": {
                "type": "object",
                "properties": {"children": kids, "x": {"type": "integer"}},
                "required": ["children", "x"],
            },
            "B": {
                "type": "object",
                "properties": {"children": kids, "y": {"type": "string"}},
                "required": ["children", "y"],
            },
        },
    }


A40 = '{"x":"' + "a" * 40
CASES: dict[str, tuple[dict[str, Any], str]] = {
    "plain-string": ({"type": "object", "properties": {"x": {"type": "string"}}}, '{"x":"' + "hello world " * 4),
    "date": (_string("^[0-9]{4}-[0-9]{2}-[0-9]{2}$"), '{"x":"2024-01-31"}'),
    "a{0,64}": (_string("^a{0,64}$"), A40),
    "(a?){12}": (_string("^a(a?){12}$"), A40),
    "(a?){64}": (_string("^a(a?){64}$"), A40),
    "((a?){8}){8}": (_string("^a((a?){8}){8}$"), A40),
    "(a?){4}": (_string("^a(a?){4}$"), A40),
    "(a?){8}": (_string("^a(a?){8}$"), A40),
    "(a?){16}": (_string("^a(a?){16}$"), A40),
    "(a?){32}": (_string("^a(a?){32}$"), A40),
    "((a?){4}){4}": (_string("^a((a?){4}){4}$"), A40),
    "(a?){8}x8-seq": (_string("^" + "(a?){8}b" * 8 + "$"), A40),
    "([a-z]{1,8}){1,8}": (_string("^([a-z]{1,8}){1,8}$"), A40),
    "([a-z]{1,16}){1,32}": (_string("^([a-z]{1,16}){1,32}$"), A40),
    "((a|ab|abc|abcd){1,16}){1,16}": (_string("^((a|ab|abc|abcd){1,16}){1,16}$"), '{"x":"' + "abcd" * 10),
    "([a-z]|[a-z][a-z]){1,64}x8": (_string("^(([a-z]|[a-z][a-z]){1,64}){1,8}$"), A40),
    "enum500": (
        {"type": "object", "properties": {"x": {"enum": [f"v{i:03d}{chr(97 + i % 26)}" for i in range(500)]}}},
        '{"x":"v123t"}',
    ),
    "anyOf64-objects": (
        {
            "type": "object",
            "properties": {
                "x": {
                    "anyOf": [
                        {"type": "object", "properties": {f"k{i}": {"type": "string"}, "v": {"type": "integer"}}}
                        for i in range(64)
                    ]
                }
            },
        },
        '{"x":{"k7":"hello","v":12}}',
    ),
    "object-100-optional": (
        {"type": "object", "properties": {f"key{i}": {"type": "integer"} for i in range(100)}},
        "{" + ",".join(f'"key{i}":{i}' for i in range(0, 100, 9)) + "}",
    ),
    "object-100-optional-strings": (
        {"type": "object", "properties": {f"key{i}": {"type": "string"} for i in range(100)}},
        "{" + ",".join(f'"key{i}":"x{i}"' for i in range(0, 100, 9)) + "}",
    ),
    "anyOf64-patterns-P256": (
        {
            "type": "object",
            "required": ["x"],
            "properties": {
                "x": {
                    "anyOf": [
                        {"type": "string", "pattern": "^([a-z]{1,16}){1,16}" + chr(97 + i % 26) + "$"}
                        for i in range(64)
                    ]
                }
            },
        },
        A40,
    ),
    "((a?){12}){12}": (_string("^a((a?){12}){12}$"), A40),
    "((a?){24}){24}": (_string("^a((a?){24}){24}$"), A40),
    "(((a?){6}){6}){6}": (_string("^a(((a?){6}){6}){6}$"), A40),
    "(((a?){8}){8}){8}": (_string("^a(((a?){8}){8}){8}$"), A40),
    "(((a?){12}){12}){12}": (_string("^a(((a?){12}){12}){12}$"), A40),
    "(((a?){16}){16}){16}": (_string("^a(((a?){16}){16}){16}$"), A40),
    "((a|){12}){12}": (_string("^a((a|){12}){12}$"), A40),
    "((a|aa){16}){16}": (_string("^((a|aa){16}){16}$"), A40),
    "(([a-z]{1,16}){1,16})": (_string("^([a-z]{1,16}){1,16}$"), A40),
    "(([a-z]{1,32}){1,32})": (_string("^([a-z]{1,32}){1,32}$"), A40),
    "(([a-z]{1,64}){1,64})": (_string("^([a-z]{1,64}){1,64}$"), A40),
    "(a?)*": (_string("^a(a?)*$"), A40),
    "((a?)*){16}": (_string("^a((a?)*){16}$"), A40),
    "((a?)*){64}": (_string("^a((a?)*){64}$"), A40),
    "((a*){12}){12}": (_string("^a((a*){12}){12}$"), A40),
    "((a+){12}){12}": (_string("^a((a+){12}){12}$"), A40),
    "(([a-z]{64}){64}){64}": (_string("^(([a-z]{64}){64}){64}$"), A40),
    "domain{1,64}x{0,63}": (_string(r"^[a-z]{1,64}(\.[a-z]{1,64}){0,63}$"), '{"x":"' + "abcdefgh." * 5),
    "minLength64": (
        {"type": "object", "properties": {"x": {"type": "string", "minLength": 64, "maxLength": 64}}},
        '{"x":"' + "ab" * 30,
    ),
    "arrays3x(min8,max64)": (_nested_arrays(3, 8), _nested_answer(3, 8)[:200]),
    "arrays5x(min4,max64)": (_nested_arrays(5, 4), _nested_answer(5, 4)[:200]),
    "alike-recursive-depth-14": (_alike_recursive(), '{"item":' + '{"children":[' * 14),
    "anyOf-chain-8": (_anyof_chain(8), '{"p":' * 8 + '"s"'),
    "anyOf-chain-12": (_anyof_chain(12), '{"p":' * 12 + '"s"'),
    "anyOf-chain-16": (_anyof_chain(16), '{"p":' * 16 + '"s"'),
}


def _prefixed_enum(count: int, prefix: int) -> tuple[dict[str, Any], str]:
    """`count` values that share their first `prefix` characters: every value stays alive until
    they part, where random values part at their first character."""
    stem = "abcdefghijklmnopqrstuvwxyz0123456789"[:prefix] if prefix <= 36 else "q" * prefix
    values = [f"{stem}{i:04d}" for i in range(count)]
    return {"type": "object", "properties": {"x": {"enum": values}}}, '{"x":"' + values[count // 2] + '"}'


for _count in (32, 64, 128, 256, 850):
    for _prefix in (4, 12, 30):
        CASES[f"enum{_count}-prefix{_prefix}"] = _prefixed_enum(_count, _prefix)


_QUIET: Any = None


def _measure(model: str, schema: dict[str, Any], answer: str, out: Any) -> None:
    import llama_cpp as lc
    import numpy as np
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    global _QUIET
    _QUIET = lc.llama_log_callback(lambda *a: None)  # kept referenced: llama.cpp calls it later
    lc.llama_log_set(_QUIET, ctypes.c_void_p(0))
    params = lc.llama_model_default_params()
    params.vocab_only = True
    mdl = lc.llama_model_load_from_file(model.encode(), params)
    vocab = lc.llama_model_get_vocab(mdl)
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    gbnf = json_schema_to_gbnf(json.dumps(schema))
    out.put(("gbnf", len(gbnf)))
    t0 = time.perf_counter()
    grammar = lc.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    out.put(("parse", time.perf_counter() - t0))
    if not grammar:
        out.put(("refused", 0))
        return
    data = answer.encode()
    buf = (lc.llama_token * (len(data) + 8))()
    n = lc.llama_tokenize(vocab, data, len(data), buf, len(buf), False, False)
    cand = (lc.llama_token_data * n_vocab)()
    view = np.ctypeslib.as_array(cand)

    def check(ids: Any) -> float:
        k = len(ids)
        view["id"][:k] = ids
        view["logit"][:k] = 0.0
        arr = lc.llama_token_data_array(
            data=ctypes.cast(cand, ctypes.POINTER(lc.llama_token_data)), size=k, selected=-1, sorted=False
        )
        t = time.perf_counter()
        lc.llama_sampler_apply(grammar, ctypes.byref(arr))
        return time.perf_counter() - t

    for i, token in enumerate(buf[:n]):
        spent = check([token])
        if not np.isfinite(view["logit"][0]):
            break  # the answer left the grammar: accepting the token would abort the process
        t = time.perf_counter()
        lc.llama_sampler_accept(grammar, token)
        spent += time.perf_counter() - t
        out.put(("token", spent))
        if i in (n // 2,):
            out.put(("check256", check(list(range(256)))))
            out.put(("checkall", check(list(range(n_vocab)))))
    out.put(("done", 0))


def run_case(model: str, name: str, timeout: float) -> str:
    schema, answer = CASES[name]
    q: Any = mp.get_context("fork").Queue()
    proc = mp.get_context("fork").Process(target=_measure, args=(model, schema, answer, q), daemon=True)
    began = time.monotonic()
    proc.start()
    seen: dict[str, Any] = {"token": []}
    status = "timeout"
    while time.monotonic() - began < timeout:
        try:
            kind, value = q.get(timeout=0.2)
        except Exception:  # noqa: BLE001 - queue.Empty: check the clock and the child
            if not proc.is_alive() and q.empty():
                status = status if status != "timeout" else "died"
                break
            continue
        if kind == "token":
            seen["token"].append(value)
        else:
            seen[kind] = value
        if kind in ("done", "refused"):
            status = kind
            break
    proc.kill()
    proc.join()
    toks = seen["token"]
    per = (
        f"max {max(toks) * 1e3:9.2f} ms mean {sum(toks) / len(toks) * 1e3:8.3f} ms over {len(toks):3d}" if toks else ""
    )
    c256 = f"check256 {seen['check256'] * 1e3:8.2f} ms" if "check256" in seen else ""
    if "checkall" in seen:
        c256 += f" vocab {seen['checkall'] * 1e3:8.1f} ms"
    parse = f"parse {seen['parse'] * 1e3:8.1f} ms" if "parse" in seen else ""
    return f"{name:24s} gbnf {seen.get('gbnf', 0):6d}  {parse:16s} {per:45s} {c256:20s} {status}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path.home() / ".cache" / "tierroute" / "models" / "smollm2-135m-instruct-q4_1.gguf"
    parser.add_argument("--model", default=str(default))
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    args = parser.parse_args()
    for name in args.cases:
        print(run_case(args.model, name, args.timeout), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
