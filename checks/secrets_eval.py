"""``engram-memory eval-secrets``: does a secret ever become memory? Measured on a labelled corpus.

Each example of ``checks/secrets/corpus.jsonl`` (built by ``checks/secrets_corpus.py``) is placed
where its ``where`` says -- the component text, or a component id, citation id, primary event
type_ref, citation locator value, source_ref, evidence_ref or attestation -- in an otherwise
valid capture, and sent through the REAL admission path: an in-process engine on a temporary
data dir (``Engine.open``), ``capture`` then ``request_admission``, exactly what the server
calls. A secret is caught when admission answers ``rejected``, or when the schema refuses the
capture (``INVALID_SCHEMA``: e.g. a 1.7 kB PEM block cannot be a 512-byte id), reported apart.
A benign look-alike must be ``accepted``.

Reported per kind and per field: recall on secrets, false-positive rate on benign look-alikes,
against the targets (recall >= 0.98, FPR <= 0.02). ``--generated-seed N`` also generates a corpus
with another seed (other values and other phrasings from the same parts) and reports it apart. It
comes from the generator the rules were tuned on, so it is not held-out data.

The corpora ship with the package (``engram_memory/checks/secrets/``): the command works from a
wheel as from a clone.

``policy_verdict`` is the fast path the unit tests use: the same payload through schema
validation and ``DefaultAdmissionPolicy.decide``, no engine.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, NoReturn, cast

import typer

from engram_memory.models.context import HostContext
from engram_memory.models.errors import EngramError
from engram_memory.models.tools import CaptureInput, RequestAdmissionInput, parse_input, to_plain

Opt = typer.Option

DATA = Path(__file__).resolve().parent / "secrets"  # package data: shipped in the wheel
DEFAULT_CORPUS = DATA / "corpus.jsonl"
PROBES = DATA / "probes.jsonl"
FROZEN = DATA / "frozen.jsonl"  # hand-written before the statement rules; they were then developed on it
HELDOUT = DATA / "heldout.jsonl"  # hand-written by another engineer; first run 0.812 / 0.007, then developed on
HELDOUT2 = DATA / "heldout2.jsonl"  # round 2, written blind to the code: first run 0.704 / 0.019, then developed on
HELDOUT3 = DATA / "heldout3.jsonl"  # round 3, written blind: first run 0.776 / 0.027, then developed on
HELDOUT4 = DATA / "heldout4.jsonl"  # round 4, written blind in 7 languages: run once (0.728 / 0.038)
HELDOUT7 = DATA / "heldout7.jsonl"  # round 7, blind, 9 languages, the same frozen screen: first run 0.653 / 0.031
HELDOUT8 = DATA / "heldout8.jsonl"  # round 8, blind, 9 languages: first run 0.649 / 0.019 rules, 0.755 / 0.022 with
# the classifier (the screen retrained with rounds 6 and 7), development data since
HELDOUT9 = DATA / "heldout9.jsonl"  # round 9, blind, 9 languages: first run 0.641 / 0.021 rules, 0.739 / 0.019 with
# the classifier (veto, round 8 and train10 among its corpora), development data since
# rules, 0.705 / 0.053 with the classifier; development data since
HELDOUT6 = DATA / "heldout6.jsonl"  # round 6, blind, 9 languages: first run 0.610 / 0.038 rules, 0.693 / 0.045 with
# the learned screen; development data since (the shipped model was not trained on it)
GENERATED_SEED = 424242  # the seed the README's figures for a regenerated corpus use
RECALL_TARGET = 0.98
FPR_TARGET = 0.02
T_VALID = 1_780_000_000_000 - 86_400_000  # valid_time and event time: any past instant will do
PURPOSE = "purpose:eval-secrets"
WHERE = ("text", "component_id", "citation_id", "type_ref", "locator", "source_ref", "evidence_ref", "attestation")
CAUGHT = ("rejected", "blocked")  # what counts as a secret kept out


def eval_context() -> HostContext:
    return HostContext(tenant="eval", workspace="secrets", principal="eval", agent_id="eval-secrets",
                       purpose_ref=PURPOSE)


# ---- corpus -------------------------------------------------------------------------------------


def load_corpus(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if row.get("label") not in ("secret", "benign") or row.get("where") not in WHERE or \
                    not isinstance(row.get("text"), str):
                raise ValueError(f"{path}:{number}: needs text, label secret|benign and where in {', '.join(WHERE)}")
            rows.append(row)
    return rows


def generated_corpus(seed: int = GENERATED_SEED) -> list[dict[str, Any]]:
    """The generator's corpus for another seed (not held-out: the rules were tuned on its parts)."""
    from engram_memory.checks.secrets_corpus import generate

    return list(generate(seed, hand_tried=False))


