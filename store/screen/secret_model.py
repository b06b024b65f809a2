"""The learned secrets screen: a linear model over hashed features, read with numpy alone.

The rules (store/screen/secrets.py, store/screen/statements.py, store/screen/secret_layouts.py) say what they are sure
of; this model catches what nobody wrote a rule for -- a Wi-Fi password that is a word, a card
number with its CVV, a seed phrase, a password on the line after "can you log in for me?". The
admission policy refuses a string when a rule fires OR the model's probability reaches its
threshold (``store/screen/policy.py``).

Features (``features``), the same at training (checks/secrets_train.py) and here:

* hashed byte n-grams (2 to 5) of the lowercased text, across word boundaries, as one
  L2-normalised block -- "passw", "e is ", "クパスワ", "密码";
* hashed whole tokens (lowercased) and token shapes: each token's class runs (``Oreo2015!`` ->
  ``Aa9!``), with its length band and how many classes it mixes, as one L2-normalised block; the
  length and entropy band of the longest token;
* cues: a credential noun (eleven languages, ``_NOUNS``) with a value-shaped token after it, a
  digit run passing the Luhn check, a base58 run of a WIF key's length, a run of a dozen short
  lower-case words (a seed phrase);
* the field the string was found in (``where``), when the caller knows it.

A string longer than ``WINDOW`` characters is scored by windows of whole lines (a line longer than
that by pieces), and its score is the highest window's. Inference is a sum of weights: no
scikit-learn, no torch, no network. The artefact (``secret_model_artefact/weights.npy`` and
``secret_model_artefact/card.json``) is written by ``engram-memory train-secrets``, byte for byte
reproducible from the repository's labelled corpora.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from zlib import crc32

import numpy as np

__all__ = ["ARTEFACT", "DIM", "VETOABLE", "SecretModel", "features", "load_model", "windows"]

ARTEFACT = Path(__file__).resolve().parent / "secret_model_artefact"
DIM_BITS = 17
DIM = 1 << DIM_BITS  # hashed feature space; the weights are float16 on disk (256 kB)
WINDOW = 320  # characters scored at once
NGRAMS = (2, 3, 4, 5)
_MIX = np.uint64(0x9E3779B97F4A7C15)
_PRIME = np.uint64(1099511628211)
_SHIFT = np.uint64(64 - DIM_BITS)

_TOKEN = re.compile(r"[^\s,;()\[\]{}<>\"'`“”‘’«»「」『』（）、，。；：]+")
_NOUNS = re.compile(
    r"(?<![a-zà-ÿ])(?:pass(?:word|wd|phrase|code|wort)?|pwd|pw\b|pin\b|kennwort|mot\s+de\s+passe|mdp\b|"
    r"contrase(?:ñ|n)a|clave\b|senha|wachtwoord|parola|codes?\b|c(?:ó|o)digo|codice|wi-?fi|wlan|token|secret|"
    r"api[ _-]?key|key\b|cl(?:é|e)\b|schl(?:ü|u)ssel|chiave|chave|sleutel|cvv|cvc|seed\b|mnemonic|"
    r"cookie|session|login|log\s+in|credentials?|zugangsdaten|identifiants?|acceso|accesso|toegang)")
_CJK_NOUNS = re.compile(
    r"パスワード|暗証番号|パスコード|合言葉|ログイン|キー|トークン|シード|秘密鍵|認証コード|"
    r"密码|密碼|口令|验证码|驗證碼|密钥|密鑰|令牌|助记词|助記詞|私钥|私鑰|登录|登入|账号|帳號")
_VALUE_CUES = re.compile(r"\s*(?:[:=：]|is\b|est\b|es\b|ist\b|lautet\b|è\b|é\b|is:|は|是|为|為|が|：)")


# The rule that reads what a sentence says rather than a token's shape or a key = value: a statement
# can be a look-alike ("the password is on the sticky note"), so the model may overrule it -- it
# fires only if the model's probability reaches the card's ``veto`` as well. Shapes, keys,
# assignments ("password: correcthorsebattery"), headers and URLs stay sure.
VETOABLE = frozenset({"prose_credential"})


@dataclass(frozen=True)
class SecretModel:
    weights: np.ndarray  # float32, DIM
    bias: float
    threshold: float
    veto: float = 0.0  # a VETOABLE rule's finding below this probability is dropped (0: never)

    def probability(self, text: str, where: str | None = None) -> float:
        """The highest window's probability that ``text`` carries a secret."""
        best = -math.inf
        for window in windows(text):
            idx, val = features(window, where)
            z = float(self.bias + np.dot(self.weights[idx], val))
            best = max(best, z)
        if best == -math.inf:
            return 0.0
        return 1.0 / (1.0 + math.exp(-best))

    def fires(self, text: str, where: str | None = None) -> bool:
        return self.probability(text, where) >= self.threshold

    def overrules(self, kind: str, text: str, where: str | None = None) -> bool:
        """Whether a rule's finding of ``kind`` in ``text`` is dropped: a VETOABLE kind the model
        scores below its veto."""
        return kind in VETOABLE and self.veto > 0.0 and self.probability(text, where) < self.veto


