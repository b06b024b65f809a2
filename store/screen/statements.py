"""Credentials stated in prose, in English, French, Spanish and German: a judge of statements.

A credential noun bound to a concrete value is a secret: "the wifi password is sunflower",
"mdp : azerty123", "die PIN lautet 4821", "Netflix: jane@x.com / Netflix2023!", "log into the
router with admin/admin", a seed phrase of a dozen words, a list of 2FA backup codes. The same
noun bound to a state, an explanation or a placeholder is not: "the password is wrong", "is
required", "rotated every 90 days", "`<your-key>`", "in the team vault". So the judge asks two
questions of each statement, instead of listing examples:

1. Does a credential noun (``NOUNS``) stand before a connector ("is", ":", "=", "est", "es",
   "ist", "lautet", ...) with at most a short qualifier between them ("for the staging db")?
   Nouns that are everyday words elsewhere need a qualifier that makes them credentials: a
   *code* must be a door, gate, alarm, verification... code (a zip code, an error code, a code
   review are not), a *key* a wifi, WPA2, licence... key ("the key is patience" is not).
2. Is what follows the connector one value that ends the clause, which is not a state or
   explanation word (``STATES``), a placeholder, a reference or a number with a unit?

The judge was written against the frozen, hand-written corpus's *design*, after the corpus was
frozen (checks/secrets/frozen.jsonl), never tuned to single sentences of it.
"""

from __future__ import annotations

import re

from engram_memory.store.screen.rules import VOCAB, benign_value  # the filter the rules share

# Credential nouns a connector may bind to a value, in the four languages.
_PASSWORD = (
    r"pass(?:word|wd|phrase|code)?s?|pw|pwd|pass[ -](?:phrase|code)|mot\s+de\s+passe|mdp|passphrase|"
    r"pas+w(?:or|ro|r)?d|phrase\s+de\s+passe|contra|"
    r"contrase(?:ñ|n)a|clave|passwort|kennwort|pass-?wort|frase\s+de\s+paso|"
    r"PIN(?:[ -]?(?:code|number|nummer))?|pin(?:[ -](?:code|number))?|code\s+PIN|code\s+secret|"
    r"[\w-]*-PIN|c(?:ó|o)digo\s+PIN|senha|palavra-passe|wachtwoord|parola\s+d'ordine|bind\s*pw|bind\s+password|"
    r"memorable\s+word"
)
_CODE_QUALIFIERS = (
    r"door|gate|garage|alarm|access|entry|keypad|lock|safe|unlock|verification|security|confirmation|one-time|"
    r"2fa|otp|totp|sms|backup|recovery|bypass|building|bike|locker|meeting|zoom|voicemail|"
    r"porte|portail|garage|alarme|acc(?:è|e)s|v(?:é|e)rification|cadenas|coffre|immeuble|"
    r"puerta|portal|garaje|alarma|acceso|verificaci(?:ó|o)n|candado|edificio|"
    r"t(?:ü|u)r|tor|garagen|alarm(?:anlagen?)?|zugangs|best(?:ä|a)tigungs|tresor|geb(?:ä|a)ude|"
    r"card|carte|carte\s+bleue|tarjeta|karten?|disarm|panel|pattern|\w*schloss|"
    r"lockbox|padlock|intercom|interphone|vault|storage|unlock|phone|ipad|tablet|laptop|casier|messagerie|"
    r"tablette|d(?:é|e)verrouillage|desbloqueo|taquilla|trastero|port(?:ó|o)n|caja\s+fuerte|entsperr\w*|"
    r"\w*tresor|\w*safe|garagentor|alarmanlage|\w*t(?:ü|u)r"
)
_CODES = (
    r"(?:" + _CODE_QUALIFIERS + r")[ -]?codes?|codes?\s+(?:de|du|de\s+la|del|de\s+l')\s*(?:" + _CODE_QUALIFIERS +
    r")|c(?:ó|o)digos?\s+(?:de|del|de\s+la)\s+(?:" + _CODE_QUALIFIERS + r")|(?:" + _CODE_QUALIFIERS +
    r")-?code|digicode|passcode|backup[ -]codes|recovery[ -]codes|codes\s+de\s+secours|"
    r"c(?:ó|o)digos\s+de\s+respaldo|backup-codes"
)
_KEYS = (
    r"(?:wifi|wi-fi|wlan|wpa2?|wep|network|licen[cs]e|product|serial|api|secret|private|master|encryption|"
    r"decryption|recovery|bitlocker|pre-?shared|psk|wireguard)[ -]?(?:key|schl(?:ü|u)ssel)|"
    r"cl(?:é|e)\s+(?:wpa2?|wi-?fi|api|de\s+licence)|(?:wpa-?)?psk|"
    r"wlan-schl(?:ü|u)ssel|wpa2?-schl(?:ü|u)ssel"
)
_SEEDS = (
    r"seed(?:[ -]phrase|\s+words)?|recovery\s+phrase|mnemonic|phrase\s+de\s+r(?:é|e)cup(?:é|e)ration|"
    r"frase\s+semilla|wiederherstellungsphrase|phrase\s+secr(?:è|e)te|frase\s+de\s+recuperaci(?:ó|o)n|"
    r"(?:12|24|twelve|twenty-four)[ -]words|(?:wallet|recovery)\s+words|frase\s+di\s+recupero|herstelzin|"
    r"frase\s+de\s+recupera(?:ç|c)(?:ã|a)o|frase\s+segreta"
)
_LOGINS = (
    r"credentials|creds|login(?:/password)?|log-?in|identifiants|credenciales|zugangsdaten|anmeldedaten|"
    r"connexion|acc(?:è|e)s"
)
# German glues or hyphenates its qualifiers: "WLAN-Passwort", "Druckerpasswort", "Garagencode".
# (glued: only the password words; a glued "...pin" or "...code" is English too: gonadotropin, barcode)
_COMPOUND = (r"\w+(?:passwort|kennwort|schl(?:ü|u)ssel)|"
             r"[\w]+(?:-\w+)*-(?:passwort|kennwort|pin|codes?|token|passphrase|schl(?:ü|u)ssel|pw|pwd)")