# ---- placing an example in a capture -------------------------------------------------------------


def _sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def capture_arguments(example: dict[str, Any], index: int) -> dict[str, Any]:
    """A valid capture with the example's text placed where it says (ids consistently everywhere)."""
    text, where = example["text"], example["where"]
    body = text if where == "text" else f"Placement probe {index}: the release train leaves on Thursdays."
    component_id = text if where == "component_id" else "c1"
    citation_id = text if where == "citation_id" else "s1"
    evidence: dict[str, Any] = {
        "evidence_ref": text if where == "evidence_ref" else "ev:1",
        "evidence_digest": _sha(f"evidence:{index}"),
        "citation_ids": [citation_id],
    }
    if where == "attestation":
        evidence["attestation"] = text
    return {
        "idempotency_key": f"eval-secrets-{index:08d}",
        "payload": {
            "schema_version": 2,
            "purpose_ref": PURPOSE,
            "valid_time": {"t": T_VALID},
            "components": [{"component_id": component_id, "kind": "decision", "text": body,
                            "citation_ids": [citation_id]}],
            "primary_component_id": component_id,
            "primary_event": {"at": T_VALID, "type_ref": text if where == "type_ref" else "event:decided",
                              "citation_id": citation_id},
            "citations": [{
                "citation_id": citation_id,
                "source_ref": text if where == "source_ref" else "doc:adr-7",
                "locator": {"scheme": "path", "value": text if where == "locator" else "docs/adr-7.md#L3"},
                "content_digest": _sha(body),
            }],
        },
        "evidence": evidence,
    }


def policy_verdict(example: dict[str, Any], index: int = 0) -> str:
    """The fast path: schema validation, then the admission policy on the payload the engine would
    hand it (scope_ref, retention and reconciliation filled in as capture does). blocked|rejected|accepted."""
    from engram_memory.store.screen.policy import DefaultAdmissionPolicy

    try:
        plain = to_plain(parse_input("capture", capture_arguments(example, index)))
    except EngramError as exc:
        if exc.code == "INVALID_SCHEMA":
            return "blocked"
        raise
    ctx = eval_context()
    payload = {**plain["payload"], "scope_ref": ctx.scope_ref,
               "retention": {"derivative_rule": "make-ineligible"}, "reconciliation": {"family_refs": []}}
    decision = DefaultAdmissionPolicy().decide(payload, plain["evidence"])
    return "rejected" if decision == "reject" else "accepted" if decision == "accept" else "pending_adjudication"


class EngineRunner:
    """The real path: capture + request_admission on an in-process engine (a temporary data dir)."""

    def __init__(self, data_dir: Path) -> None:
        from engram_memory.models.settings import EngineSettings
        from engram_memory.store.core.engine import Engine

        self.engine = Engine.open(EngineSettings(data_dir=data_dir, semantic=False))
        self.ctx = eval_context()
        self._n = 0

    def verdict(self, example: dict[str, Any]) -> tuple[str, str | None]:
        """(blocked|rejected|accepted|pending_adjudication|error:CODE, record_id when accepted)."""
        self._n += 1
        args = capture_arguments(example, self._n)
        try:
            cap = to_plain(self.engine.capture(self.ctx, cast(CaptureInput, parse_input("capture", args))))
        except EngramError as exc:
            return ("blocked" if exc.code == "INVALID_SCHEMA" else f"error:{exc.code}"), None
        admit = {"candidate_id": cap["candidate_id"], "idempotency_key": f"eval-secrets-admit-{self._n:08d}"}
        try:
            request = cast(RequestAdmissionInput, parse_input("request_admission", admit))
            value = to_plain(self.engine.request_admission(self.ctx, request))
        except EngramError as exc:
            return f"error:{exc.code}", None
        outcome = value["outcome"]
        return outcome["status"], outcome.get("record_id")

    def close(self) -> None:
        self.engine.close()


# ---- scoring ------------------------------------------------------------------------------------


