"""Which language a text is in, and how the lexical channel analyses each language.

A record's language is identified once, from its own text, when it enters the lexical projection
(at admission, and again by ``rebuild-index``: the identifier is pinned, so the same text always
gets the same language). Each language with an analysis of its own (``ANALYSES``) has its own
fields in the index, so its BM25 statistics never mix with another language's; every other
language shares the generic analysis (``xx``).

Identification, in this order:

* scripts without spaces decide by themselves: kana -> ``ja``, Han -> ``zh``, Thai -> ``th``,
  Hangul -> ``ko`` (when they hold most of the letters);
* short text (fewer than ``SHORT_TEXT`` letters) is too little for a classifier: its script
  decides (Latin -> ``en``, Cyrillic -> ``ru``, Arabic -> ``ar``, Greek -> ``el``, else ``xx``);
* otherwise py3langid (pinned, models inside the package), restricted to ``IDENTIFIED``, on the
  first ``IDENTIFY_CHARS`` characters; mixed text goes to the language most of it is in.

Scripts without spaces are cut into overlapping character n-grams (bigrams of Han and kana,
trigrams of Thai, Lao, Khmer and Myanmar) before any analyzer sees them (``segment``), in every
language's analysis: a Chinese name inside an English note is searchable, and a Chinese question
finds a Chinese paragraph.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import tantivy

LANGID = f"py3langid-{version('py3langid')}"
IDENTIFY_CHARS = 240  # the classifier reads this much of a record (its cost grows with the bytes read)
SCRIPT_CHARS = 600  # the script count reads this much
SHORT_TEXT = 24  # letters below which the script decides, not the classifier
DEFAULT_LANGUAGE = "en"  # a scope with no record yet analyses a query as English

# NLTK's English stop words (179; bm25s.stopwords.STOPWORDS_EN_PLUS). Question words and auxiliaries
# ("what", "when", "did", "you") otherwise match short conversational records with full BM25 weight:
# measured in studies/lexical-study.md (LoCoMo mean nDCG@10 0.470 -> 0.516, at or above bm25s on every
# development collection). Words with an apostrophe never match (the tokenizer splits on it); kept
# verbatim so the list stays the published one.
STOPWORDS_EN: tuple[str, ...] = (
    'a', 'about', 'above', 'after', 'again', 'against', 'ain', 'all', 'am', 'an', 'and', 'any', 'are', 'aren',
    "aren't", 'as', 'at', 'be', 'because', 'been', 'before', 'being', 'below', 'between', 'both', 'but', 'by',
    'can', 'couldn', "couldn't", 'd', 'did', 'didn', "didn't", 'do', 'does', 'doesn', "doesn't", 'doing', 'don',
    "don't", 'down', 'during', 'each', 'few', 'for', 'from', 'further', 'had', 'hadn', "hadn't", 'has', 'hasn',
    "hasn't", 'have', 'haven', "haven't", 'having', 'he', 'her', 'here', 'hers', 'herself', 'him', 'himself',
    'his', 'how', 'i', 'if', 'in', 'into', 'is', 'isn', "isn't", 'it', "it's", 'its', 'itself', 'just', 'll', 'm',
    'ma', 'me', 'mightn', "mightn't", 'more', 'most', 'mustn', "mustn't", 'my', 'myself', 'needn', "needn't", 'no',
    'nor', 'not', 'now', 'o', 'of', 'off', 'on', 'once', 'only', 'or', 'other', 'our', 'ours', 'ourselves', 'out',
    'over', 'own', 're', 's', 'same', 'shan', "shan't", 'she', "she's", 'should', "should've", 'shouldn',
    "shouldn't", 'so', 'some', 'such', 't', 'than', 'that', "that'll", 'the', 'their', 'theirs', 'them',
    'themselves', 'then', 'there', 'these', 'they', 'this', 'those', 'through', 'to', 'too', 'under', 'until',
    'up', 've', 'very', 'was', 'wasn', "wasn't", 'we', 'were', 'weren', "weren't", 'what', 'when', 'where',
    'which', 'while', 'who', 'whom', 'why', 'will', 'with', 'won', "won't", 'wouldn', "wouldn't", 'y', 'you',
    "you'd", "you'll", "you're", "you've", 'your', 'yours', 'yourself', 'yourselves',
)


@dataclass(frozen=True)
class Analysis:
    """One language's analyzer: its name (what a receipt says), its steps, and how to build it."""

    code: str
    name: str
    stemmer: str | None = None  # tantivy's Snowball stemmer
    stopwords: str | None = None  # tantivy's stop-word list ("custom" for STOPWORDS_EN)
    fold: bool = False  # ASCII/accent folding after the stemmer

    def description(self) -> str:
        steps = ["segment(bigrams: Han, kana; trigrams: Thai, Lao, Khmer, Myanmar)", "tantivy simple",
                 "remove_long(40)", "lowercase"]
        if self.stopwords == "custom":
            steps.append(f"stopwords(nltk english, {len(STOPWORDS_EN)})")
        elif self.stopwords:
            steps.append(f"stopwords({self.stopwords})")
        if self.stemmer:
            steps.append(f"stemmer({self.stemmer})")
        if self.fold:
            steps.append("ascii_fold")
        return " + ".join(steps)

    def build(self) -> tantivy.TextAnalyzer:
        builder = (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
                   .filter(tantivy.Filter.remove_long(40))
                   .filter(tantivy.Filter.lowercase()))
        if self.stopwords == "custom":
            builder = builder.filter(tantivy.Filter.custom_stopword(list(STOPWORDS_EN)))
        elif self.stopwords:
            builder = builder.filter(tantivy.Filter.stopword(self.stopwords))
        if self.stemmer:
            builder = builder.filter(tantivy.Filter.stemmer(self.stemmer))
        if self.fold:
            builder = builder.filter(tantivy.Filter.ascii_fold())
        return builder.build()