def windows(text: str) -> list[str]:
    """Whole lines gathered up to WINDOW characters; a longer line is cut at sentence ends, then hard."""
    text = text.strip()
    if len(text) <= WINDOW:
        return [text] if text else []
    pieces: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        while len(line) > WINDOW:
            cut = max(line.rfind(". ", 0, WINDOW), line.rfind("。", 0, WINDOW), line.rfind(" ", 0, WINDOW))
            cut = cut + 1 if cut > WINDOW // 3 else WINDOW
            pieces.append(line[:cut].strip())
            line = line[cut:].strip()
        if line:
            pieces.append(line)
    out: list[str] = []
    current = ""
    for piece in pieces:
        if current and len(current) + 1 + len(piece) > WINDOW:
            out.append(current)
            current = piece
        else:
            current = f"{current}\n{piece}" if current else piece
    if current:
        out.append(current)
    return out


def _shape(token: str) -> str:
    out: list[str] = []
    for ch in token:
        c = "A" if "A" <= ch <= "Z" else "a" if "a" <= ch <= "z" else "9" if ch.isdigit() else \
            "L" if ch.isalpha() else "!"
        if not out or out[-1] != c:
            out.append(c)
    return "".join(out[:8])


def _entropy(token: str) -> float:
    counts = Counter(token)
    n = len(token)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


_CARD = re.compile(r"(?<!\d)\d(?:[ -]?\d){12,18}(?!\d)")
_B58 = re.compile(r"(?<![A-Za-z0-9])[1-9A-HJ-NP-Za-km-z]{50,52}(?![A-Za-z0-9])")
_WORD_RUN = re.compile(r"(?:\b[a-z]{3,8}\b[ ,]+){11,}[a-z]{3,8}\b")


def _valueish(token: str) -> str | None:
    """What kind of value a token looks like, if any: digits, mixed or long."""
    core = token.strip(".,!?:;")
    if len(core) < 3:
        return None
    if core.isdigit():
        return "digits"
    classes = sum((any(c.isupper() for c in core), any(c.islower() for c in core), any(c.isdigit() for c in core),
                   any(not c.isalnum() for c in core)))
    if classes >= 2 and any(c.isdigit() for c in core):
        return "mixed"
    if len(core) >= 12:
        return "long"
    return None


def _named(words: list[str]) -> np.ndarray:
    return np.fromiter((crc32(w.encode("utf-8", "surrogatepass")) for w in words), dtype=np.uint64, count=len(words))