@dataclass
class Tally:
    n: int = 0
    caught: int = 0  # secret: rejected or blocked; benign: rejected (a false positive)
    blocked: int = 0
    errors: int = 0

    def add(self, label: str, verdict: str) -> None:
        self.n += 1
        if verdict.startswith("error:"):
            self.errors += 1
        elif verdict == "blocked":
            self.blocked += 1
            self.caught += label == "secret"
        elif verdict == "rejected":
            self.caught += 1

    @property
    def rate(self) -> float:
        return self.caught / self.n if self.n else 0.0


@dataclass
class Score:
    name: str
    secret: Tally = field(default_factory=Tally)
    benign: Tally = field(default_factory=Tally)
    kinds: dict[tuple[str, str], Tally] = field(default_factory=lambda: defaultdict(Tally))
    wheres: dict[tuple[str, str], Tally] = field(default_factory=lambda: defaultdict(Tally))
    langs: dict[tuple[str, str], Tally] = field(default_factory=lambda: defaultdict(Tally))
    misses: list[dict[str, Any]] = field(default_factory=list)  # false negatives and false positives
    verdicts: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def add(self, example: dict[str, Any], verdict: str) -> None:
        label = example["label"]
        (self.secret if label == "secret" else self.benign).add(label, verdict)
        self.kinds[(label, example["kind"])].add(label, verdict)
        self.wheres[(label, example["where"])].add(label, verdict)
        self.langs[(label, example.get("lang", "en"))].add(label, verdict)
        self.verdicts[verdict] += 1
        wrong = (label == "secret" and verdict not in CAUGHT) or (label == "benign" and verdict != "accepted")
        if wrong:
            self.misses.append({**example, "verdict": verdict})

    @property
    def recall(self) -> float:
        return self.secret.rate

    @property
    def fpr(self) -> float:
        return self.benign.rate

    @property
    def meets_targets(self) -> bool:
        return self.recall >= RECALL_TARGET and self.fpr <= FPR_TARGET and not self.secret.errors \
            and not self.benign.errors

    def as_json(self) -> dict[str, Any]:
        def tally(t: Tally, label: str) -> dict[str, Any]:
            rate = "recall" if label == "secret" else "fpr"
            return {"n": t.n, "caught" if label == "secret" else "rejected": t.caught,
                    "blocked_by_schema": t.blocked, "errors": t.errors, rate: round(t.rate, 4)}

        return {
            "name": self.name,
            "recall": round(self.recall, 4), "fpr": round(self.fpr, 4),
            "targets": {"recall": RECALL_TARGET, "fpr": FPR_TARGET}, "meets_targets": self.meets_targets,
            "secret": tally(self.secret, "secret"), "benign": tally(self.benign, "benign"),
            "per_kind": {f"{label}/{kind}": tally(t, label) for (label, kind), t in sorted(self.kinds.items())},
            "per_where": {f"{label}/{where}": tally(t, label) for (label, where), t in sorted(self.wheres.items())},
            "per_language": {f"{label}/{lang}": tally(t, label) for (label, lang), t in sorted(self.langs.items())},
            "verdicts": dict(sorted(self.verdicts.items())),
            "misses": self.misses,
            "seconds": round(self.seconds, 2),
        }


def score(name: str, examples: Sequence[dict[str, Any]], judge: Callable[[dict[str, Any], int], str],
          tick: Callable[[], None] | None = None) -> Score:
    result = Score(name)
    start = time.perf_counter()
    for index, example in enumerate(examples):
        result.add(example, judge(example, index))
        if tick is not None:
            tick()
    result.seconds = time.perf_counter() - start
    return result


def score_policy(examples: Sequence[dict[str, Any]], name: str = "policy") -> Score:
    """The whole corpus through the policy function (no engine): what the unit test asserts on."""
    return score(name, examples, policy_verdict)


def score_engine(examples: Sequence[dict[str, Any]], name: str, tick: Callable[[], None] | None = None) -> Score:
    with tempfile.TemporaryDirectory(prefix="engram-eval-secrets-") as tmp:
        runner = EngineRunner(Path(tmp))
        try:
            with runner.engine.batch():  # projections of accepted records once, at the end
                return score(name, examples, lambda ex, _i: runner.verdict(ex)[0], tick)
        finally:
            runner.close()