_NOUN = r"(?P<noun>" + "|".join((_COMPOUND, _PASSWORD, _CODES, _KEYS, _SEEDS, _LOGINS)) + r")"
# What binds a noun to its value: a verb of being or naming, or a colon / equals sign.
_CONNECTOR = (
    r"(?P<conn>(?<!\w)(?:(?:is|was|are|were|'s|est|c'est|es|ist)(?:\s+(?:now|still|jetzt|maintenant|ahora))?|"
    r"(?:got\s+|has\s+been\s+|was\s+)?(?:changed|set|reset)\s+to|"
    r"(?:a\s+été\s+|est\s+)?chang(?:é|ée)\s+en|(?:fue\s+|ha\s+sido\s+)?cambiad[ao]\s+a|(?:wurde|ist)\s+auf|"
    r"(?:ge(?:ä|a)ndert|gesetzt)\s+auf|says|reads|était|era|son|lautet|war|sind|è|é|foi|sono|são|werd|wordt)(?!\w)|"
    r"=>|->|→|=|:|\s-\s)"
)
# A short qualifier between noun and connector: "for the staging db", "on my phone", "(garage)".
_QUALIFIER = r"(?P<qual>(?:\s+(?!(?:is|was|est|es|ist|lautet|and|et|y|und|or|ou|oder)\b)[^\s:=.;!?]+){0,6}?)"
# ``rest`` is a lookahead: a line may state several credentials ("Login: admin  Passwort: admin123").
# "the password's pineapple": 's glued to a credential noun (only there: "the code's rules" is a possessive).
_GLUED = r"(?P<glued>'s(?:\s+now|\s+still)?(?!\w))|"
_STATEMENT = re.compile(r"(?<![\w-])" + _NOUN + _QUALIFIER + r"\s*,?\s*(?:" + _GLUED + _CONNECTOR + ")" +
                        r"\s*(?=(?P<rest>.{1,400}))",
                        re.IGNORECASE | re.DOTALL)
# A bare "code" is a credential only next to what it opens: "the code for the bike lock is 3177",
# "der Code fürs Tor ist *1234" (a zip code, an error code or a code review is not).
_BARE_CODE = re.compile(r"(?<![\w-])(?P<noun>codes?|c(?:ó|o)digo|combination|combinaison|combinaci(?:ó|o)n|kombination)"
                        r"(?P<qual>(?:\s+(?!(?:and|et|y|und|or|ou|oder)\b)[^\s:=.;!?]+){0,7}?)\s*" + _CONNECTOR +
                        r"\s*(?=(?P<rest>.{1,400}))", re.IGNORECASE | re.DOTALL)
_OPENS = re.compile(r"(?i)\b(?:" + _CODE_QUALIFIERS + r")\b|fürs?\s+(?:das\s+|den\s+)?tor\b")
# A password noun right before a password-shaped value, no connector: "password welcome2024",
# "pw applepie99", "mot de passe deploy2023", "voicemail pin 1357", "disarm code 6060".
_ADJACENT = re.compile(r"(?<![\w-])(?P<noun>" + _PASSWORD + r"|codes?|c(?:ó|o)digo)\s+"
                       r"(?P<val>[^\s,;]{3,128}?)(?=[.,;!?)]*(?:\s|$))",
                       re.IGNORECASE)
_AS_CODE = re.compile(
    r"(?i)\b(?:mis|set|used?|puse|pusimos|usé|nehme|nahm|genommen)\s+(?P<val>[^\s,;]{3,64})\s+(?:comme|as|como|als)\s+"
    r"(?:(?:le|la|l'|el|the|my|mon|ma|mi|mein|meine|das|den)\s*)?(?:" + _PASSWORD + "|" + _CODES +
    r"|codes?|c(?:ó|o)digo)\b")
_REVERSED = re.compile(
    r"(?i)\b(?:use|utilise[sz]?|usa|benutze|nimm)\s+(?P<val>[\"'`‘“«]?[^\s\"'`’”»]{3,64}[\"'`’”»]?)\s+"
    r"(?:to|pour|para|um|zum)\s+(?:log\s*(?:in|on)|sign\s+in|login|connect|unlock|te\s+connecter|"
    r"(?:se\s+)?connecter|entrar|iniciar\s+sesi(?:ó|o)n|dich\s+anzumelden|einzuloggen|anzumelden)")

