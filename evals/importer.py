"""`tierroute eval import`: logged answers from elsewhere become an eval run like any other.

A benchmark says how accurate each tier was on the benchmark. Production traffic, or another
router's logs, say it for the requests that actually arrive, and `eval sweep`, `calibrate` and
`train` need nothing but a run. So an import writes one: each logged answer is stored as the
tier's generation of that item (`evals.store`), and the existing runner (`evals.runner.run_eval`)
does the rest on the stored answers, exactly as after `eval run`: it scores every answer with the
tiers' configured verifiers and the eval's, and grades it. No model generates anything: each
imported tier's backend refuses to (`_Imported`), and a verifier that asks a model for work (a
judge, self-consistency, `cross_tier`, `execution`'s second opinion: `uses_model`) is refused before
anything is written, instead of failing on every answer or abstaining on every one.

The input format (JSON Lines, one object per line) is defined and explained in
docs/eval-import.md; `parse_line` is its reference. How an answer is graded (a reference answer,
per-tier labels, or, with no label, agreement with the top tier as a flagged proxy) is the
imported suite's business (`evals.suites.imported`).

Prices: a tier whose every answer carries `cost_usd` is priced by token prices fitted to those
costs (what a hosted API charges is linear in the tokens; the largest error of the fit is stated
in the tier's price text); otherwise the config's tier of the same name lends its price, as it
lends its verifiers, combine rule and thresholds, so `calibrate --write` retunes that tier.

A ledger's shadow pairs, and the labels of the givers it trusts (admin reviewers by default), become
records in `evals.ledger_import`.

Hostile input: every line is read with a byte limit before it is parsed, every field is checked
for type and size, and an error names the line. The run is built in a temporary directory beside
its destination and renamed into place only when complete: a failed import leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evals.store import GenerationRecord, RunStore, generation_key
from evals.suites.imported import DEFAULT_GRADER, GRADERS, ITEMS_FILE, ImportedSuite
from router.backends.base import Backend
from router.config import OpenAIBackendSettings, PriceSettings, Settings, TierSettings, VerifierSpec
from router.errors import ConfigError, UnavailableError
from router.generation import Delta, Generation, GenerationRequest, Message
from router.plugins import VerifierRegistry
from router.tasks import rule_task
from router.verification import VerifierError, spec_uses_a_model

FORMAT = "tierroute-import/1"

# Limits on what one line may hold: far above real traffic, far below what would exhaust memory.
MAX_LINE_BYTES = 4 * 1024 * 1024
MAX_TEXT_CHARS = 200_000  # one message's content, one answer's text
MAX_MESSAGES = 256
MAX_TIERS = 8
MAX_LOGPROBS = 32_768
MAX_NAME_CHARS = 200  # ids, groups, model names
MAX_TOKENS_COUNT = 10_000_000
MAX_ITEMS = 200_000

_ROLES = {"system", "user", "assistant", "developer"}
_TIER_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
# task names as requests have them (router.tasks) and as suites have them, to the suites' kind
TASK_KINDS = {
    "math": "math",
    "maths": "math",
    "code": "code",
    "choice": "choice",
    "text": "text",
    "open_ended": "text",
    "structured": "structured",
}
_LINE_KEYS = {"id", "messages", "prompt", "task", "group", "answers", "label"}
_ANSWER_KEYS = {
    "text",
    "prompt_tokens",
    "completion_tokens",
    "latency_s",
    "busy_s",
    "logprobs",
    "cost_usd",
    "finish_reason",
    "model",
}
_LABEL_KEYS = {"reference", "grader", "letters", "correct"}


SHADOW_AGREEMENT = "shadow_agreement"  # per-tier labels that are the live agreement rule's verdict
FEEDBACK = "feedback"  # per-tier labels from the trusted labels posted to the service (evals.ledger_import)


def _uses_a_model(registry: VerifierRegistry, spec: VerifierSpec, tier: str) -> bool:
    try:
        return spec_uses_a_model(registry, spec.name, spec.params)
    except VerifierError as exc:
        raise ConfigError(f"verifier '{spec.name}' on tier {tier}: {exc}") from None


class ImportFormatError(ConfigError):
    """A line of an import file is not in the import format (the message names the line)."""


@dataclass(frozen=True)
class Answer:
    text: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float = 0.0
    busy_s: float | None = None  # compute time, where the source measured it (else latency prices a time-priced tier)
    logprobs: tuple[float, ...] | None = None
    cost_usd: float | None = None
    finish_reason: str = "stop"
    model: str = ""


@dataclass(frozen=True)
class Record:
    """One imported line: the request, each tier's answer, and how answers to it are graded."""

    line: int
    id: str
    messages: tuple[Message, ...]
    task: str  # the suites' kind: math, code, choice, text, structured
    group: str
    answers: Mapping[str, Answer]
    key: dict[str, Any] | None  # the grader's part of the label; None: graded by agreement


