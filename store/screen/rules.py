"""The rule families of the secrets screen and the benign-value filter they share (store/screen/secrets.py
runs them, with the layouts, the statement judge and the learned screen).

``find_secret(text)`` says whether one string carries secret material, and what kind (never the
value). ``strings_of(obj)`` walks any JSON structure and yields every string in it, so the
policy screens the whole candidate -- component texts, ids, refs, locators, citations, event
type, family refs, purpose, evidence -- without a list of fields to keep up to date.

Four layers, each written as a general rule rather than a list of examples:

1. Token shapes that are secrets wherever they appear: provider keys with a documented
   prefix (GitHub, GitLab, Slack, Stripe, AWS, Google, OpenAI, Anthropic, npm, PyPI, ...),
   signed JWTs, PEM/OpenSSH/PuTTY private keys, URLs with ``user:password@``.
2. Key/value assignments in any config syntax (YAML, INI, JSON, .env, shell export, CLI flags,
   query strings, ODBC/ADO strings, HTTP headers and cookies) whose key NAMES a secret
   (``DB_PASSWORD``, ``apiKey``, ``client_secret``, ``X-Api-Key``) and whose value is a literal.
3. Plain-language credentials: a credential word, an optional "for the staging console", a
   connector ("is", "was", ":", "set to", ...) and a value that is shaped like a password.
4. The maintained ``detect-secrets`` rule detectors (minus the entropy heuristics, which fire
   on ordinary prose), as a second net.

Every candidate value then goes through the same benign-value filter: placeholders
(``<your-password>``, ``changeme``, ``xxxx``, ``****``, ``REDACTED``), references to where a
secret lives (``${DB_PASSWORD}``, ``$TOKEN``, ``os.environ[...]``, ``/run/secrets/db``,
``vault:...``, ``op://...``, ``arn:aws:secretsmanager:...``), digests and password hashes,
types (``password: str``), and words that describe rather than are a value ("the password is
hashed", "password: must be 12 characters"). Public keys, bare digests, UUIDs, record ids and
URLs without credentials never match a rule in the first place.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
from detect_secrets.plugins.keyword import KeywordDetector as _KeywordDetector

_MAX_VALUE = 300  # characters of a value examined; a secret longer than this is still caught by its head

# ---- 1. token shapes ------------------------------------------------------------------------------

_B = r"(?<![A-Za-z0-9_])"  # not preceded by a token character
_E = r"(?![A-Za-z0-9_])"  # not followed by one

# (kind, literal hints -- the pattern cannot match a text holding none of them --, pattern)
_SHAPE_TABLE: list[tuple[str, tuple[str, ...], str]] = [
    ("private_key", ("PRIVATE KEY",), r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"),
    ("private_key", ("PuTTY-User-Key-File-",), r"PuTTY-User-Key-File-\d"),
    # base64 of "openssh-key-v1": an OpenSSH private key body without its armour
    ("private_key", ("b3BlbnNzaC1rZXktdjE",), r"b3BlbnNzaC1rZXktdjE"),
    ("private_key", ("AGE-SECRET-KEY-1",), r"AGE-SECRET-KEY-1[0-9A-Z]{50,}"),
    ("aws_key", ("AKIA", "ASIA", "ABIA", "ACCA", "AGPA", "AIDA", "AIPA", "ANPA", "ANVA", "AROA", "APKA"),
     _B + r"(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|ANPA|ANVA|AROA|APKA)[A-Z0-9]{16}" + _E),
    ("github_token", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), _B + r"gh[pousr]_[A-Za-z0-9]{30,255}" + _E),
    ("github_token", ("github_pat_",), _B + r"github_pat_[A-Za-z0-9_]{40,255}"),
    ("gitlab_token", ("gl",), _B + r"gl(?:pat|dt|rt|ptt|ft|imt|oas|cbt|soat|agent)-[A-Za-z0-9_-]{20,}"),
    ("gitlab_token", ("GR1348941",), _B + r"GR1348941[A-Za-z0-9_-]{20,}"),
    ("slack_token", ("xox",), _B + r"xox[abposre]-[0-9]{6,}-[A-Za-z0-9-]{8,}"),
    ("slack_token", ("xapp-",), _B + r"xapp-\d-[A-Z0-9]{6,}-\d{6,}-[a-z0-9]{20,}"),
    ("slack_token", ("hooks.slack.com",),
     r"hooks\.slack\.com/(?:services|workflows|triggers)/T[A-Z0-9]{6,}/[A-Z0-9]{6,}/[A-Za-z0-9]{12,}"),
    ("stripe_key", ("_live_", "_test_"), _B + r"(?:sk|rk)_(?:live|test)_(?![xX]{16})[A-Za-z0-9]{16,}"),
    ("docker_token", ("dckr_pat_",), _B + r"dckr_pat_[A-Za-z0-9_-]{20,}"),
    ("stripe_key", ("whsec_",), _B + r"whsec_[A-Za-z0-9+/]{24,}"),
    ("google_key", ("AIza",), r"(?<![A-Za-z0-9+/_-])AIza[0-9A-Za-z_-]{35}"),
    ("google_key", ("GOCSPX-",), _B + r"GOCSPX-[A-Za-z0-9_-]{24,}"),
    ("google_key", ("ya29.",), _B + r"ya29\.[0-9A-Za-z_-]{30,}"),
    ("openai_key", ("sk-",), _B + r"sk-(?:proj|svcacct|admin|None)-[A-Za-z0-9_-]{20,}"),
    ("openai_key", ("T3BlbkFJ",), _B + r"sk-[A-Za-z0-9]{16,}T3BlbkFJ[A-Za-z0-9]{16,}"),
    ("openai_key", ("sk-ant-",), _B + r"sk-ant-(?:api|admin|sid)\d{2}-[A-Za-z0-9_-]{20,}"),
    ("provider_key", ("npm_",), _B + r"npm_[A-Za-z0-9]{36}" + _E),
    ("provider_key", ("pypi-AgE",), _B + r"pypi-AgE[A-Za-z0-9_-]{40,}"),
    ("provider_key", ("SG.",), _B + r"SG\.[A-Za-z0-9_-]{16,32}\.[A-Za-z0-9_-]{30,64}"),
    ("provider_key", ("hf_",), _B + r"hf_[A-Za-z0-9]{30,}" + _E),
    ("provider_key", ("_v1_",), _B + r"do[por]_v1_[a-f0-9]{64}"),
    ("provider_key", ("hvs.", "hvb.", "hvr."), _B + r"hv[sbr]\.[A-Za-z0-9_-]{24,}"),
    ("provider_key", ("shp",), _B + r"shp(?:at|ss|ca|pa)_[a-fA-F0-9]{32}"),
    ("provider_key", ("dapi",), _B + r"dapi[a-f0-9]{32}" + _E),
    ("provider_key", ("glc_",), _B + r"glc_[A-Za-z0-9+/]{32,}"),
    ("provider_key", ("ATATT3",), _B + r"ATATT3[A-Za-z0-9_=-]{30,}"),
    ("provider_key", ("key-",), _B + r"key-[0-9a-f]{32}" + _E),  # Mailgun
    ("provider_key", (":AA",), _B + r"\d{8,10}:AA[A-Za-z0-9_-]{32,34}" + _E),  # Telegram bot
    ("provider_key", ("Key=",), _B + r"(?:AccountKey|SharedAccessKey|AccessKey)=[A-Za-z0-9+/]{30,}={0,2}"),
    ("jwt", ("eyJ",), _B + r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"),
]
_SHAPES = [(kind, hints, re.compile(pattern)) for kind, hints, pattern in _SHAPE_TABLE]

# A bare "sk-" key (OpenAI style) is told from "sk-learn-compatible" by its mix of cases and digits.
_SK_GENERIC = re.compile(_B + r"sk-([A-Za-z0-9]{32,})" + _E)

# scheme://user:password@host -- user may be empty (redis://:pw@host)
_URL_CREDS = re.compile(
    r"(?i)(?<![A-Za-z0-9+.-])([a-z][a-z0-9+.-]{1,30})://([^\s/:@?#\[\]\"'<>]{0,128}):([^\s/@?#\"'<>]{1,256})@[^\s/@]"
)
# user:password@host without a scheme (ssh targets, proxy settings); not mailto:bob@example.com
_USERINFO = re.compile(
    r"(?<![\w/:.@%+-])(?P<user>[A-Za-z0-9._-]{1,64}):(?P<pw>[^\s:/@\"'<>]{3,128})@"
    r"(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+|localhost|\[[0-9a-fA-F:]+\])"
)
_NOT_USERS = frozenset("mailto tel sip sips xmpp urn data news irc mid cid".split())
# jwk private members: an object with "kty" and a private exponent "d"
_JWK_KTY = re.compile(r'"kty"\s*:\s*"(?:RSA|EC|OKP|oct)"')
_JWK_PRIV = re.compile(r'"(?:d|k|p|q)"\s*:\s*"[A-Za-z0-9_-]{16,}"')

# ---- 2. key/value assignments ---------------------------------------------------------------------

# Last word(s) of a key that names a secret. "P" values need only be password-like; "T" values
# must look like a token (a name, a type or a word is not a token).
_KEY_TAILS: dict[tuple[str, ...], str] = {
    ("password",): "P", ("passwd",): "P", ("pwd",): "P", ("pw",): "P", ("passphrase",): "P",
    ("passcode",): "P", ("pin",): "P", ("pincode",): "P", ("pass", "phrase"): "P", ("pass", "code"): "P",
    ("pin", "code"): "P", ("pin", "number"): "P", ("passwords",): "P",
    ("secret",): "T", ("secrets",): "T", ("token",): "T", ("credential",): "T", ("credentials",): "T",
    ("creds",): "T", ("apikey",): "T", ("auth",): "T", ("authorization",): "T",
    ("sessionid",): "T", ("session", "id"): "T", ("session", "key"): "T", ("session", "token"): "T",
    ("session", "cookie"): "T", ("privatekey",): "T", ("secretkey",): "T", ("accesskey",): "T",
    ("otp",): "P", ("totp", "seed"): "T",
}
# "<word> key" is a secret key for these words ("primary key", "sort key" are not).
_KEY_QUALIFIERS = frozenset(
    "api access secret private signing encryption master account consumer app client hmac webhook service"
    " deploy auth license shared storage subscription admin root jwt session sas aes".split()
)
# A token/secret key whose first word makes it something else (pagination, counts, names).
_KEY_NOT_SECRET_HEADS = frozenset(
    "next page pagination continuation cancel cancellation sync resume cursor lexer parser max min num count"
    " total input output prompt completion eos bos pad unk sep cls mask start end split special exclude include"
    " scan list detect find check show print allow allowlist deny denylist block ignore skip revoke delete remove"
    " verify validate has is use enable disable require forgot".split()
)
_ASSIGN = re.compile(
    r"(?:(?<=\$env:)|(?<![A-Za-z0-9_$@./:\\+-]))(?P<key>[A-Za-z_][A-Za-z0-9_.\-]{0,63})"
    r"(?P<kq>[\"'`]?)(?:(?<=[\"'`])\])?[ \t]{0,4}"
    r"(?P<sep>:=|=>|=|:)(?!(?<=:)//|:)[ \t]{0,8}(?=(?P<val>\S[^\n]{0," + str(_MAX_VALUE) + r"}))"
)
_FLAG = re.compile(
    r"(?<!\S)--?(?P<key>[A-Za-z][A-Za-z0-9_-]{1,40})(?P<sep>[ \t]+|=)(?=(?P<val>\S[^\n]{0," + str(_MAX_VALUE) + r"}))"
)
_WORD_SPLIT = re.compile(r"[_.\-\s]+|(?<=[a-z0-9])(?=[A-Z])")

# CLI forms where the value follows without a key=value shape
_CLI = [
    re.compile(r"(?i:\b(?:mysql|mysqldump|mysqladmin|mariadb)\b)[^\n]{0,120}?\s-p(?P<val>\S{3,})"),
    re.compile(r"(?i)\bcurl\b[^\n]{0,200}?\s(?:-u|--user)\s+[\"']?[^\s:\"']{1,64}:(?P<val>[^\s\"']{3,})"),
    re.compile(r"(?i)\bsshpass\s+-p\s*(?P<val>\S{3,})"),
    re.compile(r"(?i)\bredis-cli\b[^\n]{0,120}?\s-a\s+(?P<val>\S{3,})"),
    re.compile(r"(?i)\b(?:docker|podman|helm|oras)\s+(?:registry\s+)?login\b[^\n]{0,120}?\s-p\s+(?P<val>\S{3,})"),
]
_AUTH_HEADER = re.compile(
    r"(?i)\b(?:proxy-)?authorization\b[\"']?\s*[:=]\s*[\"']?(?:bearer|basic|token|digest|apikey|api-key|sso-key|key|"
    r"bot|dpop|hmac|aws4-hmac-sha256)\s+(?P<val>[A-Za-z0-9._~+/=:,-]{8,})"
)
_BEARER = re.compile(r"(?i)\bbearer\s+(?P<val>[A-Za-z0-9._~+/-]{16,}=*)")
_COOKIE = re.compile(r"(?i)\b(?P<set>set-)?cookie\b[\"']?\s*:\s*(?P<pairs>[^\n]{3,2000})")
_SESSIONISH = re.compile(r"(?i)sess|sid|auth|token|remember|login|jwt|csrf|xsrf|__host-|__secure-|identity|user_?id")

# ---- 3. plain-language credentials ----------------------------------------------------------------

_P_WORDS = (
    r"pass(?:word|wd|phrase|code)s?|pwd|pass[ -](?:phrase|code)|PIN(?:\s+(?:code|number))?|pin[ -](?:code|number)|"
    r"(?:door|alarm|gate|safe|lock|entry|keypad|access|unlock)[ -]codes?"
)
_T_WORDS = (
    r"(?:api|access|secret|private|signing|encryption|master|account|consumer|app|client|hmac|webhook|service|"
    r"deploy|license|storage|admin|root|jwt|session|aes)[ _-]?(?:key|token|secret)s?|"
    r"(?:auth|bearer|refresh|access|id|session|personal[ -]access|bot|oauth|service[ -]account|deploy|"
    r"registry|npm|pypi|github|gitlab|slack|stripe)[ _-]?tokens?|secrets?|tokens?|credentials|creds|"
    r"(?:client|signing|webhook|shared|app|oauth)[ _-]secrets?|session[ _-]?(?:id|cookie)s?"
)
_CONNECTORS = (
    r"(?:is\s+|was\s+|has\s+been\s+|had\s+been\s+|got\s+|were\s+|are\s+)?(?:set|changed|reset|updated|rotated)\s+to|"
    r"is\s+now|is\s+still|was\s+still|now\s+is|will\s+be|would\s+be|has\s+been|had\s+been|remains|became|"
    r"becomes|reads|equals|is|was|are|were|=|:|(?<=\s)[-\u2013\u2014](?=\s)"
)
_PROSE = re.compile(
    r"(?<![A-Za-z0-9_])(?P<kw>" + _P_WORDS + "|" + _T_WORDS + r")(?![A-Za-z0-9_])"
    # an optional qualifying phrase: "for the staging console", "we use on prod", "(staging)"
    r"(?P<mid>\s*\([^()\n]{1,40}\)|\s+(?:for|of|on|to|at|in|from|we|you|they|i|that|which|used|given|"
    r"shared|configured|provided)\b[^.;:=\n!?()\[\]`<>]{0,60}?)?"
    r"\s*(?P<conn>" + _CONNECTORS + r")(?![A-Za-z0-9_]|//)[ \t]*(?:[:\-\u2013\u2014][ \t]*)?(?=(?P<val>\S[^\n]{0,"
    + str(_MAX_VALUE) + r"}))",
    re.IGNORECASE,
)
_PROSE_REVERSED = [
    # "use hunter2 as the password", "log in with Winter2026! as the admin passphrase"
    re.compile(
        r"(?i)\b(?:use|using|with|try|enter|type|pick|chose|choose|set)\s+(?P<val>\S{3,120}?)\s+(?:as|for)\s+"
        r"(?:the|your|a|an|our|my|its|their)?\s*(?:[\w-]+\s+){0,2}?(?P<kw>" + _P_WORDS + "|" + _T_WORDS + r")\b"
    ),
    # "set the password to X", "changed the admin PIN to X"
    re.compile(
        r"(?i)\b(?:set|setting|change|changed|changing|reset|resetting|update|updated|rotate|rotated)\s+"
        r"(?:the|your|a|an|our|my|its|their)?\s*(?:[\w-]+\s+){0,2}?(?P<kw>" + _P_WORDS + "|" + _T_WORDS +
        r")\s+(?:back\s+)?to\s+(?=(?P<val>\S[^\n]{0," + str(_MAX_VALUE) + "}))"
    ),
    # "log in as postgres with password purple48"
    re.compile(
        r"(?i)\b(?:with|using|via)\s+(?:the\s+|a\s+|an\s+)?(?:[\w-]+\s+)?(?P<kw>" + _P_WORDS + r")\s+(?P<val>\S{4,120})"
    ),
    # "password 'hunter2'", "passcode 4821" (unquoted: only unmistakable shapes)
    re.compile(r"(?<![A-Za-z0-9_])(?P<kw>" + _P_WORDS + r")\s+(?P<val>[\"'`\u2018\u201c][^\n]{1,200})", re.I),
    re.compile(r"(?<![A-Za-z0-9_])(?P<kw>" + _P_WORDS + r")\s+(?P<val>[A-Za-z0-9](?![^\s]*(?:://|@[\w-]+\.))\S{3,119})",
               re.I),
    # "Heroku API key 8d7f6e5a-...", "the refresh token 1//0gX..." (no connector: only token shapes)
    re.compile(
        r"(?i)(?<![A-Za-z0-9_])(?P<kw>(?:api|secret|access|private|signing|encryption|master)[ _-]?keys?|"
        r"(?:api|auth|bearer|access|refresh|personal[ -]access)[ _-]?tokens?|client[ _-]secrets?)"
        r"\s+(?P<val>[A-Za-z0-9][\w.+/=~-]{15,300})"
    ),
    # "hunter2 is the admin password"
    re.compile(
        r"(?i)(?:^|[\s(\"'`\u2018\u201c])(?P<val>[^\s\"'`]{4,120})[\"'`\u2019\u201d]?\s+(?:is|was)\s+"
        r"(?:the|our|my|your|their|its)\s+(?:[\w-]+\s+){0,2}?(?P<kw>" + _P_WORDS + "|" + _T_WORDS + r")"
        r"(?=\s*(?:$|[.,;:!?)]|\s+(?:for|of|on|to|at|in)\b))"
    ),
]
# "credentials: admin / hunter2", "login admin:hunter2", "user/pass = root/toor"
_PAIR = re.compile(
    r"(?i)\b(?:credentials|creds|login|log-?in|user(?:name)?\s*/\s*pass(?:word)?|u/p|user:pass)\b"
    r"\s*(?:is|are|was|were|=|:)?\s*[\"'`]?(?P<user>[A-Za-z0-9._@+-]{1,64})\s*[/:]\s*(?P<val>(?!/)[^\s\"'`]{3,128})"
)

# ---- benign values --------------------------------------------------------------------------------

# Words that describe a secret or continue a sentence; never themselves the value.
VOCAB = frozenset(
    """
    a an the this that these those it its is was are be been being not no never none nothing always also only
    just still now then there here same different another other any some every each all both either neither
    in on at of to for from by with without via into onto over under through per as than like about after before
    and or but if so because while when where which who whom whose what how why whether until unless
    must should shall will would can could may might need needs needed do does did done has have had having
    get gets got set sets use uses used using see check ask read write make makes take kept keep keeps
    stored stores store saved encrypted hashed salted hidden masked shown visible rotated rotate rotates expired
    expires expire expiring revoked revoke valid invalid correct incorrect wrong right required optional
    mandatory missing empty blank null nil undefined unset unknown default defaults
    weak strong long short secure insecure safe unsafe random unique static dynamic temporary permanent
    public private personal shared sensitive confidential secret opaque plain plaintext cleartext clear
    compromised leaked exposed reset changed updated generated provided supplied managed injected loaded
    fetched pulled passed sent received issued signed unsigned scoped limited tied bound attached
    case sensitive insensitive numeric alphanumeric digits characters chars letters symbols bytes bits
    length minimum maximum min max least most fewer more less enough too very quite rather
    string str text bytes int integer number boolean bool object any char varchar secretstr secretbytes
    list dict array map field type value values key keys token tokens password passwords secret secrets
    username user users admin account accounts login service server host client bearer basic digest
    base64 base64url hex utf8 ascii unicode jwt jws jwe json yaml toml ini env dotenv pem der
    sha sha1 sha2 sha256 sha384 sha512 sha3 md5 hmac bcrypt scrypt argon2 argon2id argon2i pbkdf2 crc32
    aes aes128 aes256 rsa rsa2048 rsa4096 ecdsa ed25519 x25519 p256 p384 hs256 hs384 hs512 rs256 es256
    totp hotp otp oauth oauth2 oidc saml ldap kerberos ntlm mfa 2fa sso tls ssl mtls https http httponly
    samesite postgres postgresql mysql sqlite redis nginx kubectl kubernetes github gitlab bitbucket
    vault keychain keyring kms hsm ssm 1password bitwarden lastpass keepass doppler infisical sops
    whatever whichever something anything everything nobody someone anyone everyone
    handled described documented explained listed defined configured specified enforced validated verified
    checked compared sent logged printed displayed returned echoed copied pasted typed entered
    good bad fine ok okay great better best worse worst new old current previous next last first second
    yes true false on off enabled disabled active inactive pending
    """.split()
)
_SUFFIXES = (
    "ed", "ing", "ly", "able", "ible", "ive", "ous", "ful", "less", "al", "ary", "ory", "ent", "ant", "ic",
    "ical", "ion", "ions", "ment", "ments", "ness", "ity", "ise", "ize", "ated", "ate", "ure", "ence", "ance",
    "ship", "ward", "wards", "ish", "ism", "ist", "er", "ers", "est", "es",
)
# How words and names are cased: lower, UPPER, Title, CamelCase, camelCase, PostgreSQL, iPhone.
_WORD_CASE = re.compile(r"^(?:[a-z]+|[A-Z]+|[A-Z][a-z]+|(?:[A-Z][a-z]+){2,4}|[a-z]+(?:[A-Z][a-z]+){1,3}|"
                        r"[A-Z][a-z]+[A-Z]{2,4}|[a-z][A-Z][a-z]+|[A-Z]{2,5}[a-z]+)$")
_CONSONANTS = re.compile(r"(?i)[bcdfghjklmnpqrstvwxz]{4}")
_NAME_ENDS = frozenset(
    "token tokens key keys secret secrets password passwords auth id header name type value url file path".split()
)
_LONG_WORD_SUFFIXES = ("tion", "tions", "ment", "ments", "ness", "ability", "ibility", "ically", "ality",
                       "ization", "isation", "ities", "ously", "iveness")
_UNITS = frozenset(
    "characters character chars char digits digit letters letter symbols bytes byte bits bit words word days day"
    " hours hour minutes minute mins min seconds second secs sec ms months month years year weeks week times"
    " attempts tries retries long chars. %".split()
)
_PLACEHOLDER_WORDS = frozenset(
    """
    changeme change-me change_me changeit change-it changethis replaceme replace-me replace_me
    redacted removed hidden masked elided omitted censored scrubbed sanitized sanitised
    placeholder example sample dummy fake test testing todo tbd tbc fixme none null nil na n/a unset empty
    notset not-set undefined unknown xxx yyy zzz foo bar baz qux quux foobar blah secret password passwd token apikey
    your-password your_password yourpassword your-token your-api-key your_api_key yourapikey
    mysecretpassword mypassword my-password my_password mytoken my-token
    insert-here insert_here enter-here
    """.split()
)
_PLACEHOLDER_RE = re.compile(
    r"""(?ix)^(?:
        <[^<>]{0,80}>                               # <your-password>, <redacted>
      | \[[^\[\]]{0,40}\]                           # [REDACTED], [secret]
      | \{\{[^{}]{0,80}\}\} | \{[A-Za-z_][\w.]{0,60}\}   # {{ .Values.pw }}, {password}
      | \$\{[^{}]{0,80}\} | \$\([^()]{0,80}\)         # ${DB_PASSWORD}, $(cat file)
      | \$\{\{[^{}]{0,80}\}\}                         # ${{ secrets.TOKEN }}
      | (?-i:\$[A-Z_][A-Z0-9_]{0,60}|\$[a-z_][a-z0-9_]{0,60})   # $TOKEN, $db_password
      | (?-i:%[A-Z_][A-Z0-9_]{0,60}%)                # %API_KEY%
      | %\([A-Za-z_]\w*\)s | %s | \{\}               # printf / format slots
      | [x*#.\u2022\u2026_?-]{2,}                    # xxxx, ****, ...., ••••, ___
      | (?-i:[A-ZÀ-Ý]+(?:_[A-ZÀ-Ý]+)+)               # YOUR_PASSWORD, TU_CONTRASEÑA: a name in capitals
      | [A-Za-z_-]{0,12}(?:[xX]{6,}|[*\u2022]{4,})      # sk_live_xxxxxxxx, AKIAXXXXXXXXXXXXXXXX
      | your[-_ ]?(?:[a-z]+[-_ ]?){1,5}               # your-password, YOUR_API_KEY, yourtokenhere
      | (?:my|the|some|insert|enter|put|add)[-_ ](?:[a-z]+[-_ ]?){1,5}
      | (?:[a-z0-9]+[-_])*(?:redacted|placeholder|changeme|change[-_]me|replace[-_]?me|example|dummy|fake|sample)
        (?:[-_][a-z0-9]+)*                          # your-example-key, REDACTED_TOKEN
    )$"""
)
_REFERENCE_RE = re.compile(
    r"""(?ix)^(?:
        (?:vault|op|sm|ssm|awssm|aws-sm|secretsmanager|gcpsm|azurekv|keyvault|akv|doppler|infisical|bw|lpass
          |k8s|kubernetes|secret|secrets|env|file|ref|sops|kms|gsm)(?::|://)\S*  # secret-store references
      | arn:aws[\w-]*:(?:secretsmanager|ssm|kms):\S*
      | projects/[^/\s]+/secrets/\S*                  # GCP Secret Manager
      | https?://[\w.-]+\.vault\.azure\.net/\S*
      | !(?:vault|secret|env|ref|include|sops)\b.*     # YAML tags
      | ENC\[[^\]]*\]?                                # sops ciphertext
      | [A-Za-z]:\\\S*                                # a Windows path
    )$"""
)
_DIGEST_RE = re.compile(
    r"(?ix)^(?:(?:sha(?:1|224|256|384|512)|md5|blake2b?|blake3|crc32|xxh64|multihash)[:=-][0-9a-f]{8,128}"
    r"|\$(?:2[abxy]?|argon2(?:id|i|d)|scrypt|pbkdf2[\w-]*|[156])\$\S{8,})$"
)
_VERSION_RE = re.compile(r"(?i)^v?\d+(?:\.\d+){1,3}(?:[-+][\w.]+)?$")
_DOTTED_REF = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?:\(\))?$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SNAKE = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)+$")
_CODE_WORDS = frozenset(
    "value val input form data field arg args param params hash raw plain old db cfg conf env get read load str obj"
    " buf tmp result res req resp ctx stream writer reader handler header headers body payload".split()
)
_EXPRESSION = re.compile(r"^[A-Za-z_$][\w.$]*\s*[(\[]")  # a call or a subscript
_CODE_ROOTS = frozenset(
    "os self this settings config conf cfg env environ process secrets vars ctx context request req app args"
    " options opts params props credentials creds vault module window import".split()
)
_URL_NO_CREDS = re.compile(r"(?i)^[a-z][a-z0-9+.-]{1,30}://([\w.-]+)(?::\d+)?(?:[/?#]\S*)?$")
_EMAIL = re.compile(r"^[\w.+-]+@[\w-]+(?:\.[\w-]+)+$")
_QUOTES = "\"'`\u2018\u2019\u201c\u201d\u00ab\u00bb"
_CLOSE = {"'": "'", '"': '"', "`": "`", "\u2018": "\u2019", "\u201c": "\u201d", "\u00ab": "\u00bb",
          "\u2019": "\u2019", "\u201d": "\u201d", "\u00bb": "\u00bb"}
_TRAIL = ".,;:!?)]}>\"'`\u2019\u201d\u00bb"


_VALUE_END = re.compile(r";(?=\s*[A-Za-z_][\w .-]{1,40}=)|[;,]$|,(?=\s)")
_QUERY_END = re.compile(r"[&#]")
_IDENT_CLOSED = re.compile(r"[A-Za-z_][\w.]*(?=[),\]}])")


def _split_value(raw: str, query: bool = False) -> tuple[str, bool, str]:
    """The value at the start of ``raw``: (value, was_quoted, the rest of the line after it)."""
    raw = raw.strip()
    if len(raw) > 2 and raw[0] in "rbuRBU" and raw[1] in "\"'":  # r"...", b'...': a literal
        raw = raw[1:]
    if len(raw) > 2 and raw[0] in "fF" and raw[1] in "\"'":  # f"...": a template, built from variables
        return "{f-string}", False, ""
    if raw and raw[0] in _QUOTES:
        close = _CLOSE.get(raw[0], raw[0])
        end = raw.find(close, 1)
        if end == -1:
            end = len(raw)
        return raw[1:end], True, raw[end + 1:]
    for opener, closer in (("<", ">"), ("[", "]")):
        if raw.startswith(opener):
            end = raw.find(closer)
            if end != -1:
                return raw[: end + 1], False, raw[end + 1:]
    for opener, closer in (("${{", "}}"), ("{{", "}}"), ("${", "}")):
        if raw.startswith(opener):
            end = raw.find(closer)
            if end != -1:
                return raw[: end + len(closer)], False, raw[end + len(closer):]
    match = _IDENT_CLOSED.match(raw) or re.match(r"[^\s]+", raw)  # f(token=token), x[token]
    token = match.group(0) if match else ""
    rest = raw[len(token):]
    # a query string, an ODBC string or a list continues after these: they end the value
    cut = (_QUERY_END if query else _VALUE_END).search(token)
    if cut is not None and cut.start() > 0:
        rest = token[cut.start():] + rest
        token = token[: cut.start()]
    stripped = token.rstrip(_TRAIL)
    if len(stripped) >= 3:
        rest = token[len(stripped):] + rest  # "... is X. Ask Dana": the sentence ended
        token = stripped
    return token, False, rest


def _entropy(value: str) -> float:
    counts = Counter(value)
    return -sum(c / len(value) * math.log2(c / len(value)) for c in counts.values())


def _wordy(word: str) -> bool:
    """A letters-only token that reads as an English word (or a known term), not as a password."""
    low = word.lower()
    if low in VOCAB or low in _UNITS:
        return True
    if not low.isalpha() or not _WORD_CASE.match(word):
        return False
    if len(low) <= 3:
        return True
    return len(low) <= 15 and low.endswith(_SUFFIXES)


_TEMPLATE = re.compile(r"\{[A-Za-z_][\w.]*(?:\[[^\]]{0,20}\])?(?:![rsa])?(?::[^{}]{0,10})?\}|\{\}")
_REGEXISH = re.compile(r"\(\?[:=!<P]|\\[dwsbDWSv]|\[[^\]]{1,60}\][{*+?]|\]\{\d")
_NAMES_A_SECRET = re.compile(
    r"(?i)^(?:[a-z]+[-_. ]+)*(?:api[-_. ]?key|access[-_. ]?key|secret[-_. ]?key|password|passwd|token|secret|auth|"
    r"credentials?)s?(?:[-_. ]+(?:value|here|goes[-_. ]here|placeholder|string|str|name|id))?$"
)
_SECRET_NOUNS = frozenset(
    "password passwords passwd pwd pass passphrase secret secrets token tokens key keys auth credential credentials"
    " apikey".split()
)
_EMPHASIS = re.compile(r"^[*_]+\(?[A-Za-z ]+\)?[*_]+$")  # *(optional)*
_PATH = re.compile(r"^(?:~|\.{1,2})?/(?:[\w.@-]+/)*[\w.@-]*$")


_TYPE_NAME = re.compile(
    r"^(?:[A-Z][a-z]{2,}|[A-Z][a-z]?\d+|[A-Z][A-Z0-9]+(?=[A-Z][a-z]))*"
    r"(?:[A-Z][a-z]{2,}T|Types?|Collection|Keys?|Tokens?|Protocol|Class|Model|Dict|List|Config|Settings|Provider|"
    r"Output|Input|Result|Response|Request|Error|Buffer|Bytes|Str|Info|Handler|Callback|Factory|Manager|"
    r"Credentials?|Secret|Auth|Params|Options|Like|Spec|Schema|Store|Field)$"
)


def _code_path(parts: list[str]) -> bool:
    """os.environ, settings.DB_PASSWORD, api.token, utils.Buffer -- not dishwasher.copper.zebra."""
    if any(_random_looking(p) and not _TYPE_NAME.match(p) for p in parts):
        return False  # a signed cookie or token: eyJ1c2VyIjoxfQ.ZmFrZV9zaWduYXR1cmU (not Ed25519PrivateKey)
    if parts[0].lower() in _CODE_ROOTS:
        return True
    return any("_" in p or p.isupper() or p[:1].isupper() or p.lower() in VOCAB for p in parts)


def _random_looking(part: str) -> bool:
    """Mixed case and digits over 12+ characters: a key or token, not a name."""
    return len(part) >= 12 and any(c.isupper() for c in part) and any(c.islower() for c in part) and \
        any(c.isdigit() for c in part)


def _is_path(v: str) -> bool:
    """/run/secrets/db, ~/.ssh/id_ed25519, ./secrets/token.txt -- not base64 that starts with a slash."""
    if not _PATH.match(v):
        return False
    parts = [p for p in v.split("/") if p not in ("", "~", ".", "..")]
    return bool(parts) and all(len(p) <= 40 and not _random_looking(p) for p in parts)


_FIELD_NAMES = re.compile(r"(?i)^(?:user(?:name)?|login|email|e-mail)\s*[/:]\s*(?:pass(?:word)?|pw|pwd)\W*$")
_COOKIE_ATTRIBUTE = re.compile(r"(?i)^(?:samesite|secure|httponly|path|domain|max-age|expires|priority|partitioned)"
                               r"(?:=[\w./-]*)?\W*$")


def benign_value(value: str, quoted: bool = False) -> bool:
    """Placeholders, references, digests, hashes and versions: never a secret. Unquoted, also code
    (``os.environ["X"]``, ``settings.DB_PASSWORD``, ``db_password``): a quoted value is a literal."""
    v = value.strip().strip(_QUOTES).strip()
    if not v:
        return True
    low = v.lower()
    if low in _PLACEHOLDER_WORDS or _PLACEHOLDER_RE.match(v) or _REFERENCE_RE.match(v) or _DIGEST_RE.match(v):
        return True
    url = _URL_NO_CREDS.match(v)
    if _VERSION_RE.match(v) or (url and not _random_looking(url.group(1))) or _is_path(v):
        return True
    if len(set(v)) == 1 and not v.isdigit():  # "aaaaaaaa" (but "0000" is a PIN)
        return True
    if "..." in v or "\u2026" in v or _TEMPLATE.search(v) or _REGEXISH.search(v):
        return True  # elided ("hf_..."), a template slot ("Bearer {token}"), a pattern ("[a-f0-9]{48}")
    if _NAMES_A_SECRET.match(v):
        return True  # spells what it stands for: "my-api-key", "secret_value", "hf_oauth_refresh_token"
    if _FIELD_NAMES.match(v) or _COOKIE_ATTRIBUTE.match(v):
        return True  # "user/pass" names the fields; "SameSite=Lax" is a cookie attribute, not its value
    if quoted:
        return False
    if _EXPRESSION.match(v) or v[0] in "([{" or _EMPHASIS.match(v):
        return True
    if _DOTTED_REF.match(v) and _code_path(v.split(".")):
        return True
    if _TYPE_NAME.match(v):
        return True  # password: SecretStr, token: AccessTokenT, private_key: Ed25519PrivateKey
    # a variable named for a secret: db_password, STRIPE_API_KEY, apiToken
    if not _IDENT.match(v) or _random_looking(v):
        return False
    humps = sum(a.islower() and b.isupper() for a, b in zip(v, v[1:], strict=False))
    return _key_tier(v) is not None and humps <= 2 and ("_" in v or humps >= 1 or v.lower() in VOCAB)


def _value_is_secret(raw: str, tier: str, *, prose: bool = False,
                     strict: bool = False, whole: bool = False, query: bool = False) -> bool:
    """Does the value at the start of ``raw`` look like a credential?

    tier "P": password-like suffices (hunter2, 4821, correcthorsebatterystaple);
    tier "T": it must look like a token (long, mixed). ``prose``: the value follows a sentence
    ("the password is ..."), so a plain word continues the sentence. ``strict``: no connector at all
    (adjacency), so only unmistakable shapes count. ``whole``: the value is delimited (``--flag=value``),
    what follows it is another argument, not the rest of a sentence."""
    value, quoted, rest = _split_value(raw, query)
    if benign_value(value, quoted and not raw.lstrip().startswith("`")):  # `get_token()` is code
        return False
    if quoted:
        value = value.strip()
        if " " in value:  # "correct horse battery staple"; not "must be 12 characters" nor "Stripe Access Key"
            words = value.lower().split()
            return tier == "P" and not strict and len(value) >= 8 and words[0] not in VOCAB and \
                words[-1] not in _NAME_ENDS
        if value.lower() in VOCAB:
            return False
        whole = True  # delimited: what follows is not the rest of its sentence
    next_word = re.match(r"\s*([A-Za-z][A-Za-z'-]*)", rest)
    continues = not whole and next_word is not None and not rest.startswith((",", ";", ".", ")")) and \
        rest[:1].isspace()
    letters = sum(ch.isalpha() for ch in value)
    digits = sum(ch.isdigit() for ch in value)
    symbols = len(value) - letters - digits
    if value.isdigit():
        if next_word is not None and next_word.group(1).lower().rstrip(".") in _UNITS:
            return False
        return (4 <= len(value) <= 12 and tier == "P" and not strict) or len(value) >= 16
    if len(value) < 4 or (tier == "T" and len(value) < 8):
        return False
    parts = [p for p in re.split(r"[-_ ]", value) if p]
    if not quoted and _SNAKE.match(value):  # token = read_stream_writer: a variable, unless a passphrase
        return tier == "P" and len(parts) >= 3 and not any(p in VOCAB or p in _CODE_WORDS for p in parts) \
            and not any(p.isdigit() for p in parts)
    if all(p.isalpha() for p in parts):  # words only: "hashed", "case-sensitive", "correcthorsebatterystaple"
        if strict:
            return False
        mixed_case = any(ch.isupper() for ch in value[1:]) and any(ch.islower() for ch in value)
        if value.lower() in VOCAB:
            return False
        if len(parts) >= 3 and " " not in value and not any(p.lower() in _SECRET_NOUNS for p in parts) and \
                not any(p.lower() in {"to", "of", "by", "in", "on", "a", "the", "and", "or"} for p in parts):
            return tier == "P" or (quoted and len(value) >= 16)  # correct-horse-battery-staple
        if len(parts) >= 2 and any(p.lower() in _SECRET_NOUNS for p in parts):
            return False  # client_secret_basic, x-auth-token: a name
        camel_words = [w.lower() for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", value)]
        if len(camel_words) >= 2 and value[1:] != value[1:].lower() and any(w in _SECRET_NOUNS for w in camel_words):
            return False  # challengePassword, privateKeyUsagePeriod: a name
        glued = len(parts) == 1 and len(value) >= 16 and value[1:].islower() and \
            not value.lower().endswith(_LONG_WORD_SUFFIXES)
        if len(value) >= 8 and any(len(p) >= 6 and p.islower() and p not in VOCAB and _CONSONANTS.search(p)
                                   for p in parts):
            return True  # lxbgrfunpj: four consonants in a row is rarely English
        if glued and tier == "P":
            return True  # correcthorsebatterystaple: no English word is that long
        if len(value) >= 6 and not all(_WORD_CASE.match(p) for p in parts):
            return True  # uGLPtllopStc: random letters, not a word nor a CamelCase name
        if continues and (prose or len(value) < 16):
            return False  # the first word of a phrase ("password: must be 12 characters")
        if all(_wordy(p) for p in parts) and len(value.replace("-", "").replace("_", "")) < 16:
            return mixed_case and not prose and tier == "P" and len(parts) == 1
        if tier == "T":
            return len(value) >= 16 and (mixed_case or len(value) >= 24)
        return True
    # hyphenated terms whose parts are words, units, or numbers with units: "30-day", "HS256-signed"
    if len(parts) > 1 and all(p.isdigit() or _wordy(p) or p.lower() in VOCAB for p in parts) and \
            any(not p.isdigit() for p in parts) and not any(ch in value for ch in "!@#$%^&*+=/~"):
        return False
    if value.lower() in VOCAB or _EMAIL.match(value):
        return False
    if strict:
        return letters >= 2 and digits >= 1 and len(value) >= 6 and (symbols >= 1 or any(c.isupper() for c in value))
    if tier == "T":
        return len(value) >= 8 and (digits >= 1 or symbols >= 1) and letters >= 2 and \
            (len(value) >= 12 or _entropy(value) >= 2.8)
    return letters >= 1 and (digits >= 1 or symbols >= 1)


def _spaced(key: str) -> bool:
    """Words written apart ("boarding pass") are English; a variable is written as one identifier."""
    return re.search(r"\s", key.strip()) is not None


def _key_tier(key: str) -> str | None:
    """'P' or 'T' when the key names a secret, else None."""
    words = [w.lower() for w in _WORD_SPLIT.split(key.strip("-")) if w]
    if not words:
        return None
    # drop trailing words that are not part of the name, only when nothing secret follows them
    for size in (2, 1):
        if len(words) >= size and tuple(words[-size:]) in _KEY_TAILS:
            head = words[-size - 1] if len(words) > size else ""
            tier = _KEY_TAILS[tuple(words[-size:])]
            if words[-1] == "pass" and _spaced(key):
                return None
            if words[-1] == "pin" and len(words) > 1 and head not in {"user", "admin", "card", "sim", "door", "alarm",
                                                                         "atm", "bank", "phone", "safe", "login"}:
                return None
            if head in _KEY_NOT_SECRET_HEADS:
                return None
            return tier
    if words[-1] == "pass" and (len(words) == 1 or not _spaced(key)):
        return "P"  # DB_PASS, dbPass, RABBITMQ_DEFAULT_PASS; not "boarding pass" nor "first pass"
    last = words[-1]  # glued: PGPASSWORD, mysqlpassword, authtoken, apisecret
    if last.endswith(("password", "passwd", "passphrase", "passcode")):
        return "P"
    if last.endswith(("secret", "token", "apikey", "accesskey", "secretkey", "privatekey")) and \
            not last.startswith(tuple(_KEY_NOT_SECRET_HEADS)):
        return "T"
    if words[-1] in ("key", "keys") and len(words) >= 2 and words[-2] in _KEY_QUALIFIERS:
        return "T"
    if len(words) >= 2 and words[-1] in ("key", "secret") and words[-2] == "secret":
        return "T"
    return None


def _assignments(line: str) -> str | None:
    for match in _ASSIGN.finditer(line):
        tier = _key_tier(match.group("key"))
        if tier is None:
            continue
        val = match.group("val")
        if match.group("sep") == ":" and not match.group("kq") and match.end("key") != match.start("sep"):
            continue  # "pass :data:" -- a colon after a space is punctuation, not YAML
        if match.group("sep") == "=" and re.match(r"={1,2}\s", val):  # password == x: a comparison
            val = val.lstrip("= ")
            if val[:1] not in _QUOTES:
                continue  # with a variable, not with a literal
        query = line[match.start() - 1: match.start()] in ("?", "&")
        if _value_is_secret(val, tier, prose=False, query=query):
            return "config_" + ("password" if tier == "P" else "secret")
    for match in _FLAG.finditer(line):
        tier = _key_tier(match.group("key"))
        if tier is not None and _value_is_secret(match.group("val"), tier, whole=match.group("sep") == "="):
            return "cli_credential"
    return None


_PIN_VALUE = re.compile(r"[\"'`\u2018\u201c]?\d{3,12}[\"'`\u2019\u201d]?[.,;:!?)]*")


def _not_a_pin(kw: str, val: str) -> bool:
    """A PIN is digits: "the PIN is 4821" is a credential, "PIN endocytosis" (the PIN proteins of
    plant biology, a SciFact document) is not."""
    if not kw.lower().startswith("pin"):
        return False
    head = val.split(maxsplit=1)[0] if val.strip() else ""
    return _PIN_VALUE.fullmatch(head) is None


def _prose(line: str) -> str | None:
    for match in _PROSE.finditer(line):
        kw = match.group("kw")
        tier = _prose_tier(kw)
        if tier is None or _not_a_pin(kw, match.group("val")):
            continue
        conn = match.group("conn").lower()
        if _value_is_secret(match.group("val"), tier, prose=conn not in ("=", ":")):
            return "prose_credential"
    for index, pattern in enumerate(_PROSE_REVERSED):
        for match in pattern.finditer(line):
            tier = _prose_tier(match.group("kw"))
            if tier is None or _not_a_pin(match.group("kw"), match.group("val")):
                continue
            if index == 5:  # adjacency of a token word: the shape alone must say "token"
                if _strong_token(match.group("val").rstrip(_TRAIL)):
                    return "prose_credential"
                continue
            strict = index == 4
            if _value_is_secret(match.group("val"), tier, prose=index != 1, strict=strict):
                return "prose_credential"
    for match in _PAIR.finditer(line):
        if _value_is_secret(match.group("val"), "P", strict=False) and not benign_value(match.group("user")):
            return "prose_credential"
    return None


def _prose_tier(kw: str) -> str | None:
    low = kw.lower()
    if kw.startswith(("pin", "Pin")) and not low.startswith("pin ") and not low.startswith("pin-"):
        return None  # "pin the version"; a PIN is written in capitals or as "pin code"
    if re.match(r"pass|pwd|pin", low) or re.search(r"codes?$", low):
        return "P"
    return "T"


def _headers(line: str) -> str | None:
    for match in _AUTH_HEADER.finditer(line):
        if not benign_value(match.group("val")) and len(set(match.group("val"))) > 4:
            return "bearer_token"
    for match in _BEARER.finditer(line):
        val = match.group("val")
        mixed = any(c.isupper() for c in val) and any(c.islower() for c in val)
        if not benign_value(val) and _entropy(val) >= 3.0 and (any(c.isdigit() for c in val) or
                                                                 (mixed and len(val) >= 20)):
            return "bearer_token"
    for match in _COOKIE.finditer(line):
        pairs = [p.strip() for p in match.group("pairs").split(";")]
        if match.group("set"):
            pairs = pairs[:1]  # the rest are attributes (Path=/, HttpOnly)
        for pair in pairs:
            name, eq, value = pair.partition("=")
            value = value.strip().strip("\"'")
            if not eq or benign_value(value) or len(value) < 8:
                continue
            if _SESSIONISH.search(name) or _token_like(value):
                return "session_cookie"
    for pattern in _CLI:
        for match in pattern.finditer(line):
            if not benign_value(match.group("val"), quoted=True):
                return "cli_credential"
    return None


_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_HEX = re.compile(r"^[0-9a-fA-F]{32,}$")


def _strong_token(value: str) -> bool:
    """A UUID, 32+ hex digits, or 16+ random-looking characters: a token by its shape alone."""
    if benign_value(value, quoted=True):
        return False
    return bool(_UUID.match(value) or _HEX.match(value)) or (_random_looking(value) and len(value) >= 16) or \
        (len(value) >= 20 and _token_like(value))


def _token_like(value: str) -> bool:
    letters = sum(c.isalpha() for c in value)
    digits = sum(c.isdigit() for c in value)
    return len(value) >= 20 and letters >= 6 and digits >= 3 and _entropy(value) >= 3.5


def _shapes(text: str) -> str | None:
    for kind, hints, pattern in _SHAPES:
        if any(hint in text for hint in hints) and pattern.search(text):
            return kind
    if "sk-" in text:
        for match in _SK_GENERIC.finditer(text):
            body = match.group(1)
            if any(c.isdigit() for c in body) and any(c.isupper() for c in body) and any(c.islower() for c in body):
                return "openai_key"
    for match in _URL_CREDS.finditer(text) if "://" in text else ():
        password = match.group(3)
        if not benign_value(password) and not password.isdigit():  # host:port@ is not a password
            return "connection_string"
    for match in _USERINFO.finditer(text) if "@" in text else ():
        if match.group("user").lower() not in _NOT_USERS and _value_is_secret(match.group("pw"), "P", whole=True):
            return "connection_string"
    if '"kty"' in text and _JWK_KTY.search(text) and _JWK_PRIV.search(text):
        return "private_key"
    return None


# ---- 4. detect-secrets ----------------------------------------------------------------------------

# The rule-based detectors only: the entropy heuristics fire on ordinary prose, a public IP
# address is not a secret, and detect-secrets' filters (built for source files) cost 20x the
# scan. Built once and asked line by line -- what ``scan_line`` does with no filters, minus its
# per-call settings reload. Verification (a network call) stays off.
_NOISY = {"IPPublicDetector", "ArtifactoryDetector", "IbmCosHmacDetector", "SoftlayerDetector", "CloudantDetector"}
_PLUGINS: list[type[Any]] = list(get_mapping_from_secret_type_to_class().values())
_DETECTORS = tuple(
    cls() for cls in sorted(_PLUGINS, key=lambda c: c.__name__)
    if "Entropy" not in cls.__name__ and cls.__name__ not in _NOISY
)
_ADHOC = "adhoc-string-scan"  # the file name scan_line uses: the keyword detector's "other" rules


def _detect_secrets(line: str) -> str | None:
    for detector in _DETECTORS:
        for found in detector.analyze_line(filename=_ADHOC, line=line, line_number=0):
            value = found.secret_value or ""
            if not value or benign_value(value) or value.lower() in VOCAB:
                continue
            if isinstance(detector, _KeywordDetector) and not _value_is_secret(repr(value), "P"):
                continue  # the keyword rule takes any quoted value; ours asks the value to look like one
            return "detect_secrets:" + type(detector).__name__
    return None


# Words the key/value and plain-language rules need one of (every secret-naming key and credential
# word contains one), the header and CLI rules, and a superset of what the kept detect-secrets
# detectors can match (their keywords and token prefixes).
_STEMS = re.compile(r"(?i)pass|pwd|pw|pin|secret|token|key|cred|auth|code|sess|cookie|log-?in|user|u/p|otp")
_HEADER_HINTS = re.compile(r"(?i)bearer|authorization|cookie|mysql|mariadb|curl|sshpass|redis-cli|login")
_DETECTOR_HINTS = re.compile(
    r"(?i)pass|pwd|secret|token|key|auth|cred|contrase|ibm|://|private|putty|akia|asia|gh[pousr]_|gl[a-z]+-|xox|"
    r"hooks|[sr]k_|sk-|sq0|eyj|npm|pypi|sg\.|-us\d|[as]k[0-9a-f]{32}|\d{8,10}:|[MN][\w-]{23}\.|discord"
)


# ---- 5. statements in four languages (store/screen/statements.py) ---------------------------------------

_STATEMENT_HINTS = re.compile(
    r"(?i)pass|pw|pin|code|c(?:ó|o)digo|mdp|mot de|contrase|clave|kennwort|passwort|key|cl(?:é|e)|schl(?:ü|u)ssel|"
    r"seed|phrase|semilla|secret|token|jeton|geheim|login|log in|log into|sign in|cred|identifiant|zugang|"
    r"@|ssh|combina|kombination|connexion|usa |use |utilise|benutze|entra|frase|conectar|anmeld|einlogg|router|"
    r"mnemonic|words|lock|combo|keypad|safe|puk|digi|bo(?:î|i)te|caja|port(?:ó|o)n|zahl|kenn|connect|melde|"
    r"user|usuario|utilisateur|benutzer|u:|admin|root|guest|secreto|/|door|gate|t(?:ü|u)r|tor|porte|puerta|"
    r"portail|garage|schloss|tresor|candado|cadenas|contra|wi-?fi|wlan|new|nouv|nuev|neu|dckr|"
    # the rules for a noun-less password, a wallet key, a lock read out, a value "now"
    r"try|essa|prueb|probier|prova|same|m(?:ê|e)me|mism|gleich|stesso|mine|mien|m(?:í|i)[oa]|meins|opens|now|"
    r"currently|actuel|actual|derzeit|zurzeit|privat|privad|priv|interphone|telefonillo|klingel|keller|spind|"
    r"casier|shed|alarm|keypad|locker|code|\d-\d-\d|senha|wachtwoord|parola|box|account|compte|cuenta|konto")


# ---- what the screen runs (store/screen/secrets.py) ------------------------------------------------


def find_shape(text: str) -> str | None:
    """A token shape that is a secret wherever it appears (layer 1), by kind."""
    return _shapes(text)


def find_in_line(line: str) -> str | None:
    """Layers 2-4 on one line; each family runs only on a line holding a word it needs (a cheap first look)."""
    return (_STEMS.search(line) and (_assignments(line) or _prose(line))) or \
        (_HEADER_HINTS.search(line) and _headers(line)) or \
        (_DETECTOR_HINTS.search(line) and _detect_secrets(line)) or None


def names_a_statement(line: str) -> bool:
    """Whether the statement judge (store/screen/statements.py) has a word to read in the line."""
    return _STATEMENT_HINTS.search(line) is not None