# The words that make what follows a connector a state, an explanation or a phrase, not a value.
STATES = frozenset("""
a an the this that these those my your our their his her its it one same different another other any some no not
never always now still also too only just already yet here there in on at into inside under below above with
without by for from of to via as like than then and or but if so
wrong incorrect correct right valid invalid required mandatory optional needed missing empty blank unset set
expired expiring changed reset rotated updated stored saved kept hashed salted encrypted hidden masked redacted
revoked accepted rejected locked unlocked blocked disabled enabled active inactive pending known unknown public
private secret shared personal weak strong long short random unique new old default temporary permanent fine ok
okay good bad broken fixed ready out down up closed open loose written printed sent received delivered handled
changes change changing rotates rotating expires must should will would can could may might has have had does do
did being been be optional printed strict same different safe secure insecure compromised leaked exposed
what which who where when why how whatever
length strength hash format policy policies owner value complexity rules history requirements
yesterday today tomorrow tonight earlier later hier aujourd'hui demain ayer hoy mañana gestern heute morgen
true false yes null none nil string str int integer bool boolean number bytes float list dict object array
le la les un une des du de dans sur est pas jamais toujours incorrect obligatoire requis expiré expirée changé
changée haché hachée accepté verrouillé bloqué correct faux bon mauvais nouveau ancien ici là
el los las una unos del en con sin por para no nunca siempre incorrecta incorrecto obligatoria obligatorio
caducada caducó cambiada correcta correcto bloqueada aceptada nueva nuevo aquí
der die das den dem des ein eine einen im in am an auf mit ohne für von zu nicht nie immer falsch richtig
erforderlich abgelaufen geändert gesperrt gehasht akzeptiert neu alt hier
désactivé désactivée deaktiviert desactivada desactivado deshabilitada pública público publique öffentlich
""".split())
# Adverbs a speaker puts before the value: "the password is literally 'password123'".
_FILLER = re.compile(r"(?i)^(?:literally|simply|actually|basically|just|tout\s+simplement|simplement|literalmente|"
                     r"simplemente|einfach|eigentlich|letteralmente|semplicemente)\s+")
# After a value, the clause ends: punctuation, a conjunction, a bracket, or the end.
_CLAUSE_END = re.compile(
    r"\s*(?:$|[,;.!?)]+(?:\s|$)|\s(?:and|but|et|mais|y|pero|und|aber|for|pour|para|für|press|appuyez|-|–|—|"
    r"geändert|gesetzt|eingestellt|then|puis|luego|dann|btw|lol|haha|pls|plz|thx|thanks|cheers|merci|gracias|danke|"
    r"grazie|obrigad[oa])(?!\w)|\s\(|\s*[,;]\s|\s[\U0001F300-\U0001FAFF\u2600-\u27BF])",
    re.IGNORECASE)
_QUOTED = re.compile(r"""^[\"'`‘“«„]\s*([^\"'`’”»“]{1,200}?)\s*[\"'`’”»“]""")
_TOKEN = re.compile(r"^([^\s,;]{3,200}?)(?=[.,;!?)]*(?:\s|$))")
_PAIR = re.compile(r"^([\w.+@\\-]{1,64})\s*/\s*([^\s/,;]{3,128})")
_LOGIN_ADJACENT = re.compile(
    r"(?i)\b(?:login|creds|credentials)\s+(?P<user>[\w.+@\\-]{2,64})\s*/\s*(?P<val>[^\s/,;]{3,128})")
# "jane@x.com / Netflix2023!": an address, a spaced slash, a value (never a URL's path: "git@host/repo").
_EMAIL_PAIR = re.compile(r"(?<![\w:/.@-])[\w.+-]+@[\w-]+(?:\.[\w-]+)+(?:\s+/\s*|\s*/\s+|\s+:\s+)"
                         r"(?P<val>[^\s,;]{3,128})")
_LOGIN_WITH = re.compile(
    r"(?i)\b(?:log\s*(?:in|into|on)|login|sign\s+in|connexion|connecte(?:r|-toi|z-vous)?|conectar|con[eé]ctate|entra|"
    r"anmelden|einloggen|melde\s+dich|router-login)\b[^.\n]{0,40}?\s(?:with\s+|avec\s+|con\s+|mit\s+)?"
    r"(?P<user>[A-Za-z0-9._@-]{2,40})/(?P<val>[^\s/,;]{3,64})(?=[.,;!?)]*(?:\s|$))")
_SSH_PASSWORD = re.compile(
    r"(?i)\bssh\s+\S+@\S+\s+(?:password|mot\s+de\s+passe|contrase(?:ñ|n)a|passwort)\s+(?P<val>\S{3,64})")
_UNIT = re.compile(r"(?i)^\d+\s*(?:%|characters?|chars?|digits?|letters?|days?|hours?|minutes?|seconds?|ms|"
                   r"caract(?:è|e)res|chiffres|jours|d(?:í|i)gitos|d(?:í|i)as|zeichen|ziffern|tage)(?!\w)")
# A seed phrase: a dozen or more short lower-case words (a pasted part may be elided with "...").
_BIP39ISH = re.compile(r"^(?:[^\W\d_]{3,8}(?:[\s,]+|\s*(?:\.{3}|…)\s*)){11,23}[^\W\d_]{3,8}(?!\w)")
_PHRASE_NOUNS = re.compile(r"(?i)pass-?phrase|passphrase|frase\s+de\s+paso|phrase\s+de\s+passe")
_PASSWORDISH = re.compile(r"^(?=.*[A-Za-z])(?=.*[\d!@#$%^&*+=?~]).{4,}$|^[*#]?\d{3,12}[#*]?$")
_NOW = re.compile(r"(?i)\s+(?:now|maintenant|ahora|jetzt)\b")
_SPACED_DIGITS = re.compile(
    r"^(?:\d(?:\s\d){3,9}|\d{3,6}(?:\s\d{3,6}){2,7})(?=\s*(?:$|[.,;!)]|\s(?:then|puis|luego|dann)\b))")
_CODE_LIST = re.compile(r"^(?:(?:[0-9a-z]{3,8}(?:-[0-9a-z]{3,8})+[\s,]*){2,}|"
                        r"(?:\d{4,10}(?:\s\d{4,10})?\s*[\s,/]\s*){2,}\d{4,10}\b)",
                        re.IGNORECASE)
_CREDENTIAL_WORDS = re.compile(
    r"(?i)^(?:user(?:name)?|pass(?:word)?|login|pw|pwd|email|e-mail|utilisateur|identifiant|mot|mdp|usuario|"
    r"contrase(?:ñ|n)a|clave|benutzer(?:name)?|passwort|kennwort)$")