def _top_by_proxy(record: Record) -> bool:
    return bool(record.key and record.key.get("top_by_proxy"))


def graded_by(record: Record) -> str:
    """How the record's answers are graded: reference, per_tier, shadow_agreement or agreement."""
    if record.key is None:
        return "agreement"
    return str(record.key.get("source", record.key["kind"]))


# ---- reading ------------------------------------------------------------------------------------------


def read_file(path: Path) -> list[Record]:
    """Every record of an import file, or an `ImportFormatError` naming the first bad line."""
    records: list[Record] = []
    seen: dict[str, int] = {}
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    with f:
        n = 0
        while True:
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                break
            n += 1
            if len(raw) > MAX_LINE_BYTES:
                raise ImportFormatError(f"{path} line {n}: longer than {MAX_LINE_BYTES} bytes")
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ImportFormatError(f"{path} line {n}: not UTF-8") from None
            rec = parse_line(text, n, where=str(path))
            if rec.id in seen:
                raise ImportFormatError(f"{path} line {n}: id {rec.id!r} already used on line {seen[rec.id]}")
            seen[rec.id] = n
            records.append(rec)
            if len(records) > MAX_ITEMS:
                raise ImportFormatError(f"{path}: more than {MAX_ITEMS} items; split the file")
    if not records:
        raise ImportFormatError(f"{path}: no items")
    return records


