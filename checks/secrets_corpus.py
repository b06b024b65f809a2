"""Generate the labelled secrets corpus (checks/secrets/corpus.jsonl).

    python -m engram_memory.checks.secrets_corpus                      # the committed corpus (seed 20260)
    python -m engram_memory.checks.secrets_corpus --seed 7 --out x.jsonl

Every value is FAKE: drawn from ``random.Random(seed)`` with the right shape (prefix, length,
alphabet) of the real thing, never copied from anywhere. Sentences are composed from parts
(lead-in, qualifier, credential word, "for the ..." phrase, connector, value, tail), so another
seed gives other phrasings as well as other values; ``engram-memory eval-secrets --generated-seed N``
scores such a corpus too. It is the generator the rules were tuned on with another seed, so it is
not held-out data: it shows the rules generalise across values and phrasings of the same parts.

Each line: {"text", "label": "secret"|"benign", "kind", "where"} where "where" is the candidate
field the text is placed in (text, component_id, citation_id, type_ref, locator, source_ref,
evidence_ref, attestation). The five hand-tried strings of the "Prove it" issue are included
verbatim (with "source": "hand-tried").

Stdlib only; a module of the checks package (checks/secrets_eval.py imports it).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import random
import string
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

SEED = 20260
OUT = Path(__file__).resolve().parent / "secrets" / "corpus.jsonl"

B62 = string.ascii_letters + string.digits
B64 = B62 + "+/"
B64URL = B62 + "-_"
HEX = "0123456789abcdef"
UPPER32 = string.ascii_uppercase + "234567"
LOWER32 = string.ascii_lowercase + "234567"

HAND_TRIED_GOOGLE = "AIzaSyD3fK9wQx1Lm7Pn2Rt8Vz4Yb6Hc0Jg5Ues"  # AIza + 35 characters, made up

HAND_TRIED: list[dict[str, Any]] = [
    {"text": "The admin password for the staging console is hunter2-Winter2026!", "kind": "prose_password",
     "where": "text"},
    {"text": "The admin password is hunter2", "kind": "prose_password", "where": "text"},
    {"text": "pwd: correcthorsebatterystaple", "kind": "prose_password", "where": "text"},
    {"text": HAND_TRIED_GOOGLE, "kind": "google_key", "where": "text"},
    {"text": "postgresql://user:pass@host/db", "kind": "connection_string", "where": "component_id"},
    {"text": "postgresql://user:pass@host/db", "kind": "connection_string", "where": "citation_id"},
    {"text": "postgresql://user:pass@host/db", "kind": "connection_string", "where": "type_ref"},
]

ID_MAX_BYTES = 512  # an opaque reference's bound (models/limits.py OPAQUE_MAX_BYTES)
ID_FIELDS = ["component_id", "citation_id", "type_ref", "locator", "source_ref", "evidence_ref", "attestation"]


class Gen:
    """Random fake values of the right shapes, and the sentence parts they go in."""

    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)

    # -- primitives ---------------------------------------------------------------------------

    def s(self, alphabet: str, n: int) -> str:
        return "".join(self.r.choice(alphabet) for _ in range(n))

    def pick(self, items: Sequence[Any]) -> Any:
        return self.r.choice(items)

    def chance(self, p: float) -> bool:
        return self.r.random() < p

    def hexs(self, n: int) -> str:
        return self.s(HEX, n)

    def b64(self, nbytes: int, url: bool = False) -> str:
        raw = bytes(self.r.getrandbits(8) for _ in range(nbytes))
        out = base64.urlsafe_b64encode(raw) if url else base64.b64encode(raw)
        return out.decode().rstrip("=") if url else out.decode()

    def uuid(self) -> str:
        h = self.hexs(32)
        return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{self.pick('89ab')}{h[17:20]}-{h[20:32]}"

    def host(self) -> str:
        return self.pick(["db.internal", "pg-prod-1.corp.example", "10.0.3.17", "localhost", "mysql.staging.lan",
                          "cache-01", "broker.svc.cluster.local", "smtp.mailhost.example", "db", "primary.rds.example",
                          "cluster0.ab1cd.mongodb.net", "git.example.org", "replica-2.example.net"])

    def user(self) -> str:
        return self.pick(["admin", "app", "svc_billing", "root", "deploy", "postgres", "readonly", "etl", "grafana",
                          "jenkins", "alice", "bob.smith", "backup", "default", "api", "reporter"])

    WORDS = ["orange", "falcon", "meadow", "copper", "violet", "harbor", "pickle", "summit", "lantern", "cactus",
             "marble", "tundra", "walnut", "saffron", "glacier", "pepper", "rocket", "velvet", "thunder", "mango",
             "horse", "battery", "staple", "purple", "monkey", "dishwasher", "zebra", "quartz", "biscuit", "nimbus",
             "dragon", "sunflower", "penguin", "swordfish", "bluebird", "kettle", "hammock", "tornado", "wombat"]

    def password(self) -> str:
        """A password as people set them: word+digits, seasons, symbols, random strings, passphrases."""
        kind = self.r.randrange(9)
        w = self.pick(self.WORDS)
        if kind == 0:
            return w + str(self.r.randrange(1, 999))
        if kind == 1:
            return self.pick(["Winter", "Summer", "Spring", "Autumn", "Welcome", "Company", "Hunter"]) + \
                str(self.r.randrange(2015, 2031)) + self.pick("!@#$%&*?")
        if kind == 2:
            return self.s(B62 + "!@#$%^&*-_=+", self.r.randrange(12, 25))
        if kind == 3:
            return w.capitalize() + self.pick("!@#$") + str(self.r.randrange(10, 99)) + self.pick(self.WORDS)
        if kind == 4:
            return "".join(self.r.sample(self.WORDS, 4))
        if kind == 5:
            return self.pick(["-", ".", "_"]).join(self.r.sample(self.WORDS, self.r.randrange(3, 5)))
        if kind == 6:
            leet = str.maketrans({"a": "@", "e": "3", "o": "0", "i": "1", "s": "$"})
            return w.capitalize().translate(leet) + str(self.r.randrange(1, 99))
        if kind == 7:
            return self.s(string.ascii_lowercase + string.digits, self.r.randrange(10, 17))
        return self.s(B62, self.r.randrange(16, 33))

    def pin(self) -> str:
        return self.s(string.digits, self.pick([4, 4, 5, 6, 6, 8]))

    def token(self) -> str:
        """An opaque token or API key of some provider-independent shape."""
        kind = self.r.randrange(5)
        if kind == 0:
            return self.hexs(self.pick([32, 40, 64]))
        if kind == 1:
            return self.b64(self.pick([24, 32, 48]), url=True)
        if kind == 2:
            return self.s(B62, self.pick([24, 32, 40]))
        if kind == 3:
            return self.uuid()
        return self.b64(32)

    def jwt(self) -> str:
        header = {"alg": self.pick(["HS256", "RS256", "ES256"]), "typ": "JWT"}
        claims = {"sub": str(self.r.randrange(10**6, 10**9)), "name": self.user(),
                  "iat": self.r.randrange(1_600_000_000, 1_800_000_000),
                  "exp": self.r.randrange(1_800_000_000, 1_900_000_000)}
        if self.chance(0.5):
            claims["scope"] = self.pick(["read:all", "admin", "repo write:packages", "openid email"])

        def enc(obj: dict[str, Any]) -> str:
            return base64.urlsafe_b64encode(json.dumps(obj, separators=(",", ":")).encode()).decode().rstrip("=")

        return f"{enc(header)}.{enc(claims)}.{self.b64(32, url=True)}"

    # provider keys, each with the documented shape
    def aws_id(self) -> str:
        return self.pick(["AKIA", "AKIA", "ASIA"]) + self.s(UPPER32, 16)

    def aws_secret(self) -> str:
        return self.s(B64, 40)

    def github(self) -> str:
        if self.chance(0.25):
            return "github_pat_" + self.s(B62, 22) + "_" + self.s(B62, 59)
        return self.pick(["ghp_", "ghp_", "gho_", "ghs_", "ghu_", "ghr_"]) + self.s(B62, 36)

    def gitlab(self) -> str:
        return self.pick(["glpat-", "glpat-", "gldt-", "glrt-", "glptt-"]) + self.s(B64URL, 20)

    def slack(self) -> str:
        kind = self.r.randrange(3)
        if kind == 0:
            return f"xoxb-{self.s(string.digits, 12)}-{self.s(string.digits, 13)}-{self.s(B62, 24)}"
        if kind == 1:
            return f"xoxp-{self.s(string.digits, 12)}-{self.s(string.digits, 12)}-{self.s(string.digits, 13)}-" \
                   f"{self.hexs(32)}"
        return f"https://hooks.slack.com/services/T{self.s(UPPER32, 8)}/B{self.s(UPPER32, 10)}/{self.s(B62, 24)}"

    def stripe(self) -> str:
        prefix = self.pick(["sk_live_", "sk_live_", "sk_test_", "rk_live_", "whsec_"])
        return prefix + self.s(B62, self.pick([24, 32, 99]) if prefix != "whsec_" else 32)

    def google(self) -> str:
        kind = self.r.randrange(4)
        if kind <= 1:
            return "AIza" + self.s(B64URL, 35)
        if kind == 2:
            return "GOCSPX-" + self.s(B64URL, 28)
        return "ya29." + self.s(B64URL, self.r.randrange(80, 160))

    def openai(self) -> str:
        kind = self.r.randrange(4)
        if kind == 0:
            return "sk-proj-" + self.s(B64URL, 156)
        if kind == 1:
            return "sk-" + self.s(B62, 20) + "T3BlbkFJ" + self.s(B62, 20)
        if kind == 2:
            return "sk-ant-api03-" + self.s(B64URL, 93) + "AA"
        return "sk-svcacct-" + self.s(B64URL, 100)

    def other_provider(self) -> str:
        kind = self.r.randrange(8)
        return [
            lambda: "npm_" + self.s(B62, 36),
            lambda: "pypi-AgEIcHlwaS5vcmc" + self.s(B64URL, 60),
            lambda: "SG." + self.s(B64URL, 22) + "." + self.s(B64URL, 43),
            lambda: "hf_" + self.s(string.ascii_letters, 34),
            lambda: "dop_v1_" + self.hexs(64),
            lambda: "hvs." + self.s(B62, 24),
            lambda: "shpat_" + self.hexs(32),
            lambda: f"{self.s(string.digits, 10)}:AA{self.s(B64URL, 33)}",
        ][kind]()

    def pem_private(self) -> str:
        label = self.pick(["RSA PRIVATE KEY", "PRIVATE KEY", "EC PRIVATE KEY", "OPENSSH PRIVATE KEY",
                           "ENCRYPTED PRIVATE KEY", "DSA PRIVATE KEY", "PGP PRIVATE KEY BLOCK"])
        size = {"RSA PRIVATE KEY": 1190, "PRIVATE KEY": 1216, "EC PRIVATE KEY": 121, "OPENSSH PRIVATE KEY": 300,
                "ENCRYPTED PRIVATE KEY": 1250, "DSA PRIVATE KEY": 440, "PGP PRIVATE KEY BLOCK": 900}[label]
        if self.chance(0.4):
            size = min(size, 121)  # short enough for an id field
        body = base64.b64encode(bytes(self.r.getrandbits(8) for _ in range(size))).decode()
        if label == "OPENSSH PRIVATE KEY":
            body = "b3BlbnNzaC1rZXktdjEAAAAA" + body
        lines = [body[i:i + 64] for i in range(0, len(body), 64)]
        return f"-----BEGIN {label}-----\n" + "\n".join(lines) + f"\n-----END {label}-----"

    def ssh_public(self) -> str:
        kind = self.pick(["ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256"])
        prefix = {"ssh-ed25519": "AAAAC3NzaC1lZDI1NTE5AAAAI", "ssh-rsa": "AAAAB3NzaC1yc2EAAAADAQABAAABAQ",
                  "ecdsa-sha2-nistp256": "AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBB"}[kind]
        n = {"ssh-ed25519": 43, "ssh-rsa": 340, "ecdsa-sha2-nistp256": 90}[kind]
        return f"{kind} {prefix}{self.s(B64, n)} {self.user()}@{self.pick(['laptop', 'ci-runner', 'bastion'])}"

    def pem_public(self) -> str:
        label = self.pick(["PUBLIC KEY", "RSA PUBLIC KEY", "CERTIFICATE", "PGP PUBLIC KEY BLOCK"])
        body = base64.b64encode(bytes(self.r.getrandbits(8) for _ in range(self.pick([91, 270, 700])))).decode()
        lines = [body[i:i + 64] for i in range(0, len(body), 64)]
        return f"-----BEGIN {label}-----\n" + "\n".join(lines) + f"\n-----END {label}-----"

    def sha256(self) -> str:
        return "sha256:" + hashlib.sha256(self.s(B62, 20).encode()).hexdigest()

    def mem_id(self) -> str:
        return "mem_" + self.s(LOWER32, 52)


# ---- secret generators: each returns (text, kind) ---------------------------------------------------

LEADS = ["", "", "", "FYI: ", "Note: ", "Heads up, ", "For the record, ", "Ops handover: ", "From the runbook: ",
         "Per Slack: ", "Reminder - ", "As discussed, ", "In case you need it, "]
TAILS = ["", "", "", ".", ".", " (do not share).", " - rotate after the migration.", ", until Friday.",
         " for now.", ". Ask Dana if it stops working.", " (temporary)."]
QUALIFIERS = ["", "", "admin ", "root ", "new ", "default ", "wifi ", "VPN ", "database ", "db ", "staging ", "prod ",
              "service account ", "console ", "jenkins ", "grafana ", "master ", "backup ", "old ", "shared "]
MIDS = ["", "", "", " for the staging console", " for the prod database", " on the build box", " we use for Grafana",
        " for svc_billing", " (staging)", " for the office wifi", " to the admin panel", " of the backup server",
        " that ops gave us", " for the Jenkins user", " used by the nightly ETL"]
P_WORDS = ["password", "password", "password", "Password", "passphrase", "passwd", "pass phrase", "passcode"]
CONNECT = [" is ", " is ", " is ", " was ", ": ", " = ", " is now ", " has been changed to ", " is still ",
           " got reset to ", " - "]


def secret_prose_password(g: Gen) -> tuple[str, str]:
    pw = g.password()
    if g.chance(0.15):
        quote = g.pick(["'", '"', "`", "\u201c"])
        pw = quote + pw + {"'": "'", '"': '"', "`": "`", "\u201c": "\u201d"}[quote]
    form = g.r.randrange(10)
    lead, tail = g.pick(LEADS), g.pick(TAILS)
    article = g.pick(["The ", "the ", "Our ", "My ", "Your ", ""])
    if form <= 4:
        text = f"{lead}{article}{g.pick(QUALIFIERS)}{g.pick(P_WORDS)}{g.pick(MIDS)}{g.pick(CONNECT)}{pw}{tail}"
    elif form == 5:
        text = f"{lead}Use {pw} as the {g.pick(QUALIFIERS)}{g.pick(P_WORDS)}{tail}"
    elif form == 6:
        text = f"{lead}I set the {g.pick(QUALIFIERS)}{g.pick(P_WORDS)} to {pw}{tail}"
    elif form == 7:
        qualifier, word = g.pick(QUALIFIERS), g.pick(["password", "passphrase"])
        text = f"{lead}{pw} is the {qualifier}{word}{g.pick(['', '.', ' for now.'])}"
    elif form == 8:
        text = f"{lead}Log in as {g.user()} with password {pw}{tail}"
    else:
        text = f"{lead}{g.pick(['pwd', 'pw', 'PWD', 'Password', 'pass'])}: {pw}"
    return text.strip(), "prose_password"


def secret_prose_pin(g: Gen) -> tuple[str, str]:
    pin = g.pin()
    text = g.pick([
        f"The {g.pick(['alarm', 'door', 'SIM', 'admin', 'card', 'safe'])} PIN is {pin}",
        f"PIN: {pin}",
        f"{g.pick(LEADS)}the passcode{g.pick(MIDS)} is {pin}{g.pick(TAILS)}",
        f"Passcode for the {g.pick(['server room', 'lockbox', 'phone', 'iPad'])} = {pin}",
        f"The PIN code for the office safe was changed to {pin}.",
        f"Use {pin} as the PIN{g.pick(TAILS)}",
        f"The {g.pick(['voicemail', 'YubiKey', 'smartcard'])} PIN number is {pin}",
    ])
    return text, "prose_pin"


T_WORDS = ["secret key", "API key", "api key", "access token", "auth token", "client secret", "signing secret",
           "webhook secret", "token", "secret", "private key", "bearer token", "refresh token", "session token",
           "encryption key", "master key", "signing key", "API token", "access key", "credentials"]


def secret_prose_secret(g: Gen) -> tuple[str, str]:
    value = g.pick([g.token(), g.token(), g.hexs(40), g.b64(32), g.s(B62, 32)])
    word = g.pick(T_WORDS)
    form = g.r.randrange(5)
    lead, tail = g.pick(LEADS), g.pick(TAILS)
    if form <= 2:
        article = g.pick(["The ", "the ", "Our ", "Their "])
        owner = g.pick(["", "prod ", "staging ", "Mailgun ", "Twilio ", "partner "])
        mid = g.pick(MIDS)
        connect = g.pick([" is ", " is ", ": ", " = ", " was rotated to ", " is now "])
        text = f"{lead}{article}{owner}{word}{mid}{connect}{value}{tail}"
    elif form == 3:
        text = f"{lead}Set the {word} to {value}{tail}"
    else:
        text = f"{lead}Use {value} as the {word}{tail}"
    return text.strip(), "prose_secret"


ENV_P = ["DB_PASSWORD", "POSTGRES_PASSWORD", "MYSQL_ROOT_PASSWORD", "REDIS_PASSWORD", "SMTP_PASSWORD", "ADMIN_PASS",
         "DB_PASS", "RABBITMQ_DEFAULT_PASS", "LDAP_BIND_PASSWORD", "PGPASSWORD", "KEYSTORE_PASSWORD",
         "ELASTIC_PASSWORD"]
ENV_T = ["API_KEY", "SECRET_KEY", "JWT_SECRET", "SESSION_SECRET", "STRIPE_SECRET_KEY", "GITHUB_TOKEN",
"SLACK_BOT_TOKEN",
         "AWS_SECRET_ACCESS_KEY", "SENTRY_AUTH_TOKEN", "NPM_TOKEN", "ENCRYPTION_KEY", "CLIENT_SECRET",
         "OAUTH_CLIENT_SECRET", "MAILGUN_API_KEY", "OPENAI_API_KEY", "DATADOG_API_KEY", "APP_SECRET", "AUTH_TOKEN",
         "HMAC_SECRET", "WEBHOOK_SECRET", "PRIVATE_TOKEN", "ACCESS_TOKEN"]
BENIGN_ENV = ["PORT=8080", "LOG_LEVEL=debug", "NODE_ENV=production", "DB_HOST=db.internal", "DB_USER=app",
              "TZ=UTC", "WORKERS=4", "FEATURE_FLAGS=search,export", "REDIS_URL=redis://cache:6379/0"]


def _env_value(g: Gen, name: str) -> str:
    if "PASS" in name:
        return g.password()
    if name == "AWS_SECRET_ACCESS_KEY":
        return g.aws_secret()
    if name == "GITHUB_TOKEN":
        return g.github()
    if name == "STRIPE_SECRET_KEY":
        return g.stripe()
    if name == "SLACK_BOT_TOKEN":
        return f"xoxb-{g.s(string.digits, 12)}-{g.s(string.digits, 13)}-{g.s(B62, 24)}"
    if name == "OPENAI_API_KEY":
        return g.openai()
    return g.token()


def secret_dotenv(g: Gen) -> tuple[str, str]:
    name = g.pick(ENV_P + ENV_T)
    value = _env_value(g, name)
    q = g.pick(["", "", '"', "'"])
    line = f"{name}={q}{value}{q}"
    if g.chance(0.5):
        others = g.r.sample(BENIGN_ENV, g.r.randrange(1, 4))
        lines = others + [line]
        g.r.shuffle(lines)
        return "\n".join(lines), "dotenv"
    return line, "dotenv"


def secret_shell(g: Gen) -> tuple[str, str]:
    name = g.pick(ENV_P + ENV_T)
    value = _env_value(g, name)
    form = g.r.randrange(8)
    text = [
        f"export {name}={value}",
        f"export {name}=\"{value}\"",
        f"{name}='{value}' ./deploy.sh",
        f"docker run -e {name}={value} myapp:latest",
        f"$env:{name} = \"{value}\"",
        f"set {name}={value}",
        f"kubectl create secret generic app --from-literal=password={g.password()}",
        g.pick([f"mysql -u {g.user()} -p{g.password()} -h {g.host()}",
                f"curl -u {g.user()}:{g.password()} https://{g.host()}/api/v1/status",
                f"sshpass -p '{g.password()}' ssh {g.user()}@{g.host()}",
                f"docker login -u {g.user()} -p {g.token()} registry.example.com",
                f"psql --username={g.user()} --password={g.password()} app",
                f"vault login -method=userpass username={g.user()} password={g.password()}"]),
    ][form]
    return text, "shell_export"


YAML_KEYS_P = ["password", "db_password", "admin_password", "passphrase", "smtp_pass", "bind_password", "pwd"]
YAML_KEYS_T = ["api_key", "apiKey", "secret_key", "client_secret", "token", "access_token", "auth_token", "secret",
               "private_token", "signing_key", "webhook_secret", "clientSecret", "accessKey", "secretAccessKey"]


def _config_value(g: Gen, key: str) -> str:
    if key in YAML_KEYS_P or "pass" in key.lower():
        return g.password()
    if key in ("accessKey",):
        return g.aws_id()
    if key in ("secretAccessKey",):
        return g.aws_secret()
    return g.token()


def secret_yaml(g: Gen) -> tuple[str, str]:
    key = g.pick(YAML_KEYS_P + YAML_KEYS_T)
    value = _config_value(g, key)
    q = g.pick(["", "", '"', "'"])
    section = g.pick(["database", "smtp", "auth", "stripe", "services.api", "credentials", "spring.datasource"])
    form = g.r.randrange(3)
    if form == 0:
        text = f"{key}: {q}{value}{q}"
    elif form == 1:
        text = f"{section}:\n  host: {g.host()}\n  user: {g.user()}\n  {key}: {q}{value}{q}\n  port: 5432"
    else:
        text = f"- name: {g.pick(['deploy', 'ci', 'svc'])}\n  {key}: {q}{value}{q}"
    return text, "config_yaml"


def secret_ini(g: Gen) -> tuple[str, str]:
    key = g.pick(YAML_KEYS_P + YAML_KEYS_T + ["Password", "pass", "secret_access_key"])
    value = _config_value(g, key)
    section = g.pick(["[database]", "[client]", "[default]", "[smtp]", "[mysql]", "[api]"])
    text = g.pick([f"{section}\nhost = {g.host()}\n{key} = {value}", f"{key}={value}", f"{key} = {value}",
                   f"{section}\nuser={g.user()}\n{key}={value}"])
    return text, "config_ini"


def secret_json(g: Gen) -> tuple[str, str]:
    key = g.pick(YAML_KEYS_P + YAML_KEYS_T + ["password", "apiKey", "client_secret"])
    value = _config_value(g, key)
    other = {"host": g.host(), "user": g.user(), "port": g.pick([5432, 3306, 6379, 443])}
    form = g.r.randrange(3)
    if form == 0:
        obj = {**other, key: value}
        text = json.dumps(obj)
    elif form == 1:
        text = json.dumps({"service": g.pick(["billing", "search", "auth"]), "credentials": {key: value}}, indent=2)
    else:
        text = f'{{"{key}":"{value}"}}'
    return text, "config_json"


def secret_connection(g: Gen) -> tuple[str, str]:
    pw = g.pick([g.password(), g.s(B62, 16), g.pick(g.WORDS) + str(g.r.randrange(100))])
    from urllib.parse import quote

    pw_url = quote(pw, safe="")
    u, h = g.user(), g.host()
    form = g.r.randrange(13)
    url = [
        f"postgres://{u}:{pw_url}@{h}:5432/app",
        f"postgresql://{u}:{pw_url}@{h}/{g.pick(['app', 'billing', 'analytics'])}?sslmode=require",
        f"mysql://{u}:{pw_url}@{h}:3306/shop",
        f"mongodb+srv://{u}:{pw_url}@cluster0.{g.s(string.ascii_lowercase + string.digits, 5)}.mongodb.net/prod",
        f"mongodb://{u}:{pw_url}@{h}:27017/admin?authSource=admin",
        f"redis://:{pw_url}@{h}:6379/0",
        f"rediss://default:{pw_url}@{h}:6380",
        f"amqp://{u}:{pw_url}@{h}:5672/%2f",
        f"smtp://{u}:{pw_url}@smtp.{g.pick(['mailgun.org', 'sendgrid.net', 'example.com'])}:587",
        f"https://{u}:{pw_url}@git.example.org/team/repo.git",
        f"jdbc:postgresql://{h}:5432/app?user={u}&password={pw_url}",
        f"Server={h};Database=App;User Id={u};Password={pw};",
        f"DefaultEndpointsProtocol=https;AccountName={u.replace('_', '')}store;AccountKey={g.b64(64)};"
        "EndpointSuffix=core.windows.net",
    ][form]
    if g.chance(0.3):
        url = g.pick([f"DATABASE_URL={url}", f"The DSN is {url}", f"connect with {url}", f"dsn: \"{url}\""])
    return url, "connection_string"


def secret_jwt(g: Gen) -> tuple[str, str]:
    t = g.jwt()
    return g.pick([t, f"token: {t}", f"The session JWT was {t}", f"id_token={t}", f"{{\"access_token\": \"{t}\"}}",
                   f"Decoded this one from the logs: {t}"]), "jwt"


def secret_bearer(g: Gen) -> tuple[str, str]:
    tok = g.pick([g.token(), g.s(B64URL, 40), g.jwt(), g.github()])
    form = g.r.randrange(6)
    text = [
        f"Authorization: Bearer {tok}",
        f"curl -H \"Authorization: Bearer {tok}\" https://api.example.com/v2/users",
        f"headers = {{'Authorization': 'Bearer {tok}'}}",
        f"Authorization: Basic {base64.b64encode(f'{g.user()}:{g.password()}'.encode()).decode()}",
        f"Send it with bearer {tok}",
        f"Authorization: token {tok}",
    ][form]
    return text, "bearer_token"


PROVIDERS: dict[str, Callable[[Gen], str]] = {
    "github_token": Gen.github, "gitlab_token": Gen.gitlab, "slack_token": Gen.slack, "stripe_key": Gen.stripe,
    "aws_key": Gen.aws_id, "google_key": Gen.google, "openai_key": Gen.openai, "provider_key": Gen.other_provider,
}
PROVIDER_FRAMES = ["{v}", "{v}", "key: {v}", "Use {v} for the CI job", "{v} (prod)", "value was {v}",
                   "Found {v} in the old notebook", "token={v}", "`{v}`", "The key {v} belongs to the billing bot"]


def make_provider(kind: str) -> Callable[[Gen], tuple[str, str]]:
    def make(g: Gen) -> tuple[str, str]:
        value = PROVIDERS[kind](g)
        if kind == "aws_key" and g.chance(0.5):
            return (f"aws_access_key_id = {value}\naws_secret_access_key = {g.aws_secret()}"
                    if g.chance(0.5) else f"AWS secret access key: {g.aws_secret()}"), kind
        return g.pick(PROVIDER_FRAMES).format(v=value), kind

    return make


def secret_signing(g: Gen) -> tuple[str, str]:
    k = g.pick([g.hexs(64), g.b64(32), g.b64(64), "django-insecure-" + g.s(B62 + "!@#$%^&*(-_=+)", 50)])
    return g.pick([
        f"SECRET_KEY = '{k}'", f"JWT_SIGNING_KEY={k}", f"signing_key: {k}", f"The HMAC signing key is {k}",
        f"webhook signing secret: {k}", f"jwt:\n  secret: {k}\n  ttl: 3600", f"app.config['SECRET_KEY'] = \"{k}\"",
        f"cookie_secret = \"{k}\"", f"APP_KEY=base64:{g.b64(32)}",
    ]), "signing_key"


def secret_cookie(g: Gen) -> tuple[str, str]:
    sid = g.pick([g.hexs(32), g.s(B62, 26), g.b64(48, url=True), "s%3A" + g.s(B62, 32) + "." + g.s(B64URL, 43)])
    name = g.pick(["sessionid", "JSESSIONID", "PHPSESSID", "connect.sid", "_myapp_session", "session", "sid",
                   "ASP.NET_SessionId", "__Host-session", "auth_token", "remember_user_token", "_gh_sess"])
    return g.pick([
        f"Cookie: {name}={sid}",
        f"Cookie: theme=dark; {name}={sid}; lang=en",
        f"Set-Cookie: {name}={sid}; Path=/; Secure; HttpOnly; SameSite=Lax",
        f"set-cookie: {name}={sid}; Max-Age=1209600; HttpOnly",
        f"Replay the request with Cookie: {name}={sid}",
    ]), "session_cookie"


def secret_private_key(g: Gen) -> tuple[str, str]:
    pem = g.pem_private()
    form = g.r.randrange(5)
    if form == 0:
        return pem, "private_key"
    if form == 1:
        return json.dumps({"type": "service_account", "project_id": "demo-123", "private_key_id": g.hexs(40),
                           "private_key": pem + "\n", "client_email": "svc@demo-123.iam.gserviceaccount.com"}), \
            "private_key"
    if form == 2:
        return f"Here is the deploy key:\n{pem}", "private_key"
    if form == 3:
        return "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: deploy\nPublic-Lines: 2\n" + \
            g.b64(51) + "\nPrivate-Lines: 1\n" + g.b64(48), "private_key"
    jwk = {"kty": "EC", "crv": "P-256", "x": g.b64(32, url=True), "y": g.b64(32, url=True), "d": g.b64(32, url=True)}
    return json.dumps(jwk), "private_key"


def secret_query(g: Gen) -> tuple[str, str]:
    key = g.pick(["api_key", "apikey", "access_token", "token", "key", "client_secret", "sig", "password"])
    from urllib.parse import quote

    value = quote(g.token() if key != "password" else g.password(), safe="")  # a URL encodes its values
    api, path = g.pick(["weather", "maps", "payments", "crm"]), g.pick(["items", "search", "geocode"])
    url = f"https://api.{api}.example.com/v1/{path}" \
          f"?q={g.pick(['paris', 'latest', 'x'])}&{key}={value}"
    if key in ("key", "sig"):  # a bare "key"/"sig" parameter is told apart by a provider shape only
        url = url.rsplit("=", 1)[0] + "=" + "AIza" + g.s(B64URL, 35)
    return url, "url_query_credential"


SECRET_KINDS: dict[str, tuple[Callable[[Gen], tuple[str, str]], int]] = {
    "prose_password": (secret_prose_password, 50),
    "prose_pin": (secret_prose_pin, 16),
    "prose_secret": (secret_prose_secret, 26),
    "dotenv": (secret_dotenv, 26),
    "shell_export": (secret_shell, 20),
    "config_yaml": (secret_yaml, 20),
    "config_ini": (secret_ini, 16),
    "config_json": (secret_json, 16),
    "connection_string": (secret_connection, 32),
    "jwt": (secret_jwt, 14),
    "bearer_token": (secret_bearer, 16),
    "signing_key": (secret_signing, 16),
    "session_cookie": (secret_cookie, 16),
    "private_key": (secret_private_key, 16),
    "url_query_credential": (secret_query, 10),
    **{kind: (make_provider(kind), 12) for kind in PROVIDERS},
}

# ---- benign look-alikes -----------------------------------------------------------------------------


def benign_policy(g: Gen) -> tuple[str, str]:
    subj = g.pick(["Passwords", "Admin passwords", "Service account passwords", "API keys", "Tokens", "Passphrases",
                   "Access tokens", "Client secrets", "PINs", "Passcodes", "Signing keys", "Refresh tokens"])
    sing = g.pick(["password", "API key", "token", "passphrase", "client secret", "PIN", "signing key", "secret"])
    n = g.pick([8, 12, 14, 16, 20, 32, 64])
    return g.pick([
        f"{subj} must be at least {n} characters long.",
        f"Rotate the {sing} every {g.pick([30, 60, 90, 180])} days.",
        f"The {sing} field is hashed with {g.pick(['argon2id', 'bcrypt', 'scrypt', 'PBKDF2-SHA256'])}.",
        f"The {sing} is hashed with {g.pick(['argon2id', 'bcrypt (cost 12)', 'scrypt'])} before it is stored.",
        f"The {sing} is never logged; it is masked in the audit trail.",
        f"{subj} are stored in Vault, not in the repository.",
        f"The {sing} is required for every environment except local.",
        f"Password: must contain {g.pick(['a digit and a symbol', 'at least one uppercase letter', 'no spaces'])}.",
        f"The {sing} is case-sensitive and expires after {g.pick([15, 30, 60])} minutes.",
        f"The admin {sing} was rotated on {g.pick(['Monday', '2026-03-01', 'the 14th'])} after the audit.",
        f"We decided that the {sing} is generated per tenant and shown once.",
        f"{subj} expire after {g.pick([1, 7, 12])} hours; refresh tokens after {g.pick([7, 30])} days.",
        f"Never paste the {sing} into chat; use the secrets manager link instead.",
        f"The {sing} policy requires {n}+ characters and blocks the 10k most common passwords.",
        f"Reset the {sing} from the console if it is compromised.",
        f"The password reset flow sends a one-time link valid for {g.pick([10, 15, 30])} minutes.",
        f"The PIN is {g.pick([4, 6, 8])} digits and locks after {g.pick([3, 5])} attempts.",
        "The API key is passed in the X-Api-Key header, never in the query string.",
        f"The token is a JWT signed with {g.pick(['RS256', 'ES256', 'HS256'])}.",
        f"The secret is stored in AWS Secrets Manager under {g.pick(['prod/db', 'billing/stripe', 'ci/npm'])}.",
        f"password length: {n}",
        f"The passphrase is {g.pick(['4', '5', '6'])} random words from the EFF list.",
        f"The {sing} was correct, but the account was locked.",
        f"The {sing} is the same across staging and prod, which we want to fix.",
        f"Use a password manager to generate the {sing}.",
        "The client secret is only needed for the confidential client flow.",
    ]), "policy_prose"


def benign_placeholder(g: Gen) -> tuple[str, str]:
    ph = g.pick(["<your-password>", "<password>", "changeme", "CHANGE_ME", "xxxx", "xxxxxxxx", "****", "********",
                 "REDACTED", "[REDACTED]", "<redacted>", "your-api-key-here", "YOUR_API_KEY", "<token>", "...",
                 "\u2022\u2022\u2022\u2022\u2022\u2022", "TODO", "example", "dummy", "placeholder", "<secret>",
                 "your_secret_here", "replace-me", "{{ password }}", "%s", "<insert-token-here>"])
    key = g.pick(["password", "API_KEY", "DB_PASSWORD", "token", "client_secret", "SECRET_KEY", "apiKey", "pwd",
                  "access_token", "passphrase"])
    return g.pick([
        f"{key}: {ph}", f"{key}={ph}", f'"{key}": "{ph}"', f"{key} = \"{ph}\"", f"export {key}={ph}",
        f"postgres://{g.user()}:{ph}@{g.host()}:5432/app", f"Authorization: Bearer {ph}",
        f"Set {key} to {ph} in your local .env", f"Cookie: sessionid={ph}", f"The password is {ph}",
        f"curl -u {g.user()}:{ph} https://api.example.com", f"mysql://{g.user()}:{ph}@{g.host()}/shop",
    ]), "placeholder"


def benign_reference(g: Gen) -> tuple[str, str]:
    var = g.pick(["DB_PASSWORD", "API_TOKEN", "STRIPE_SECRET_KEY", "GITHUB_TOKEN", "REDIS_PASSWORD", "JWT_SECRET"])
    return g.pick([
        f"password: ${{{var}}}", f"DB_PASSWORD=${{{var}}}", f"postgres://app:${{{var}}}@db:5432/app",
        f"token: ${{{{ secrets.{var} }}}}", f"password = os.environ[\"{var}\"]", f"api_key = os.getenv(\"{var}\")",
        f"password_file: /run/secrets/{var.lower()}", f"api_key: op://Engineering/{var}/credential",
        f"secret: arn:aws:secretsmanager:eu-west-1:123456789012:secret:prod/{var.lower()}-AbCdEf",
        "password: !vault |\n  $ANSIBLE_VAULT;1.1;AES256", f"db_password: !secret {var.lower()}",
        "valueFrom:\n  secretKeyRef:\n    name: db-credentials\n    key: password",
        f"token = settings.{var}", "password = getpass.getpass(\"DB password: \")",
        f"export {var}=$(cat /run/secrets/x)",
        f"client_secret: vault:secret/data/oauth#{var.lower()}", f"Authorization: Bearer ${var}",
        f"the {g.pick(['password', 'token', 'API key'])} lives in 1Password under \"{var}\"",
        f"password: process.env.{var}", f"PGPASSWORD=${var} psql -h db app",
        f"secretRef: projects/demo-123/secrets/{var.lower()}/versions/latest",
    ]), "secret_reference"


def benign_digest(g: Gen) -> tuple[str, str]:
    h40, h64, h32 = g.hexs(40), g.hexs(64), g.hexs(32)
    return g.pick([
        g.sha256(), f"content_digest: {g.sha256()}",
        f"Commit {h40[:g.pick([7, 8, 12, 40])]} fixed the flaky retry test.",
        f"md5 of the tarball is {h32}", f"sha1sum: {h40}  release.tar.gz", f"checksum: {h64}",
        f"ETag: \"{h32}\"", f"image: registry.example.com/api@sha256:{h64}", f"git SHA {h40}",
        f"integrity: sha384-{g.b64(48)}", f"password_hash: $2b$12${g.s(B62 + './', 53)}",
        f"The stored password hash is $argon2id$v=19$m=65536,t=3,p=4${g.b64(16)}${g.b64(32)}",
        f"The record digest is {g.sha256()} and the payload digest {g.sha256()}.",
        f"fingerprint SHA256:{g.b64(32).rstrip('=')}", f"evidence_digest={g.sha256()}",
    ]), "digest"


def benign_uuid(g: Gen) -> tuple[str, str]:
    u = g.uuid()
    return g.pick([u, f"request id {u}", f"trace_id={u}", f"tenant uuid: {u}", f"The failing job was {u}.",
                   f"correlation-id: {u}", f"{{\"id\": \"{u}\", \"status\": \"ok\"}}",
                   f"user {u} was migrated"]), "uuid"


def benign_public_key(g: Gen) -> tuple[str, str]:
    form = g.r.randrange(6)
    if form == 0:
        return g.ssh_public(), "public_key"
    if form == 1:
        return g.pem_public(), "public_key"
    if form == 2:
        return f"Add this to authorized_keys: {g.ssh_public()}", "public_key"
    if form == 3:
        return json.dumps({"kty": "RSA", "kid": g.hexs(8), "use": "sig", "alg": "RS256", "n": g.b64(256, url=True),
                           "e": "AQAB"}), "public_key"
    if form == 4:
        return f"public_key: {g.ssh_public()}", "public_key"
    return f"age recipient: age1{g.s(string.ascii_lowercase + string.digits, 58)}", "public_key"


def benign_base64(g: Gen) -> tuple[str, str]:
    raw = g.pick([b'{"alg":"HS256","typ":"JWT"}', b'{"user":"alice","role":"viewer"}', b"hello world",
                  b"The quick brown fox jumps over the lazy dog", b"apiVersion: v1\nkind: ConfigMap",
                  bytes(g.r.getrandbits(8) for _ in range(24))])
    enc = base64.b64encode(raw).decode()
    return g.pick([enc, f"The payload is base64: {enc}", f"data: {enc}",
                   f"data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB{g.b64(30)}",
                   f"The JWT header {base64.urlsafe_b64encode(raw).decode().rstrip('=')} decodes to the alg",
                   f"config.json (base64) = {enc}"]), "base64"


def benign_url(g: Gen) -> tuple[str, str]:
    h = g.host()
    return g.pick([
        f"https://docs.example.com/guide/auth?page={g.r.randrange(9)}#tokens",
        f"git@github.com:acme/{g.pick(['api', 'web'])}.git",
        f"ssh://git@{h}/team/repo.git", f"postgres://{h}:5432/app", f"postgresql://{g.user()}@{h}:5432/app",
        f"redis://{h}:6379/0", f"amqp://{h}:5672", f"https://{h}:8443/health", f"mailto:{g.user()}@example.com",
        f"https://github.com/acme/api/blob/{g.hexs(40)}/auth/password.py#L42",
        "https://wiki.example.com/Security/Password_Policy", f"s3://backups/{g.hexs(8)}/dump.sql.gz",
        "https://example.com/reset-password?step=2", f"jdbc:mysql://{h}:3306/shop?useSSL=true",
        f"smtp://{h}:587", f"https://user@{h}/path",
    ]), "url_plain"


def benign_record_id(g: Gen) -> tuple[str, str]:
    return g.pick([
        g.mem_id(), "candidate_" + g.hexs(64), "aud_" + g.s(LOWER32, 26), f"idk_{g.hexs(12)}",
        f"Record {g.mem_id()} supersedes {g.mem_id()}.", f"record_id: {g.mem_id()}",
        f"candidate_id={'candidate_' + g.hexs(64)}", f"cursor {g.r.randrange(1, 10**6)} of tenant:acme/workspace:main",
    ]), "record_id"


def benign_config(g: Gen) -> tuple[str, str]:
    return g.pick([
        "PASSWORD_MIN_LENGTH=12", "TOKEN_TTL=3600", "SECRET_NAME=prod/db-credentials", "API_KEY_HEADER=X-Api-Key",
        "max_tokens: 4096", "session_timeout: 30m", "password_policy: strict", "auth: oauth2",
        "token_endpoint: https://auth.example.com/oauth/token", "secretName: db-credentials", "primary_key: id",
        "sort_key: created_at", "cache_key: user:{id}", "password_expiry_days = 90", "pin_version: 2.3.1",
        "auth_method = scram-sha-256", "token_type: Bearer", "api_key_prefix: sk_live_", "password: true",
        "enable_passwords: false", "require_mfa = yes", "secret_rotation_days: 30", "next_page_token: null",
        "total_tokens: 18234", "prompt_tokens=512", "PASSWORD_HASHERS = ['argon2']", "session_cookie_secure: true",
        "key_id: 4f1c", "credentials_provider: instance-profile", "auth_token_header = Authorization",
        "password: required", "api_key: string", "token: opaque", "password_reset_url: /account/reset",
        "secret_store: vault", "ssh_key: ~/.ssh/id_ed25519", "pin: 13", "first_pass: true",
    ]), "config_nonsecret"


def benign_code(g: Gen) -> tuple[str, str]:
    return g.pick([
        "password = getpass.getpass()", "token = request.headers.get(\"Authorization\")",
        "api_key: str = Field(..., description=\"The caller's key\")", "const token = await getToken();",
        "password: SecretStr", "if password != confirm_password:\n    raise ValueError('mismatch')",
        "def check_password(password: str) -> bool:", "headers = {\"Authorization\": f\"Bearer {token}\"}",
        "client = Client(api_key=api_key, timeout=30)", "conn = psycopg.connect(host=host, password=db_password)",
        "user.set_password(form.cleaned_data['password'])", "secret_key = load_key(path)",
        "interface Login { username: string; password: string }", "token := os.Getenv(\"API_TOKEN\")",
        "password = hashlib.sha256(salt + raw).hexdigest()", "api_key = config.get('stripe', 'api_key')",
        "if (!token) throw new Error('missing token');", "self.password = None",
        "assert verify(password, stored_hash)", "session_id = uuid.uuid4().hex",
    ]), "code"


def benign_token_talk(g: Gen) -> tuple[str, str]:
    return g.pick([
        "GitHub classic tokens start with ghp_ and fine-grained ones with github_pat_.",
        "Stripe secret keys begin with sk_live_ or sk_test_; publishable keys with pk_.",
        "JWTs have three base64url parts separated by dots.", "AWS access key ids begin with AKIA or ASIA.",
        "The bearer token is passed in the Authorization header.", "Rotate the Slack bot token (xoxb-) every year.",
        "Google API keys start with AIza and are 39 characters long.",
        "OpenAI project keys start with sk-proj-.", "A PEM private key starts with -----BEGIN and is never committed.",
        "We revoked the leaked token within 4 minutes and rotated the signing key.",
        "The token bucket refills 10 tokens per second.", "The tokenizer splits on whitespace and punctuation.",
        "Session cookies are HttpOnly, Secure and SameSite=Lax.", "Use sk-learn-compatible estimators only.",
        "Connection strings live in the vault, never in the repository.",
        "The API key rotation happens monthly, owned by the platform team.",
        "Set the token expiry to 30 minutes for the mobile client.", "Credentials are issued per service account.",
        "The secret scanning job blocks pushes that contain keys.", "pin the dependency to 2.3.1 until the fix ships",
        "The second pass of the compiler inlines small functions.",
        "Primary key on (tenant, id); secret keys never logged.",
    ]), "token_talk"


def benign_cookie(g: Gen) -> tuple[str, str]:
    return g.pick([
        "Set-Cookie: theme=dark; Path=/; Max-Age=31536000", "Cookie: lang=en-US; tz=Europe/Paris",
        "Set-Cookie: session=; Expires=Thu, 01 Jan 1970 00:00:00 GMT; Path=/", "Cookie: consent=yes; theme=light",
        "The cookie consent banner shows on first visit.", "Set-Cookie: locale=fr; SameSite=Strict",
        "Cookie: sessionid=<session-id>", "Cookie: _ga=GA1.2.1234567890.1234567890",
    ]), "cookie_benign"


def benign_identifier(g: Gen) -> tuple[str, str]:
    return g.pick([
        f"cus_{g.s(B62, 14)}", f"Charge ch_{g.s(B62, 24)} was refunded.", f"pi_{g.s(B62, 24)}",
        f"arn:aws:iam::{g.s(string.digits, 12)}:role/deploy",
        f"pod api-{g.hexs(9)}-{g.s(string.ascii_lowercase, 5)} restarted",
        f"build #{g.r.randrange(1000, 99999)} on runner {g.pick(['ci-3', 'gha-large'])}",
        f"release v{g.r.randrange(1, 9)}.{g.r.randrange(20)}.{g.r.randrange(20)}",
        f"order A{g.s(UPPER32, 8)}",
        f"s3://data-lake/{g.r.randrange(2020, 2027)}/01/part-{g.s(string.digits, 5)}.parquet",
        f"ticket SEC-{g.r.randrange(100, 9999)}", f"ami-{g.hexs(17)}", f"sg-{g.hexs(17)}", f"vpc-{g.hexs(8)}",
        f"AKIA keys are flagged; account {g.s(string.digits, 12)} is the audit account.",
    ]), "identifier"


def benign_id_lookalike(g: Gen) -> tuple[str, str]:
    return g.pick([
        "c-password-policy", "cite:token-rotation-runbook", "event:secret-rotated", "event:password-reset",
        "docs/security/passwords.md#L12", "https://wiki.example.com/Secrets_Management", "ev:api-key-audit-2026",
        "adr-0042-session-cookie-flags", "event:credentials-revoked", "runbook/rotate-db-password.md",
        "src/auth/token_store.py#L88", "event:key-rotation", "cite:pci-dss-8.3.6", "component:pin-entry-ux",
        "https://docs.github.com/en/authentication/keeping-your-account-and-data-secure/about-secret-scanning",
        "ev:jwt-clock-skew-incident", f"{g.pick(['c', 'comp', 'k'])}-{g.hexs(8)}",
        f"event:{g.pick(['decided', 'observed', 'measured'])}",
    ]), "id_lookalike"


BENIGN_KINDS: dict[str, tuple[Callable[[Gen], tuple[str, str]], int]] = {
    "policy_prose": (benign_policy, 60),
    "placeholder": (benign_placeholder, 40),
    "secret_reference": (benign_reference, 36),
    "digest": (benign_digest, 30),
    "uuid": (benign_uuid, 16),
    "public_key": (benign_public_key, 24),
    "base64": (benign_base64, 16),
    "url_plain": (benign_url, 24),
    "record_id": (benign_record_id, 16),
    "config_nonsecret": (benign_config, 36),
    "code": (benign_code, 24),
    "token_talk": (benign_token_talk, 24),
    "cookie_benign": (benign_cookie, 10),
    "identifier": (benign_identifier, 18),
    "id_lookalike": (benign_id_lookalike, 20),
}

# Where examples go: mostly component text, the rest spread over every other string field.
WHERE_WEIGHTS = {"text": 0.5, "component_id": 0.08, "citation_id": 0.08, "type_ref": 0.08, "locator": 0.08,
                 "source_ref": 0.08, "evidence_ref": 0.05, "attestation": 0.05}


def _where(g: Gen, kind: str) -> str:
    if kind == "id_lookalike":
        return g.pick(ID_FIELDS[:-1])
    return g.r.choices(list(WHERE_WEIGHTS), weights=list(WHERE_WEIGHTS.values()))[0]


def generate(seed: int = SEED, *, scale: float = 1.0, hand_tried: bool = True) -> list[dict[str, Any]]:
    """The corpus for ``seed``: secrets first, then benign look-alikes; deduplicated, in a fixed order."""
    g = Gen(seed)
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    if hand_tried:
        for example in HAND_TRIED:
            out.append({**example, "label": "secret", "source": "hand-tried"})
            seen.add((example["text"], example["where"]))
    for label, kinds in (("secret", SECRET_KINDS), ("benign", BENIGN_KINDS)):
        for kind, (make, count) in kinds.items():
            made, tries = 0, 0
            while made < max(1, round(count * scale)) and tries < count * 20:
                tries += 1
                text, _ = make(g)
                where = _where(g, kind)
                if label == "benign" and where != "text" and len(text.encode()) > ID_MAX_BYTES:
                    where = "text"  # an id or ref holds 512 bytes: the schema, not the screen, would refuse it
                if (text, where) in seen:
                    continue
                seen.add((text, where))
                out.append({"text": text, "label": label, "kind": kind, "where": where})
                made += 1
    return out


def write(rows: list[dict[str, Any]], path: Path) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    rows = generate(args.seed)
    write(rows, args.out)
    secrets_n = sum(r["label"] == "secret" for r in rows)
    print(f"wrote {len(rows)} examples ({secrets_n} secret, {len(rows) - secrets_n} benign) to {args.out}")


if __name__ == "__main__":
    main()