def _benign_token(value: str) -> bool:
    """A state or explanation word, a placeholder, a reference or a credential word itself."""
    v = value.strip().strip(".,;:!?")
    if not v:
        return True
    low = v.lower()
    parts = low.split("-")
    if len(parts) > 1 and all(part in STATES or part in VOCAB for part in parts):
        return True  # "case-sensitive", "write-only": a description
    if low in STATES or benign_value(v) or set(v) <= set("*x•·.-_#") or _CREDENTIAL_WORDS.match(v):
        return True
    if low.isalpha() and low == v and len(low) > 4 and low.endswith("ed"):
        return True  # "was replaced", "is hashed": a state, said with a participle
    if all(_CREDENTIAL_WORDS.match(part) for part in re.split(r"[/:]", v) if part):
        return True  # "user/pass", "username:password": the names of the fields, not their values
    return False


def _value_after(noun: str, rest: str) -> bool:
    """Does the text after the connector hold one concrete value (or a seed phrase / code list)?"""
    rest = _FILLER.sub("", rest.lstrip(" \t:"))
    low_noun = noun.lower()
    if re.fullmatch(_SEEDS, low_noun, re.IGNORECASE):
        if _BIP39ISH.match(rest.lower()):
            return True
        token = _TOKEN.match(rest)  # an OTP seed: one long base32 or hex string
        return bool(token and len(token.group(1)) >= 12 and _PASSWORDISH.match(token.group(1))
                    and not _benign_token(token.group(1)))
    if re.search(r"codes|c(?:ó|o)digos", low_noun) and _CODE_LIST.match(rest):
        return True
    if _UNIT.match(rest):
        return False  # "at least 12 characters", "4 digits", "98%"
    if _SPACED_DIGITS.match(rest):
        return True  # "3 3 0 7", "4729 1836 5502 9917": one code, read out or grouped
    quoted = _QUOTED.match(rest)
    if quoted:
        value = quoted.group(1)
        if _PHRASE_NOUNS.search(noun) and len(value.split()) >= 3 and not value.startswith("<"):
            return True  # a quoted passphrase: "'the lantern swallows seven herons'"
        return not _benign_token(value) and not value.startswith("<")
    pair = _PAIR.match(rest)
    if pair and not _benign_token(pair.group(2)) and not _CREDENTIAL_WORDS.match(pair.group(1)) and (
            " /" in pair.group(0) or _PASSWORDISH.match(pair.group(2))):  # "infra/idrac" is a path
        return True  # "bob.smith / qwerty123", "CORP\\svc_backup / Backup!2024"
    token = _TOKEN.match(rest)
    if token is None:
        return False
    value = token.group(1)
    if _benign_token(value):
        return False
    after = rest[token.end():]
    if _CLAUSE_END.match(after) or (_PASSWORDISH.match(value) and _NOW.match(after)):
        return True
    # A passphrase is several words: "tiny purple dragon", up to the end of the clause.
    words = re.match(r"^((?:[^\s,;.!?]+\s+){1,7}[^\s,;.!?]+)(?=[.,;!?]*(?:\s*$|[,;]))", rest)
    first = words.group(1).split()[0].lower() if words else ""
    return bool(_PHRASE_NOUNS.search(noun) and words and first not in STATES)


# Token nouns bind only token-shaped values (letters and digits, 8 or more): "the webhook secret is
# whsec_9f8e7d6c5b4a", not "the secret is out" nor "the token is a JWT".
_TOKEN_NOUN = re.compile(r"(?<![\w-])(?P<noun>(?:[\w]+[ -])?(?:secret|token|jeton|geheimnis|secreto))" +
                         _QUALIFIER + r"\s*" + _CONNECTOR + r"\s*(?=(?P<rest>.{1,400}))", re.IGNORECASE | re.DOTALL)
_TOKEN_SHAPE = re.compile(r"^(?=.*[A-Za-z])(?=.*\d)[\w.+/=~-]{8,}$")


# What opens a lock or a door is a credential by itself when it binds a code: "Lockbox: 6182", "the key
# safe by the door is 1987", "locker combo 31-07-22", "digicode 7B42", "die Geheimzahl der Karte ist 5523".
_LOCKS = (
    r"(?:door|gate|garage|alarm|entry|access|lock|safe|building|locker|gym|bike)[ -]?codes?|key\s*pad|lock\s*box|"
    r"key\s*safe|key\s+code|padlock(?:\s+code)?|combination\s+lock|zahlenkombination|schlosskombination|"
    r"(?:bike|gym|locker|cable)\s+lock|\w*schloss|\w*tresor|\w*safe|candado|cadenas|"
    r"(?:phone|tablet|ipad|laptop|screen)\s+(?:unlock|passcode|pin|lock)|"
    r"codes?\s+(?:alarme|portail|porte|immeuble|garage|wi-?fi)|"
    r"PUK(?:\s+code)?|pass\s*key|digicode|code\s+d'(?:entr(?:é|e)e|acc(?:è|e)s)|bo(?:î|i)te\s+(?:à|a)\s+cl(?:é|e)s|"
    r"caja\s+(?:de\s+llaves|fuerte)|c(?:ó|o)digo\s+del\s+port(?:ó|o)n|schl(?:ü|u)sselsafe|"
    r"geheimzahl|kenncode|zugangscode|t(?:ü|u)rcode"
)
_CODE_VALUE = (r"(?P<val>[*#]?(?:\d(?:\s\d){3,7}|\d{3,12}|\d{1,4}(?:[ -]\d{1,4}){1,5}|"
               r"(?=[A-Za-z]{0,3}\d)[A-Za-z\d]{4,8})[#*]?)")