def parse_line(text: str, n: int, *, where: str = "input") -> Record:
    """One line of the import format as a `Record` (docs/eval-import.md)."""

    def fail(why: str) -> ImportFormatError:
        return ImportFormatError(f"{where} line {n}: {why}")

    try:
        obj = json.loads(text, parse_constant=_no_constant)
    except (json.JSONDecodeError, ValueError) as exc:
        raise fail(f"not JSON ({exc})") from None
    except RecursionError:
        raise fail("nested too deeply") from None
    if not isinstance(obj, dict):
        raise fail("expected a JSON object")
    unknown = sorted(set(obj) - _LINE_KEYS)
    if unknown:
        raise fail(f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(_LINE_KEYS))}")
    item_id = obj.get("id", f"line{n}")
    if isinstance(item_id, bool) or not isinstance(item_id, str | int) or not 0 < len(str(item_id)) <= MAX_NAME_CHARS:
        raise fail(f"id must be a string or integer of 1 to {MAX_NAME_CHARS} characters")
    messages = _messages(obj, fail)
    task = obj.get("task")
    if task is None:
        ruled = rule_task(GenerationRequest(messages=messages))
        kind = TASK_KINDS[ruled.task] if ruled is not None else "text"
    elif task in TASK_KINDS:
        kind = TASK_KINDS[task]
    else:
        raise fail(f"task must be one of {', '.join(TASK_KINDS)} (got {task!r})")
    group = obj.get("group", "")
    if not isinstance(group, str) or len(group) > MAX_NAME_CHARS:
        raise fail(f"group must be a string of at most {MAX_NAME_CHARS} characters")
    answers = _answers(obj.get("answers"), fail)
    key = _label(obj.get("label"), kind, answers, fail)
    return Record(n, str(item_id), messages, kind, group, answers, key)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _messages(obj: dict[str, Any], fail: Any) -> tuple[Message, ...]:
    if ("messages" in obj) == ("prompt" in obj):
        raise fail("needs exactly one of 'messages' and 'prompt'")
    if "prompt" in obj:
        prompt = obj["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise fail("prompt must be a non-empty string")
        if len(prompt) > MAX_TEXT_CHARS:
            raise fail(f"prompt is longer than {MAX_TEXT_CHARS} characters")
        return (Message("user", prompt),)
    raw = obj["messages"]
    if not isinstance(raw, list) or not 0 < len(raw) <= MAX_MESSAGES:
        raise fail(f"messages must be a list of 1 to {MAX_MESSAGES} messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str):
            raise fail(f"messages[{i}] needs a role ({', '.join(sorted(_ROLES))}) and a string content")
        if len(m["content"]) > MAX_TEXT_CHARS:
            raise fail(f"messages[{i}].content is longer than {MAX_TEXT_CHARS} characters")
        out.append(Message(m["role"], m["content"]))
    return tuple(out)


def _count(a: dict[str, Any], name: str, fail: Any, where: str) -> int:
    v = a.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TOKENS_COUNT:
        raise fail(f"{where}.{name} must be an integer from 0 to {MAX_TOKENS_COUNT}")
    return v


def _number(a: dict[str, Any], name: str, fail: Any, where: str) -> float | None:
    v = a.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not (math.isfinite(v) and v >= 0):
        raise fail(f"{where}.{name} must be a finite number >= 0")
    return float(v)


def _answers(raw: Any, fail: Any) -> dict[str, Answer]:
    if not isinstance(raw, dict) or not 0 < len(raw) <= MAX_TIERS:
        raise fail(f"answers must be an object of 1 to {MAX_TIERS} tiers, {{tier: answer}}")
    out = {}
    for tier, a in raw.items():
        where = f"answers.{tier}"
        if not _TIER_NAME.match(tier):
            raise fail(f"tier name {tier[:80]!r}: lowercase [a-z0-9_.-], at most 64 characters")
        if not isinstance(a, dict):
            raise fail(f"{where} must be an object")
        unknown = sorted(set(a) - _ANSWER_KEYS)
        if unknown:
            raise fail(f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(_ANSWER_KEYS))}")
        text = a.get("text")
        if not isinstance(text, str):
            raise fail(f"{where}.text must be a string")
        if len(text) > MAX_TEXT_CHARS:
            raise fail(f"{where}.text is longer than {MAX_TEXT_CHARS} characters")
        logprobs = a.get("logprobs")
        if logprobs is not None:
            if not isinstance(logprobs, list) or len(logprobs) > MAX_LOGPROBS:
                raise fail(f"{where}.logprobs must be a list of at most {MAX_LOGPROBS} numbers")
            if any(isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) for x in logprobs):
                raise fail(f"{where}.logprobs must hold finite numbers only")
        finish = a.get("finish_reason", "stop")
        if finish not in ("stop", "length"):
            raise fail(f"{where}.finish_reason must be 'stop' or 'length'")
        model = a.get("model", "")
        if not isinstance(model, str) or len(model) > MAX_NAME_CHARS:
            raise fail(f"{where}.model must be a string of at most {MAX_NAME_CHARS} characters")
        out[tier] = Answer(
            text=text,
            prompt_tokens=_count(a, "prompt_tokens", fail, where),
            completion_tokens=_count(a, "completion_tokens", fail, where),
            latency_s=_number(a, "latency_s", fail, where) or 0.0,
            busy_s=_number(a, "busy_s", fail, where),
            logprobs=None if logprobs is None else tuple(float(x) for x in logprobs),
            cost_usd=_number(a, "cost_usd", fail, where),
            finish_reason=finish,
            model=model,
        )
    return out