# ---- report -------------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def render(scores: Iterable[Score], path_label: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True, width=None if sys.stderr.isatty() else 140)
    for s in scores:
        table = Table(title=f"eval-secrets: {s.name} ({path_label}, {s.secret.n} secret + {s.benign.n} benign, "
                      f"{s.seconds:.1f} s)", title_justify="left")
        for column, justify in (("label", "left"), ("kind", "left"), ("n", "right"), ("caught / rejected", "right"),
                                ("of which schema", "right"), ("recall / FPR", "right")):
            table.add_column(column, justify=justify)  # type: ignore[arg-type]
        for (label, kind), t in sorted(s.kinds.items()):
            ok = t.rate >= RECALL_TARGET if label == "secret" else t.rate <= FPR_TARGET
            style = "" if ok else "bold red"
            table.add_row(label, kind, str(t.n), str(t.caught), str(t.blocked or ""), _pct(t.rate), style=style)
        table.add_section()
        for (label, where), t in sorted(s.wheres.items()):
            table.add_row(label, f"in {where}", str(t.n), str(t.caught), str(t.blocked or ""), _pct(t.rate),
                          style="dim")
        table.add_section()
        recall_ok, fpr_ok = s.recall >= RECALL_TARGET, s.fpr <= FPR_TARGET
        table.add_row("secret", "ALL", str(s.secret.n), str(s.secret.caught), str(s.secret.blocked),
                      _pct(s.recall), style="bold green" if recall_ok else "bold red")
        table.add_row("benign", "ALL", str(s.benign.n), str(s.benign.caught), str(s.benign.blocked),
                      _pct(s.fpr), style="bold green" if fpr_ok else "bold red")
        console.print(table)
        mark = "[green]met[/green]" if s.meets_targets else "[red]NOT met[/red]"
        console.print(f"  recall {s.recall:.4f} (target >= {RECALL_TARGET}), FPR {s.fpr:.4f} "
                      f"(target <= {FPR_TARGET}): {mark}; verdicts {dict(sorted(s.verdicts.items()))}")
        for miss in s.misses[:20]:
            what = "missed secret" if miss["label"] == "secret" else "false positive"
            console.print(f"  [yellow]{what}[/yellow] {miss['kind']} in {miss['where']} -> {miss['verdict']}: "
                          f"{miss['text'][:100]!r}", markup=True, highlight=False)
        if len(s.misses) > 20:
            console.print(f"  ... and {len(s.misses) - 20} more (see --json)")


def render_comparison(pairs: Iterable[tuple[Score, Score]], path_label: str) -> None:
    """Each corpus apart, per language: the rules alone against the rules with the learned screen."""
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True, width=None if sys.stderr.isatty() else 140)
    for rules, both in pairs:
        table = Table(title=f"eval-secrets: {both.name} ({path_label}): rules alone | rules + classifier",
                      title_justify="left")
        for column in ("language", "secrets", "recall rules", "recall +classifier", "benign", "FPR rules",
                       "FPR +classifier"):
            table.add_column(column, justify="left" if column == "language" else "right")
        langs = sorted({lang for _label, lang in both.langs})
        rows = [(lang, rules.langs.get(("secret", lang), Tally()), both.langs.get(("secret", lang), Tally()),
                 rules.langs.get(("benign", lang), Tally()), both.langs.get(("benign", lang), Tally()))
                for lang in langs]
        rows.append(("ALL", rules.secret, both.secret, rules.benign, both.benign))
        for lang, rs, bs, rb, bb in rows:
            table.add_row(lang, str(bs.n), f"{rs.rate:.3f}", f"{bs.rate:.3f}", str(bb.n), f"{rb.rate:.3f}",
                          f"{bb.rate:.3f}", style="bold" if lang == "ALL" else "")
        console.print(table)


def fail(message: str) -> NoReturn:
    sys.stderr.write(f"engram-memory: error: {message}\n")
    sys.stderr.flush()
    raise typer.Exit(2)