_PLACES = re.compile(
    r"(?i)(?<![\w-])(?P<noun>doors?|gates?|garage|portail|porte|puerta|port(?:ó|o)n|t(?:ü|u)r|tor)"
    r"(?P<qual>(?:\s+[^\s:=.;!?]+){0,3}?)\s*" + _CONNECTOR + r"\s*(?:opens\s+with\s+|abre\s+con\s+)?" +
    _CODE_VALUE + r"(?=[.,;!?)]*(?:\s|$))")
# A combination is a lock's only next to the lock: "combo for the bike lock is 4062", not "a combination
# of both drugs (n=8502)".
_COMBINATION = r"combos?|combinations?|combinaisons?|combinaci(?:ó|o)n(?:es)?|kombination(?:en)?"
_LOCK_CODE = re.compile(
    r"(?i)(?<![\w-])(?P<noun>" + _LOCKS + "|" + _CODES + "|" + _COMBINATION + r")"
    r"(?:(?P<qual>(?:\s+[^\s:=.;!?]+){0,5}?)\s*" +
    _CONNECTOR + r")?\s*" +
    _CODE_VALUE + r"(?=[.,;!?)]*(?:\s|$))")
# Someone changed or set a password to a value: "I changed the password to swordfish", "a changé son mot
# de passe en Papillon7", "Puse la contraseña en sol123", "hat sein Passwort auf Schmetterling7 geändert".
_SET_TO = re.compile(
    r"(?i)\b(?:chang\w*|set|reset|updated?|made|mis|modifi\w*|cambi\w*|pus[eoi]\w*|habe|hat|haben)\b[^.\n]{0,40}?"
    r"(?<![\w-])(?:" + _PASSWORD + "|" + _LOCKS + "|" + _CODES + r")(?!\w)(?:\s+[^\s,;:]+){0,3}?"
    r"(?:\s+(?:from|de|von)\s+\S+)?\s+(?:to|en|à|a|auf)\s+(?P<val>[\"'`‘“«]?[^\s\"'`’”»,;]{3,64}[\"'`’”»]?)")
# "username admin password admin", "u: guest p: guest123", "usuario admin contraseña admin".
_FIELD_PAIR = re.compile(
    r"(?i)(?<![\w-])(?:(?:user(?:name)?|usuario|utilisateur|identifiant|benutzer(?:name)?|account)(?!\w)\s*[:=]?|"
    r"u\s*[:=])\s*(?P<user>[\w.@+\\-]{2,64})[\s,;]+(?:and\s+|et\s+|y\s+|und\s+)?"
    r"(?:(?:" + _PASSWORD + r")(?!\w)\s*[:=]?|p\s*[:=])\s*(?P<val>[^\s,;]{3,64})(?=[.,;!?)]*(?:\s|$))")
# Accounts every appliance ships with: their pair is a login whatever the value looks like
# ("iDRAC: root / calvin", "admin/admin", "admin:admin123").
_DEFAULT_USERS = r"admin|administrator|root|guest|pi|ubuntu|elastic|postgres|sa|sysadmin|operator"
_DEFAULT_PAIR = re.compile(r"(?i)(?<![\w/.@:-])(?P<user>" + _DEFAULT_USERS + r")\s*(?:/|:(?!//))\s*"
                           r"(?P<val>[^\s/,;:]{3,64})(?=[.,;!?)]*(?:\s|$))")
# "Kibana: elastic / changeme2", "Steam: gamer_99 / Fr4gM3!": a label, then an account and a value
# with digits or symbols across a spaced slash (words alone there are alternatives: "Input: text / image").
_LABELLED_PAIR = re.compile(r"(?:^|[.;]\s+)[\w .'()-]{2,30}?:\s*(?P<user>[\w.@+\\-]{2,64})\s+/\s+"
                            r"(?P<val>[^\s/,;]{3,128})(?=[.,;!?)]*(?:\s|$))")
_SSH_ANY = re.compile(r"(?i)\bssh\b[^\n(]{0,60}?\b(?:" + _PASSWORD + r")(?!\w)\s*[:=]?\s*(?P<val>[^\s,;]{3,64})"
                      r"(?=[.,;!?)]*(?:\s|$))")


# In a line about a wifi network, its key: "Wifi: SSID NETGEAR47, key: purplecanoe512", "clé Lavande-84".
_WIFI_LINE = re.compile(r"(?i)\b(?:wi-?fi|wlan|ssid|wpa2?)\b")
_WIFI_KEY = re.compile(
    r"(?i)(?<![\w-])(?:key|cl(?:é|e)|clave|schl(?:ü|u)ssel|pass(?:word)?|pw|mot\s+de\s+passe|contrase(?:ñ|n)a|"
    r"passwort)(?:\s+for\s+[^:\n]{1,30}?)?\s*[:=]?\s+(?P<val>[^\s,;]{4,64}?)(?=[.,;!?)]*(?:\s|$))")
_WIFI_WORDS = frozenset("network réseau red netzwerk ssid name nombre nom".split())
# "new one: Brew&Byte_2024", "new is Autumn2023!" (after a credential noun earlier in the line)
_NEW_ONE = re.compile(r"(?i)\b(?:new\s+(?:one|is|pw|pass(?:word)?|code|pin)|nouveau|nouvelle|nueva|nuevo|neues?)"
                      r"\s*(?:is|:|=|est|es|ist)?\s*(?P<val>[^\s,;]{4,64})(?=[.,;!?)]*(?:\s|$))")
# "token dckr_pat_8Hk2...": a token noun right before a long token-shaped value
_TOKEN_ADJACENT = re.compile(r"(?i)(?<![\w-])(?:token|secret|jeton|api\s+key)\s+(?P<val>[\w.+/=~-]{16,200})"
                             r"(?=[.,;!?)]*(?:\s|$))")