def _label(raw: Any, kind: str, answers: Mapping[str, Answer], fail: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise fail("label must be an object: {reference, grader?, letters?} or {correct: {tier: bool}}")
    unknown = sorted(set(raw) - _LABEL_KEYS)
    if unknown:
        raise fail(f"label: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(_LABEL_KEYS))}")
    if ("reference" in raw) == ("correct" in raw):
        raise fail("label needs exactly one of 'reference' and 'correct'")
    if "correct" in raw:
        correct = raw["correct"]
        if not isinstance(correct, dict) or any(not isinstance(v, bool) for v in correct.values()):
            raise fail("label.correct must be an object {tier: true or false}")
        if set(correct) != set(answers):
            raise fail(f"label.correct must name every answered tier ({', '.join(answers)}), no other")
        by_text: dict[str, bool] = {}
        for tier, a in answers.items():
            if by_text.setdefault(a.text, correct[tier]) != correct[tier]:
                raise fail("two tiers gave the same answer but are labelled differently")
        return {"kind": "per_tier", "answers": {t: a.text for t, a in answers.items()}, "correct": dict(correct)}
    grader = raw.get("grader", DEFAULT_GRADER[kind])
    if grader not in GRADERS:
        raise fail(f"label.grader must be one of {', '.join(GRADERS)} (got {grader!r})")
    ref = raw["reference"]
    letters = raw.get("letters", "ABCD")
    if not isinstance(letters, str) or not letters.isalpha() or not letters.isupper() or len(letters) > 26:
        raise fail("label.letters must be capital letters, e.g. ABCD")
    problem = _reference_problem(grader, ref, letters)
    if problem:
        raise fail(f"label.reference: {problem}")
    if len(json.dumps(ref)) > MAX_TEXT_CHARS:
        raise fail(f"label.reference is longer than {MAX_TEXT_CHARS} characters")
    return {"kind": "reference", "grader": grader, "value": ref, "letters": letters}


def _reference_problem(grader: str, ref: Any, letters: str) -> str | None:
    if grader == "numeric":
        from verifiers.math_answer import parse_number

        if isinstance(ref, bool) or not (isinstance(ref, int | float) or parse_number(str(ref)) is not None):
            return f"{ref!r} is not a number (grader numeric)"
    elif grader == "choice":
        if not isinstance(ref, str) or ref.strip().upper() not in letters or not ref.strip():
            return f"must be one of the letters {letters} (grader choice)"
    elif grader == "exact":
        if not (isinstance(ref, str) or (isinstance(ref, list) and ref and all(isinstance(r, str) for r in ref))):
            return "must be a string or a list of strings (grader exact)"
    elif grader == "regex":
        if not isinstance(ref, str):
            return "must be a regular expression (grader regex)"
        try:
            re.compile(ref)
        except re.error as exc:
            return f"bad regular expression: {exc}"
    elif not isinstance(ref, str):
        return "must be Python test code (grader code_tests)"
    return None


# ---- pricing ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FittedPrice:
    price: PriceSettings
    max_error_usd: float


def fit_token_price(answers: Sequence[Answer]) -> FittedPrice:
    """USD per 1M input and output tokens that best reproduce the answers' `cost_usd` (least
    squares, both prices >= 0), and the largest error left on one answer."""
    p = [float(a.prompt_tokens) for a in answers]
    c = [float(a.completion_tokens) for a in answers]
    y = [float(a.cost_usd or 0.0) for a in answers]
    spp, scc, spc = (
        math.fsum(x * x for x in p),
        math.fsum(x * x for x in c),
        math.fsum(a * b for a, b in zip(p, c, strict=True)),
    )
    spy, scy = math.fsum(a * b for a, b in zip(p, y, strict=True)), math.fsum(a * b for a, b in zip(c, y, strict=True))
    det = spp * scc - spc * spc
    candidates: list[tuple[float, float]] = []
    if det > 1e-9 * max(spp * scc, 1.0):
        a, b = (spy * scc - scy * spc) / det, (scy * spp - spy * spc) / det
        if a >= 0 and b >= 0:
            candidates.append((a, b))
    if scc > 0:
        candidates.append((0.0, max(0.0, scy / scc)))
    if spp > 0:
        candidates.append((max(0.0, spy / spp), 0.0))
    candidates.append((0.0, 0.0))

    def worst(ab: tuple[float, float]) -> float:
        return max(abs(ab[0] * pi + ab[1] * ci - yi) for pi, ci, yi in zip(p, c, y, strict=True))

    a, b = min(candidates, key=worst)
    err = worst((a, b))
    price = PriceSettings(
        usd_per_1m_input_tokens=a * 1e6,
        usd_per_1m_output_tokens=b * 1e6,
        stands_for=f"fitted to the imported answers' cost_usd (largest error ${err:.3g} per answer)",
    )
    return FittedPrice(price, err)


# ---- the run ------------------------------------------------------------------------------------------------


class _Imported(Backend):
    """An imported tier's backend: its answers are already stored; it has no model to ask for more."""

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta | Generation]:
        raise UnavailableError(f"tier {self.name} is imported: it has no model to generate with")
        yield  # an async generator, like every backend's stream


