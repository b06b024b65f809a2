"""Credentials laid out rather than said: tables, exports, config calls, wifi QR strings, and a label
whose value sits on the lines below it.

The statement judge (store/screen/statements.py) reads one line at a time and needs a noun bound to a value
in that line. Structured text puts the noun in a header ("| Service | User | Password |", a password
manager's CSV export), in a quoted setting name (``define('DB_PASSWORD', '…')``), in a field letter
(``WIFI:T:WPA;S:…;P:…;;``), or on the line above ("Backup codes (GitHub):" then one code per line).
This module finds those layouts and hands each value to the same tests of a value the judge uses,
so "what counts as a concrete value" stays in one place.
"""

from __future__ import annotations

import csv
import re

from engram_memory.store.screen.statements import find_statement, password_shaped

# A header cell naming the column of secrets, in the languages the judge reads.
_SECRET_COLUMN = re.compile(
    r"(?i)^\s*(?:pass(?:word|wd|phrase|code)?|pw|pwd|mot\s+de\s+passe|mdp|contrase(?:ñ|n)a|clave|passwort|kennwort|"
    r"senha|palavra-passe|wachtwoord|pin(?:[ -]?code)?|secret|client\s+secret|api\s+key|token|"
    r"(?:login\s+)?password\s*\(.{1,20}\))\s*$")
_DELIMITERS = ",;\t"
# A value in a cell that stands for "not here": "(SSO)", "—", "see Claire", "in vault".
_ELSEWHERE = re.compile(r"(?i)^(?:\(.*\)|[-–—/]+|n/?a|none|(?:see|voir|ver|siehe|vedi|zie)\s.+|in\s+.+)$")
# A setting name quoted as a call's first argument: define('DB_PASSWORD', …), cfg.set("smtp_password", …).
_CALL_PAIR = re.compile(
    r"\(\s*(?P<q1>['\"])(?P<name>[\w.-]*(?:pass(?:word|wd)?|pwd|secret|token|api_?key|passphrase|pin)[\w.-]*)"
    r"(?P=q1)\s*,\s*(?P<q2>['\"])(?P<val>[^'\"\n]{3,200})(?P=q2)\s*\)", re.IGNORECASE)
_WIFI_QR = re.compile(r"WIFI:(?:[^;\n]*;)*?P:(?P<val>(?:\\.|[^;\n])+);")
_BULLET = re.compile(r"^\s*(?:[-*•>]|\d+[.)])\s+")
# A label: a short line ending with a colon, or naming a list of codes ("TOTP backup codes").
_LABEL = re.compile(r"^.{3,80}:\s*$|^.{0,40}\b(?:backup|recovery|bypass|totp|2fa|otp)\s+codes?\b.{0,20}$",
                    re.IGNORECASE)


def _secret_cell(value: str) -> bool:
    value = value.strip().strip("\"'`")
    # one value: a cell with words in it ("con Cl@ve PIN") describes how, not what
    return bool(value) and " " not in value and not _ELSEWHERE.match(value) and password_shaped(value)


def _rows(lines: list[str]) -> list[list[str]] | None:
    """The cells of a pipe table or a delimited export, or None when the lines are neither."""
    if sum("|" in line for line in lines) >= 2:
        rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines if "|" in line]
        return [row for row in rows if not all(re.fullmatch(r":?-{2,}:?", cell) for cell in row if cell)]
    for delimiter in _DELIMITERS:
        if all(line.count(delimiter) >= 1 for line in lines[:2]) and len(lines) >= 2:
            return [[cell.strip() for cell in row] for row in csv.reader(lines, delimiter=delimiter)]
    return None


def _table_secret(lines: list[str]) -> bool:
    rows = _rows(lines)
    if not rows:
        return False
    header = rows[0]
    columns = [i for i, cell in enumerate(header) if _SECRET_COLUMN.match(cell)]
    for row in rows[1:]:
        if any(i < len(row) and _secret_cell(row[i]) for i in columns):
            return True
        # A field / value table, one setting per row: "password | Otter&Canoe41".
        if len(row) == 2 and _SECRET_COLUMN.match(row[0]) and _secret_cell(row[1]):
            return True
    return False


def _label_values(lines: list[str]) -> str | None:
    """A label line ending with a colon, read with the lines below it as one statement."""
    for i, line in enumerate(lines[:-1]):
        if not _LABEL.match(line):
            continue
        below = []
        for nxt in lines[i + 1:i + 13]:
            nxt = _BULLET.sub("", nxt).strip()
            if not nxt or _LABEL.match(nxt):
                break
            below.append(nxt)
        if not below:
            continue
        label = line.rstrip()
        for statement in (f"{label} {below[0]}", f"{label} {' '.join(below)}"):
            if find_statement(statement):
                return "prose_credential"
    return None


def find_in_layout(text: str) -> str | None:
    """``"structured_credential"`` / ``"prose_credential"`` when a layout holds a secret, else None."""
    if "WIFI:" in text:
        for match in _WIFI_QR.finditer(text):
            if _secret_cell(match.group("val")):
                return "structured_credential"
    if "(" in text:
        for match in _CALL_PAIR.finditer(text):
            if _secret_cell(match.group("val")):
                return "structured_credential"
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2:
        return None
    if _table_secret(lines):
        return "structured_credential"
    return _label_values(lines)