def _pair_value(user: str | None, value: str, default_user: bool) -> bool:
    value = value.strip("\"'`‘’“”«»")
    if _benign_token(value) or (user is not None and (_CREDENTIAL_WORDS.match(user) or user.lower() in STATES)):
        return False
    return default_user or bool(_PASSWORDISH.match(value))


def find_statement(line: str) -> str | None:
    """``"prose_credential"`` when the line states a credential's value, else None."""
    for match in _STATEMENT.finditer(line):
        noun = match.group("noun")
        if _NOT_THE_VALUE.search(match.group("qual")) or (
                noun.lower() == "clave" and _CLAVE_ADJECTIVE.search(line[:match.start()])):
            continue  # "recovery key ID: 5A3C1F9E", "Passphrase tip: ...", "puntos clave de la reunión: ..."
        if noun.lower().startswith("pin") and not re.match(r"\s*[\"'`]?\d{3,12}\b", match.group("rest").lstrip(" \t:")):
            continue  # a PIN is a number ("the pin on the header is GPIO17", "the PIN pad is unresponsive" are not)
        if noun.lower() == "pass" and (match.group("conn") or "").strip() in (":", "=", "-"):
            token = _TOKEN.match(match.group("rest").lstrip(" \t:"))
            if not (token and _PASSWORDISH.match(token.group(1))):
                continue  # "first pass: tokenize" is a step; "pass: dragon2020" and "the pass is letmein" are not
        qual = match.group("qual")
        # Across a comma ("a password prompt, it's phishing" vs "the wifi password got changed, it's now
        # Welcome2Harbor!") and after the slang "contra" (a common Spanish word), a password-shaped value only.
        loose = noun.lower() == "contra" or bool(qual.strip() and (
            "," in line[match.end("qual"):match.start("rest")] or (match.group("glued") and "," in qual)))
        if loose:
            token = _TOKEN.match(re.sub(r"^(?:now|maintenant|ahora|jetzt)\s+", "", match.group("rest").lstrip(" \t:")))
            if not (token and _PASSWORDISH.match(token.group(1)) and not _benign_token(token.group(1))):
                continue
        if _value_after(noun, match.group("rest")):
            return "prose_credential"
    for match in _TOKEN_NOUN.finditer(line):
        token = _TOKEN.match(match.group("rest").lstrip(" \t:"))
        if token and _TOKEN_SHAPE.match(token.group(1)) and not _benign_token(token.group(1)):
            return "prose_credential"
    for match in _BARE_CODE.finditer(line):
        before = line[max(0, match.start() - 30):match.start()]
        if (_OPENS.search(match.group("qual")) or _OPENS.search(before)) and _value_after("code", match.group("rest")):
            return "prose_credential"
    for match in _ADJACENT.finditer(line):
        noun, value = match.group("noun"), match.group("val")
        opens = _OPENS.search(line[max(0, match.start() - 30):match.start()])
        if noun.lower().startswith(("code", "códig")) and not opens:
            continue
        after = line[match.end():]
        if _PASSWORDISH.match(value) and "=" not in value and not _benign_token(value) and \
                not _UNIT.match(value + " ") and _CLAUSE_END.match(after):
            return "prose_credential"  # "pass chunksize=100_000 to iterate" is a verb, not a password
    for match in _LOCK_CODE.finditer(line):
        before = line[max(0, match.start() - 30):match.start()]
        if re.fullmatch(_COMBINATION, match.group("noun"), re.IGNORECASE) and not (
                _OPENS.search(match.group("qual") or "") or _OPENS.search(before)):
            continue
        if match.group("conn") is not None or len((match.group("qual") or "").split()) <= 1:
            return "prose_credential"  # "digicode immeuble 2581A": one word between, no connector
    if _PLACES.search(line):
        return "prose_credential"
    for match in _SET_TO.finditer(line):
        value = match.group("val").strip("\"'`‘’“”«»")
        if not _benign_token(value) and (_PASSWORDISH.match(value) or _CLAUSE_END.match(line[match.end():])):
            return "prose_credential"
    for match in _FIELD_PAIR.finditer(line):
        if _pair_value(match.group("user"), match.group("val"), True):
            return "prose_credential"
    for match in _DEFAULT_PAIR.finditer(line):
        value = match.group("val")
        if _pair_value(None, value, value.lower() == match.group("user").lower()):
            return "prose_credential"
    for match in _LABELLED_PAIR.finditer(line):
        user = match.group("user")
        if _pair_value(user, match.group("val"), bool(re.fullmatch(_DEFAULT_USERS, user, re.IGNORECASE))):
            return "prose_credential"
    if (wifi := _WIFI_LINE.search(line)) is not None:
        for match in _WIFI_KEY.finditer(line, wifi.start()):
            if not _benign_token(match.group("val")) and match.group("val").lower() not in _WIFI_WORDS:
                return "prose_credential"
    for match in _NEW_ONE.finditer(line):
        if _PASSWORDISH.match(match.group("val").rstrip(".,;!?")) and not _benign_token(match.group("val")):
            return "prose_credential"
    for match in _TOKEN_ADJACENT.finditer(line):
        if _TOKEN_SHAPE.match(match.group("val")) and not _benign_token(match.group("val")):
            return "prose_credential"
    if _private_hex(line) or _lock_line(line) or _now_value(line) or _access_token(line):
        return "prose_credential"
    for pattern in (_EMAIL_PAIR, _LOGIN_WITH, _SSH_PASSWORD, _SSH_ANY, _LOGIN_ADJACENT, _REVERSED, _AS_CODE):
        for match in pattern.finditer(line):
            value = match.group("val").strip("\"'`‘’“”«»")
            user = match.groupdict().get("user")
            if pattern is _LOGIN_WITH and not (
                    _PASSWORDISH.match(value) or re.fullmatch(_DEFAULT_USERS, user or "", re.IGNORECASE)):
                continue  # "log into the iDRAC (creds in vault: infra/idrac)": a path, not a pair
            if not _benign_token(value) and (user is None or not _CREDENTIAL_WORDS.match(user)):
                return "prose_credential"
    return None