@dataclass
class ImportResult:
    root: Path
    items: int
    tiers: list[str]
    grading: dict[str, int]
    prices: dict[str, str]
    tasks: dict[str, int] = field(default_factory=dict)


def tier_order(records: Sequence[Record], settings: Settings, tiers: Sequence[str] | None) -> list[str]:
    """The run's tiers, cheapest first: as given, else the config's order for the tiers it knows
    and the first line's order for the rest."""
    first = list(records[0].answers)
    if tiers:
        order = list(tiers)
    else:
        known = [t.name for t in settings.tiers if t.name in first]
        order = known + [t for t in first if t not in known]
    if len(set(order)) != len(order):
        raise ConfigError(f"--tiers names a tier twice: {','.join(order)}")
    for rec in records:
        missing = [t for t in order if t not in rec.answers]
        if missing:
            raise ImportFormatError(f"line {rec.line}: no answer from tier(s) {', '.join(missing)}")
    return order


def _tier_settings(name: str, records: Sequence[Record], settings: Settings, version: str) -> tuple[TierSettings, str]:
    answers = [r.answers[name] for r in records]
    base = next((t for t in settings.tiers if t.name == name), None)
    if all(a.cost_usd is not None for a in answers):
        price, how = fit_token_price(answers).price, "fitted to cost_usd"
    elif base is not None:
        price, how = base.price, "the config's"
    else:
        raise ConfigError(
            f"tier {name}: no price. Give every answer of it a cost_usd, or name a configured tier "
            f"({', '.join(t.name for t in settings.tiers)})"
        )
    models = {a.model for a in answers if a.model}
    model = models.pop() if len(models) == 1 else (f"{len(models)} models" if models else name)
    policy: dict[str, Any] = {}
    if base is not None:  # its judging: the 'config' verifier of the sweep, what calibrate --write retunes
        policy = {
            "verifiers": base.verifiers,
            "combine": base.combine,
            "threshold": base.threshold,
            "tasks": base.tasks,
        }
    tier = TierSettings(
        name=name,
        backend="openai",
        # never called: `import:` marks the answers' source in the run's manifest, not a server, so
        # it is built past the http(s) check a served tier's base_url must pass
        openai=OpenAIBackendSettings.model_construct(base_url=f"import:{version}", model=model),
        price=price,
        **policy,
    )
    return tier, how