def features(text: str, where: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(indices, values) of one window's features in the hashed space of DIM."""
    low = text.lower()
    data = np.frombuffer(low.encode("utf-8", "surrogatepass"), dtype=np.uint8).astype(np.uint64)
    grams: list[np.ndarray] = []
    h = data + np.uint64(1)
    for n in range(2, max(NGRAMS) + 1):
        if len(data) < n:
            break
        h = h[:-1] * _PRIME
        h += data[n - 1:]
        grams.append(h * _MIX)
    gram_idx = np.unique(np.concatenate(grams) >> _SHIFT) if grams else np.zeros(0, dtype=np.uint64)

    tokens = _TOKEN.findall(text)[:200]
    token_names: list[str] = []
    for i, token in enumerate(tokens):
        token_names.extend(_token_names(token))
        if i:  # a word and the shape of the token after it, and the other way round: "is Aa9", "pin 9"
            prev = tokens[i - 1]
            token_names.append(f"ws:{prev.lower()[:16]}>{_shape(token)}")
            token_names.append(f"sw:{_shape(prev)}>{token.lower()[:16]}")
    named: list[str] = []
    longest = max(tokens, key=len, default="")
    if longest:
        named.append(f"long:{min(len(longest) // 4, 10)}:{min(int(_entropy(longest) * 2), 12)}")
    matches = list(_NOUNS.finditer(low))
    if not low.isascii():
        matches += _CJK_NOUNS.finditer(low)
    for match in matches:
        noun = match.group(0)
        named.append("noun")
        after = text[match.end():match.end() + 60]
        if _VALUE_CUES.match(after):
            named.append("noun_cue")
        for token in _TOKEN.findall(after)[:6]:
            kind = _valueish(token)
            if kind:
                named.append("noun_value:" + kind)
                named.append(f"noun_value:{noun[:12]}:{kind}")
                break
    for match in _CARD.finditer(text):
        digits = re.sub(r"\D", "", match.group(0))
        named.append("luhn" if _luhn(digits) else "digits13")
    if _B58.search(text):
        named.append("b58")
    if _WORD_RUN.search(low):
        named.append("wordrun")
    lines = text.count("\n") + 1
    named.append(f"lines:{min(lines, 6)}")
    if where:
        named.append("where:" + where)
    named.append("bias")

    token_idx = _named(token_names) % np.uint64(DIM)
    named_idx = _named(named) % np.uint64(DIM)
    n_grams, n_tokens = len(gram_idx), len(token_idx)
    idx = np.concatenate([gram_idx, token_idx, named_idx]).astype(np.int64)
    val = np.concatenate([np.full(n_grams, 1.0 / math.sqrt(n_grams) if n_grams else 0.0),
                          np.full(n_tokens, 1.0 / math.sqrt(n_tokens) if n_tokens else 0.0),
                          np.full(len(named_idx), 1.0)])
    return idx, val


def _token_names(token: str) -> tuple[str, ...]:
    # Not cached across calls: a process-wide cache of screened tokens would keep agent text (and the
    # secrets it refused) in memory, and answer a token another tenant sent sooner than a new one.
    shape = _shape(token)
    band = min(len(token) // 4, 8)
    mix = len(set(shape) - {"L"})
    return ("t:" + token.lower()[:24], "s:" + shape, f"sl:{shape}:{band}", f"mix:{mix}:{band}")


@lru_cache(maxsize=1)
def load_model(folder: Path = ARTEFACT) -> SecretModel | None:
    """The shipped model, or None when it is not there (the rules alone then decide)."""
    weights_path, card_path = folder / "weights.npy", folder / "card.json"
    if not weights_path.is_file() or not card_path.is_file():
        return None
    card = json.loads(card_path.read_text(encoding="utf-8"))
    weights = np.load(weights_path).astype(np.float32)
    if weights.shape != (DIM,):
        raise ValueError(f"{weights_path}: expected {DIM} weights, found {weights.shape}")
    return SecretModel(weights=weights, bias=float(card["bias"]), threshold=float(card["threshold"]),
                       veto=float(card.get("veto", 0.0)))