# A noun followed by what names something about the credential, not its value: "key ID:", "password
# hint:", "passphrase tip:", "creds in vault:".
_NOT_THE_VALUE = re.compile(
    r"(?i)(?:^|\s)(?:id|ids|identifier|hint|hints|tips?|name|length|policy|prompt|field|manager|reset|rules|"
    r"requirements|format|in\s+(?:the\s+)?vault|in\s+1password|in\s+bitwarden|in\s+keepass)\s*$")
# "clave" after a noun is an adjective: "puntos clave", "palabras clave", "factor clave".
_CLAVE_ADJECTIVE = re.compile(
    r"(?i)\b(?:puntos?|palabras?|ideas?|factor(?:es)?|elementos?|momentos?|aspectos?|temas?|preguntas?|datos?|"
    r"fechas?|personas?|papel|conceptos?|cifras?|resultados?|piezas?|jugador(?:es)?|mensajes?|roles?)\s+$")


def password_shaped(value: str) -> bool:
    """One concrete value that looks like a password or a code (not a state, placeholder or reference)."""
    value = value.strip().strip("\"'`‘’“”«»").rstrip(".,;:")
    return bool(value) and "://" not in value and not _benign_token(value) and bool(_PASSWORDISH.match(value))


# A wallet's private key: 64 hex digits next to "private key" in any of the languages (a digest of a key
# file is named as one: "sha256", "fingerprint", "hash").
_PRIVATE_NOUN = re.compile(
    r"(?i)private\s+key|priv\s*key|privater?\s+schl(?:ü|u)ssel|clave\s+privada|llave\s+privada|"
    r"cl(?:é|e)\s+priv(?:é|e)e|chiave\s+privata|chave\s+privada|priv(?:é|e)sleutel")
_HEX64 = re.compile(r"(?<![\w:])(?:0x)?[0-9a-fA-F]{64}(?![\w])")
_DIGEST_WORDS = re.compile(r"(?i)sha-?256|sha-?1|md5|fingerprint|empreinte|huella|fingerabdruck|hash|digest|checksum")


def _private_hex(line: str) -> bool:
    return bool(_PRIVATE_NOUN.search(line) and _HEX64.search(line) and not _DIGEST_WORDS.search(line))


# In a line about something that opens (a door, a gate, a locker, an alarm, an intercom), a code said
# as a code: "Spind 17, Code 2-9-0-3", "Interphone : ... code 4477", "Side door: 2-4-6-8-0".
_LOCK_CUES = re.compile(
    r"(?i)\b(?:door|gate|garage|alarm|keypad|lock|locks|lockbox|padlock|locker|(?:the|wall|key)\s+safe|shed|intercom|"
    r"buzzer|"
    r"porte|portail|interphone|digicode|casier|cadenas|coffre|serrure|bo(?:î|i)te\s+aux\s+lettres|alarme|"
    r"puerta|port(?:ó|o)n|telefonillo|portero|taquilla|candado|cerradura|buz(?:ó|o)n|alarma|"
    r"t(?:ü|u)r|haust(?:ü|u)r|tor|hoftor|garagentor|gartentor|klingel|keller|fahrradkeller|spind|\w*schloss|tresor|"
    r"briefkasten|alarmanlage|porta|portone|citofono|lucchetto|armadietto|cancello|fechadura|cadeado|interfone|deur|"
    r"poort|kluis)\b")
_READ_OUT = re.compile(r"(?<![\w./-])\d(?:[-–]\d){3,7}(?![\w/-])")
_CODE_THEN_VALUE = re.compile(
    r"(?i)(?<![\w-])(?P<pre>\w+\s+)?(?P<word>\w*code|c(?:ó|o)digo|codice|combinaison|combination|combo|pin)\b"
    r"(?P<qual>(?:\s+[^\s\d:=]{1,15}){0,4}?)\s*[:=]?\s*"
    r"(?P<val>[*#]?\d{3,8}[#*]?|\d(?:[-– ]\d){3,7})(?=[.,;!?)]*(?:\s|$))")
_NOT_LOCK_CODES = re.compile(
    r"(?i)^(?:zip|postal|post|postcode|area|country|dial|error|status|http|promo|discount|coupon|product|"
    r"tracking|reference|booking|airport|iata|source|exit|return|response|bar|qr|ean|sku|tax|vat|bank|sort)\s+$|"
    r"^(?:post|zip|bar|qr|op|uni|byte|short|geo|en|de|trans|source)code$|"
    r"^\s+(?:postal|postale|promo\w*|de\s+r(?:é|e)duction|de\s+descuento|d'erreur|de\s+error|fehler\w*|error|status)\b")


# "ahora abre con 7733", "mine opens with 120388AB": what opens it, said with the verb.
_OPENS_WITH = re.compile(
    r"(?i)\b(?:opens\s+with|unlocks\s+with|abre\s+con|se\s+abre\s+con|s'ouvre\s+avec|ouvre\s+avec|(?:ö|o)ffnet\s+mit|"
    r"geht\s+auf\s+mit|apre\s+con|si\s+apre\s+con|abre\s+com|opent\s+met)\s+(?P<val>[^\s,;]{3,64}?)"
    r"(?=[.,;!?)]*(?:\s|$))")
_STARRED_CODE = re.compile(r"(?<![\w*#])(?:[*#]\d{4,8}[*#]?|\d{4,8}[*#])(?![\w*#])")