def import_records(
    records: Sequence[Record],
    *,
    settings: Settings,
    runs_dir: Path,
    name: str,
    source: str,
    verifiers: Sequence[VerifierSpec] = (),
    tiers: Sequence[str] | None = None,
    task: str | None = None,
    labels: Mapping[str, Any] | None = None,
) -> ImportResult:
    """Write `records` as the eval run `runs_dir/name`: all of it, or (on any error) nothing.
    `labels`: whose labels graded them (a ledger's: `evals.ledger_import.LedgerRead.provenance`),
    kept in the manifest as `import.labels`."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", name):
        raise ConfigError(f"--run {name!r}: letters, digits, '_', '.', '-' (a directory name)")
    if task is not None:
        kind = TASK_KINDS.get(task)
        if kind is None:
            raise ConfigError(f"--task must be one of {', '.join(TASK_KINDS)}")
        records = [r for r in records if r.task == kind]
        if not records:
            raise ConfigError(f"{source}: no items of task {task}")
    final = runs_dir / name
    if final.exists():
        raise ConfigError(f"{final} exists: import into a new run (--run), or remove it first")
    runs_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=runs_dir, prefix=f".{name}.import-"))
    try:
        result = _write(records, tmp, final, settings, name, source, verifiers, tiers, labels)
        os.rename(tmp, final)  # the run appears whole, or not at all
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    result.root = final
    return result


def _write(
    records: Sequence[Record],
    tmp: Path,
    final: Path,
    settings: Settings,
    name: str,
    source: str,
    verifiers: Sequence[VerifierSpec],
    tiers: Sequence[str] | None,
    labels: Mapping[str, Any] | None = None,
) -> ImportResult:
    from evals.runner import EvalPlan, run_eval, tier_fingerprint

    order = tier_order(records, settings, tiers)
    top = order[-1]
    with open(tmp / ITEMS_FILE, "w", encoding="utf-8") as f:
        for r in records:
            key = r.key or {"kind": "agreement", "tier": top, "text": r.answers[top].text}
            row = {
                "id": r.id,
                "task": r.task,
                "group": r.group,
                "messages": [{"role": m.role, "content": m.content} for m in r.messages],
                "key": key,
            }
            f.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
    suite = ImportedSuite(tmp / ITEMS_FILE, name=name)
    made = [_tier_settings(t, records, settings, suite.version) for t in order]
    run_settings = settings.model_copy(update={"tiers": [t for t, _ in made]})
    items = suite.load()
    with RunStore(tmp) as store:
        for tier, _ in made:
            fp = tier_fingerprint(suite, tier)
            for r, item in zip(records, items, strict=True):
                a = r.answers[tier.name]
                store.add_generation(
                    GenerationRecord(
                        key=generation_key(fp, item.prompt_sha),
                        tier=tier.name,
                        item=item.id,
                        model=a.model or tier.name,
                        text=a.text,
                        finish_reason=a.finish_reason,
                        prompt_tokens=a.prompt_tokens,
                        completion_tokens=a.completion_tokens,
                        latency_s=a.latency_s,
                        busy_s=a.busy_s,
                        logprobs=None if a.logprobs is None else list(a.logprobs),
                    )
                )
        plan = EvalPlan(suite=suite, items=items, settings=run_settings, tiers=order, verifiers=list(verifiers))
        registry = VerifierRegistry.from_entry_points()
        for tier, _ in made:
            # they would fail on every answer or, reading with another tier (`cross_tier`), abstain on
            # every one, a column that looks scored: refuse, naming them
            generating = sorted(
                label for label, spec in plan.verifier_specs(tier).items() if _uses_a_model(registry, spec, tier.name)
            )
            if generating:
                raise ConfigError(
                    f"verifier(s) {', '.join(generating)} on tier {tier.name} ask a model for work, and an imported "
                    "tier has none: leave them out (--verifier, or the tier's verifiers for this task in the config)"
                )
        backends = {t: _Imported(t) for t in order}
        summary = asyncio.run(run_eval(plan, store, backends=backends))
    if summary.failed:
        raise ConfigError(
            f"import of {source} failed: {len(summary.failed)} answers could not be scored or graded "
            "(an imported tier cannot generate; drop verifiers that do):\n  " + "\n  ".join(summary.failed[:10])
        )
    grading = Counter(graded_by(r) for r in records)
    prices = {t.name: how for t, how in made}
    tasks = Counter(r.task for r in records)
    manifest = RunStore(tmp).manifest()
    manifest["suite"]["source"] = f"{final / ITEMS_FILE} (sha256 {suite.version[:12]}…)"
    manifest["import"] = {
        "format": FORMAT,
        "source": source,
        "items": len(records),
        "grading": dict(grading),
        # graded by agreement: a cheaper tier is 'right' when it says what this tier says
        # (and labelled items whose top tier disagreed with an answer labelled wrong: see evals.ledger_import)
        "proxy_reference_tier": top
        if grading.get("agreement") or grading.get(SHADOW_AGREEMENT) or any(_top_by_proxy(r) for r in records)
        else None,
        "prices": prices,
        "tasks": dict(tasks),
    }
    if labels is not None:
        manifest["import"]["labels"] = dict(labels)
    RunStore(tmp).write_manifest(manifest)
    return ImportResult(tmp, len(records), order, dict(grading), prices, dict(tasks))