def _stem_stop(code: str, language: str, *, stop: bool = True, fold: bool = True) -> Analysis:
    kind = "stem_stop" if stop else "stem"
    return Analysis(code, f"engram_{code}_{kind}{'_fold' if fold else ''}_v1", language,
                    language if stop else None, fold)


# The order is the index's numbering of languages (the ``lang_no`` fast field): add at the end only.
ANALYSES: tuple[Analysis, ...] = (
    Analysis("en", "engram_en_stem_stop_v3", "english", "custom"),
    _stem_stop("de", "german"),
    _stem_stop("fr", "french"),
    _stem_stop("es", "spanish"),
    _stem_stop("it", "italian"),
    _stem_stop("pt", "portuguese"),
    _stem_stop("nl", "dutch"),
    _stem_stop("sv", "swedish"),
    _stem_stop("da", "danish"),
    _stem_stop("no", "norwegian"),
    _stem_stop("fi", "finnish"),
    _stem_stop("hu", "hungarian"),
    _stem_stop("ru", "russian", fold=False),
    _stem_stop("ro", "romanian", stop=False),
    _stem_stop("tr", "turkish", stop=False, fold=False),
    _stem_stop("el", "greek", stop=False, fold=False),
    _stem_stop("ar", "arabic", stop=False, fold=False),
    Analysis("zh", "engram_zh_bigram_v1"),
    Analysis("ja", "engram_ja_bigram_v1"),
    Analysis("th", "engram_th_trigram_v1"),
    Analysis("vi", "engram_vi_words_v1"),
    Analysis("ko", "engram_ko_words_v1"),
    Analysis("xx", "engram_xx_words_v1"),  # every other language: words, lowercased
)
BY_CODE: dict[str, Analysis] = {a.code: a for a in ANALYSES}
LANGUAGE_NO: dict[str, int] = {a.code: i for i, a in enumerate(ANALYSES)}
# What the classifier may answer: the languages analysed on their own, and common ones that are not
# (they get ``xx``; naming them keeps a Polish note from being called Slovak-ish Czech, or Spanish).
IDENTIFIED: tuple[str, ...] = tuple(sorted(
    {a.code for a in ANALYSES if a.code not in ("xx",)} | {"nn", "pl", "cs", "sk", "uk", "bg", "id", "ms", "he",
                                                          "fa", "hi", "ca", "hr", "sr", "sl", "lt", "lv", "et"}))
_ALIASES = {"nn": "no"}

# -- scripts -----------------------------------------------------------------------------------------

# Han and kana are cut into character bigrams (most Chinese words are two characters); the
# abugidas without spaces (Thai, Lao, Khmer, Myanmar), whose vowels and tones are combining marks,
# into trigrams: on XQuAD Thai, lexical nDCG@10 0.933 with bigrams, 0.967 with trigrams.
_HAN = r"\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff"
_ABUGIDA = r"\u0e00-\u0e7f\u0e80-\u0eff\u1000-\u109f\u1780-\u17ff"
_NO_SPACE_RUN = re.compile(f"[{_HAN}]+|[{_ABUGIDA}]+")