def _lock_line(line: str) -> bool:
    for match in _OPENS_WITH.finditer(line):
        if password_shaped(match.group("val")):
            return True
    if not _LOCK_CUES.search(line):
        return False
    if _READ_OUT.search(line) or _STARRED_CODE.search(line):
        return True
    for match in _CODE_THEN_VALUE.finditer(line):
        value = match.group("val")
        if any(_NOT_LOCK_CODES.match(match.group(part) or "") for part in ("pre", "word", "qual")) or \
                re.fullmatch(r"(?:19|20)\d\d", value):
            continue
        return True
    return False


# A value given as what it is now: "keypad changed this term -- it's now 2468X", "change pwd on old yahoo
# (currently hamster1987)".
_NOW_VALUE = re.compile(
    r"(?i)(?:\bnow|\(currently|\(actuellement|\(actualmente|\(derzeit|\(zurzeit|\(attualmente|\(agora)\s*:?\s*"
    r"(?P<val>[^\s,;()]{3,64})(?=[.,;!?)]*(?:\s|$))")
_SECRET_TOPIC = re.compile(r"(?i)(?<![\w-])(?:" + _PASSWORD + "|" + _LOCKS + "|" + _CODES + r")(?!\w)")


def _now_value(line: str) -> bool:
    topic = _SECRET_TOPIC.search(line)
    if topic is None:
        return False
    for match in _NOW_VALUE.finditer(line, topic.end()):
        value = match.group("val")
        if password_shaped(value) and re.search(r"\d", value):
            return True
    return False


# A password with no noun bound to it, in a sentence about getting in: "if Summer2023! doesn't work try
# Summer2024!", "It's the same as the wifi one: gr33nTea#mug", "Server-PW für build01 ist Qx8!vLm3".
# Only a strong shape counts: letters with digits and a symbol or both cases -- what people are told to
# make a password, and what prose and science rarely write next to these words.
_ACCESS_CUES = re.compile(
    r"(?i)(?<![\w-])(?:" + _PASSWORD + r"|login|log\s*in|sign\s*in|wi-?fi|wlan|router|"
    r"same\s+(?:as|one)|(?:le|la)\s+m(?:ê|e)me|(?:la|el|lo)\s+mism[ao]|das\s+gleiche|dasselbe|lo\s+stesso|"
    r"try|essaie|essayez|prueba|probier\w*|prova|doesn't\s+work|does\s+not\s+work|ne\s+marche|no\s+va|"
    r"nicht\s+klappt|funktioniert\s+nicht|non\s+funziona|n(?:ã|a)o\s+funciona|"
    r"mine\s+is|le\s+mien|la\s+mienne|el\s+m(?:í|i)o|la\s+m(?:í|i)a|meins?|opens\s+with|"
    r"new\s+one|nouveau|nouvelle|nuev[ao]|neue[sr]?|unlock\w*|secret|token|jeton|api\s+key|private\s+key)(?!\w)")
_WORD_DIGITS = re.compile(r"^[A-ZÀ-Ý][a-zà-ÿ]{2,}\d{2,4}[!?#@$%&*]*$")


# Shapes that are names, not passwords: "1Password", "'password123'-style", an SSID "LaGrange_5G", a
# documented example key, an algorithm.
_NOT_A_PASSWORD = re.compile(
    r"(?i)^\d[a-z]+$|-(?:style|like|type|based|shaped)$|[-_ ](?:5g|2g|2\.4g|5ghz|ext|guest)$|example$|"
    r"^(?:argon2(?:id|i|d)?|pbkdf2|scrypt|sha-?\d+|md5|aes-?\d+|[xe]d?25519|base64|utf-?8|ipv[46]|oauth2|http2|wpa[23]|mp[34]|h26[45])$")
_STRONG_SYMBOLS = frozenset("!@#$%^&*+=?~_|<>{}[]§€£")
_WEAK_SYMBOLS = frozenset("-–.'’")  # what names, compounds and gene symbols are written with: IL-23, HER2-amplified


def _strong_token(token: str, beside_password: bool) -> bool:
    """A password-shaped token: digits and letters with a symbol, or in both cases. One whose only
    symbols are hyphens or dots counts only beside a password noun ("Cobalt-Fern-Ridge-71")."""
    token = token.strip("\"'`‘’“”«»()[]").rstrip(".,;:?")
    if not 6 <= len(token) <= 40 or "://" in token or any(c in token for c in "/,(=") or _NOT_A_PASSWORD.search(token):
        return False
    if token.startswith(("#", "@", "$")) or ("@" in token and "." in token.split("@")[-1]) or _benign_token(token):
        return False
    letters = sum(c.isalpha() for c in token)
    if letters < 3 or not any(c.isdigit() for c in token):
        return False
    symbols = {c for c in token if not c.isalnum()}
    both_cases = any(c.islower() for c in token) and any(c.isupper() for c in token)
    if symbols - _WEAK_SYMBOLS:
        return True
    if re.match(r"\d+[-.]", token):
        return False  # a number compound ("2-Point", "24-Yard", "3.5-Liter"), not a passphrase of words
    return beside_password and both_cases and sum(c.islower() for c in token) >= 3


def _access_token(line: str) -> bool:
    if not _ACCESS_CUES.search(line):
        return False
    beside_password = bool(_PASSWORD_ONLY.search(line))
    for token in line.split():
        if _strong_token(token, beside_password):
            return True
    if beside_password:  # "Olivia42" beside a password noun
        return any(_WORD_DIGITS.match(token.strip("\"'`.,;:()")) for token in line.split())
    return False


_PASSWORD_ONLY = re.compile(r"(?i)(?<![\w-])(?:" + _PASSWORD + r")(?!\w)")