def eval_secrets_cmd(
    corpus: Annotated[Path, Opt("--corpus", help="Labelled corpus (JSON lines: text, label, kind, where).")]
    = DEFAULT_CORPUS,
    json_out: Annotated[Path | None, Opt("--json", help="Write the full results (per kind, per field, every "
                                         "miss) to this JSON file.", show_default=False)] = None,
    frozen: Annotated[bool, Opt("--frozen/--no-frozen", help="Also score the five frozen hand-written corpora "
                                "(checks/secrets/frozen.jsonl, heldout.jsonl, heldout2.jsonl, heldout3.jsonl: each "
                                "unseen once, then developed on; heldout4.jsonl: run once, not developed on), each "
                                "apart.")] = True,
    generated_seed: Annotated[int | None, Opt("--generated-seed", metavar="N", show_default=False,
                                              help="Also generate and score the generator's corpus for seed N "
                                              f"(e.g. {GENERATED_SEED}; the generator the rules were tuned on, "
                                              "reported apart).")] = None,
    blind: Annotated[list[Path] | None, Opt("--blind", metavar="FILE", show_default=False,
                                            help="A blind round (same line format, with lang) scored apart at its "
                                            "first run; may be given several times.")] = None,
    policy_only: Annotated[bool, Opt("--policy-only", help="Score the policy function alone (fast; no engine, "
                                     "no capture or admission).")] = False,
    progress: Annotated[bool, Opt("--progress/--no-progress", help="Progress bar on stderr.")] = True,
) -> None:
    """Secrets never become memory: run a labelled corpus through capture + admission; recall and FPR."""
    if not corpus.is_file():
        fail(f"--corpus {corpus}: no such file (the shipped one is {DEFAULT_CORPUS})")
    if json_out is not None and not json_out.parent.is_dir():
        fail(f"--json {json_out}: its folder does not exist")
    try:
        sets = [("corpus", load_corpus(corpus))]
        if frozen:
            sets.append(("frozen, development (hand-written)", load_corpus(FROZEN)))
            sets.append(("held-out round 1 (hand-written; developed on after its first run)", load_corpus(HELDOUT)))
            sets.append(("held-out round 2 (written blind; developed on after its first run)", load_corpus(HELDOUT2)))
            sets.append(("held-out round 3 (written blind; developed on after its first run)", load_corpus(HELDOUT3)))
            sets.append(("held-out round 4 (written blind, 7 languages; first run 0.728 / 0.038; development data "
                         "since the learned screen)", load_corpus(HELDOUT4)))
            sets.append(("held-out round 6 (written blind, 9 languages; first run 0.610 / 0.038 rules, 0.693 / 0.045 "
                         "with the classifier; development data since)", load_corpus(HELDOUT6)))
            sets.append(("held-out round 7 (written blind, 9 languages; first run 0.653 / 0.031 rules, 0.705 / 0.053 "
                         "with the classifier; development data since)", load_corpus(HELDOUT7)))
            sets.append(("held-out round 8 (written blind, 9 languages; first run 0.649 / 0.019 rules, 0.755 / 0.022 "
                         "with the classifier; development data since)", load_corpus(HELDOUT8)))
            sets.append(("held-out round 9 (written blind, 9 languages; first run 0.641 / 0.021 rules, 0.739 / 0.019 "
                         "with the classifier; development data since)", load_corpus(HELDOUT9)))
        for path in blind or []:
            sets.append((f"blind round {path.name} (first run)", load_corpus(path)))
        if generated_seed is not None:
            sets.append((f"generated (seed {generated_seed})", generated_corpus(generated_seed)))
    except (OSError, ValueError) as exc:
        fail(str(exc))

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from engram_memory.store.screen.secrets import rules_only

    scores: list[Score] = []
    pairs: list[tuple[Score, Score]] = []
    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=not progress, transient=True) as bar:
        for name, examples in sets:
            pair: list[Score] = []
            for mode in ("rules alone", "rules + classifier"):
                task = bar.add_task(f"eval-secrets {name}: {mode}", total=len(examples))

                def tick(task: Any = task) -> None:
                    bar.advance(task)

                def judged(example: dict[str, Any], index: int, tick: Callable[[], None] = tick) -> str:
                    tick()
                    return policy_verdict(example, index)

                label = f"{name} [{mode}]"
                with rules_only() if mode == "rules alone" else nullcontext():
                    if policy_only:
                        pair.append(score(label, examples, judged))
                    else:
                        pair.append(score_engine(examples, label, tick))
            pairs.append((pair[0], pair[1]))
            scores.append(pair[1])
    path_label = "policy function" if policy_only else "engine: capture + request_admission"
    render(scores, path_label)
    render_comparison(pairs, path_label)
    if json_out is not None:
        json_out.write_text(json.dumps({"path": "policy" if policy_only else "engine",
                                        "corpus": str(corpus),
                                        "results": [s.as_json() for pair in pairs for s in pair]},
                                       indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        console.print(f"  wrote {json_out}")