_SCRIPTS: tuple[tuple[str, re.Pattern[str]], ...] = tuple((name, re.compile(f"[{chars}]")) for name, chars in (
    ("kana", "\u3040-\u30ff\u31f0-\u31ff"),
    ("han", "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff"),
    ("thai", "\u0e00-\u0e7f"),
    ("hangul", "\uac00-\ud7af\u1100-\u11ff\u3130-\u318f"),
    ("latin", "A-Za-z\u00c0-\u024f\u1e00-\u1eff"),
    ("cyrillic", "\u0400-\u052f"),
    ("arabic", "\u0600-\u06ff\u0750-\u077f\ufb50-\ufeff"),
    ("greek", "\u0370-\u03ff\u1f00-\u1fff"),
))
_LETTER = re.compile(r"[^\W\d_]")
_NON_LATIN = re.compile("[^\u0000-\u024f\u1e00-\u1eff\u2000-\u206f]")
_WORD = re.compile(r"[^\W\d_]+")
_EN_STOP = frozenset(STOPWORDS_EN)
ENGLISH_WORDS = 32  # the English fast path reads this many words
ENGLISH_SHARE = 0.2  # German paragraphs of XQuAD: median 0.03; English prose of every dev collection: 0.31-0.41


_SHORT_FALLBACK = {"latin": "en", "cyrillic": "ru", "arabic": "ar", "greek": "el", "han": "zh", "kana": "ja",
                   "thai": "th", "hangul": "ko"}


def segment(text: str) -> str:
    """``text`` with every run of a script without spaces cut into overlapping character n-grams
    (bigrams of Han and kana, trigrams of Thai, Lao, Khmer and Myanmar; a shorter run stays
    itself); everything else unchanged."""
    if not _NO_SPACE_RUN.search(text):
        return text
    return _NO_SPACE_RUN.sub(_bigrams, text)


def _bigrams(match: re.Match[str]) -> str:
    run = match.group(0)
    n = 2 if run[0] > "\u2fff" else 3  # Han and kana; else Thai, Lao, Khmer, Myanmar
    if len(run) <= n:
        return f" {run} "
    return " " + " ".join(run[i:i + n] for i in range(len(run) - n + 1)) + " "


# -- identification ----------------------------------------------------------------------------------

_identifier: Any = None
_identifier_lock = threading.Lock()


def _classifier() -> Any:
    global _identifier
    with _identifier_lock:
        if _identifier is None:
            from engram_memory.retrieval.langid_tables import identifier

            _identifier = identifier(version("py3langid"), IDENTIFIED)
        return _identifier


def scripts_of(text: str) -> dict[str, int]:
    """Letters of ``text`` per script (``_SCRIPTS``; ``other`` for the rest), counted in C by regexes."""
    counts = {name: len(pattern.findall(text)) for name, pattern in _SCRIPTS}
    letters = len(_LETTER.findall(text))
    counts["other"] = max(0, letters - sum(counts.values()))
    return {name: n for name, n in counts.items() if n}


def _plainly_english(sample: str) -> bool:
    """At least ``ENGLISH_SHARE`` of the first words are English stop words: no other language's text
    comes near (English prose: a median of 0.31-0.41 on the development collections), and it spares
    the classifier most records."""
    words = _WORD.findall(sample)[:ENGLISH_WORDS]
    return len(words) >= ENGLISH_WORDS // 2 and sum(w.lower() in _EN_STOP for w in words) >= ENGLISH_SHARE * len(words)


def identify(text: str) -> str:
    """The analysis code (``ANALYSES``) of ``text``'s language; see the module doc for the rules."""
    head = text[:IDENTIFY_CHARS]
    if not _NON_LATIN.search(head) and _plainly_english(head):
        return "en"
    scripts = scripts_of(text[:SCRIPT_CHARS])
    letters = sum(scripts.values())
    if not letters:
        return DEFAULT_LANGUAGE
    top = max(sorted(scripts), key=scripts.__getitem__)
    kana = scripts.get("kana", 0)
    if kana * 10 >= letters and kana + scripts.get("han", 0) > letters // 2:
        return "ja"
    if top in ("han", "thai", "hangul") or letters < SHORT_TEXT:
        return _SHORT_FALLBACK.get(top, "xx")
    safe = unicodedata.normalize("NFC", text[:IDENTIFY_CHARS]).encode("utf-8", "replace").decode("utf-8")
    code = str(_classifier().classify(safe)[0])
    code = _ALIASES.get(code, code)
    return code if code in BY_CODE else "xx"


def analysis(code: str) -> Analysis:
    return BY_CODE[code]


def describe() -> dict[str, Any]:
    """What the lexical channel's receipt configuration names of language analysis."""
    return {"language_id": LANGID, "analyzers": {a.code: a.name for a in ANALYSES}}
