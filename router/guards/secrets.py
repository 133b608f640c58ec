"""Secrets in text: API keys of the common providers, private key blocks, JWTs, bearer tokens,
AWS keys, and credentials written as `password = ...`.

A small pattern set of our own, each pattern the provider's documented prefix and length (so a
hit is a key and not a word), tested one by one in tests/router/guards/test_secrets.py. Why not a
maintained set from PyPI: the one that fits best, Yelp's `detect-secrets`, scans files line by line
under process-global settings and reports a secret's value, not its place in the text (a redaction
needs the place), and its entropy plugins flag ordinary prose and hashes; its patterns for the
providers below are the same prefixes as these. Kinds and what they match:

    AWS_ACCESS_KEY      AKIA/ASIA/ABIA/ACCA + 16 upper-case letters or digits
    AWS_SECRET_KEY      40 base64 characters after `aws_secret_access_key` (or `aws secret`) and = or :
    OPENAI_API_KEY      sk- / sk-proj- / sk-svcacct- / sk-admin- + 20 or more [A-Za-z0-9_-]
    ANTHROPIC_API_KEY   sk-ant-api03- (or admin01-) + 20 or more [A-Za-z0-9_-]
    GITHUB_TOKEN        ghp_ gho_ ghu_ ghs_ ghr_ + 36 or more, github_pat_ + 22 or more
    GITLAB_TOKEN        glpat- + 20 or more
    SLACK_TOKEN         xoxb- xoxp- xoxa- xoxr- xoxs- + 10 or more
    STRIPE_KEY          sk_live_ sk_test_ rk_live_ rk_test_ + 16 or more
    GOOGLE_API_KEY      AIza + 35
    HUGGINGFACE_TOKEN   hf_ + 34 letters
    PRIVATE_KEY         a PEM `-----BEGIN ... PRIVATE KEY-----` block, through its END line if present
    JWT                 three base64url parts, the first two JSON objects (`eyJ`)
    BEARER_TOKEN        `Bearer ` + 20 or more token characters
    PASSWORD            the value after password/passwd/secret/api_key/token = or : (8 or more
                        characters, not a placeholder such as <...> or ***)
"""

from __future__ import annotations

import re

from router.guards.findings import Finding

# (kind, pattern, group holding the secret: 0 for the whole match)
_PATTERNS: tuple[tuple[str, str, int], ...] = (
    ("AWS_ACCESS_KEY", r"(?<![A-Z0-9])(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Z0-9])", 0),
    (
        "AWS_SECRET_KEY",
        r"(?i:aws[_\- ]?secret(?:[_\- ]?access)?(?:[_\- ]?key)?)[\"']?\s*[:=]\s*[\"']?"
        r"([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])",
        1,
    ),
    ("ANTHROPIC_API_KEY", r"(?<![\w-])sk-ant-(?:api|admin)\d{2}-[A-Za-z0-9_-]{20,}", 0),
    ("OPENAI_API_KEY", r"(?<![\w-])sk-(?!ant-)(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}", 0),
    ("GITHUB_TOKEN", r"(?<![\w])(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})", 0),
    ("GITLAB_TOKEN", r"(?<![\w-])glpat-[A-Za-z0-9_-]{20,}", 0),
    ("SLACK_TOKEN", r"(?<![\w-])xox[bpars]-[A-Za-z0-9-]{10,}", 0),
    ("STRIPE_KEY", r"(?<![\w])(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}", 0),
    ("GOOGLE_API_KEY", r"(?<![\w-])AIza[0-9A-Za-z_-]{35}(?![\w-])", 0),
    ("HUGGINGFACE_TOKEN", r"(?<![\w])hf_[A-Za-z]{34}(?![A-Za-z])", 0),
    (
        "PRIVATE_KEY",
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
        r"(?:[\s\S]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|[A-Za-z0-9+/=\s:\-,]*)",
        0,
    ),
    ("JWT", r"(?<![\w-])eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", 0),
    ("BEARER_TOKEN", r"(?i:\bbearer)\s+([A-Za-z0-9\-._~+/]{20,}=*)", 1),
    (
        "PASSWORD",
        r"(?i:\b(?:password|passwd|pwd|secret|api[_-]?key|access[_-]?token|auth[_-]?token))[\"']?\s*[:=]\s*"
        r"[\"']?(?![<*\[{x]{3})([^\s\"'<>]{8,})",
        1,
    ),
)

KINDS = frozenset(kind for kind, _, _ in _PATTERNS)


class SecretsDetector:
    """The patterns above, or those of `kinds` only."""

    def __init__(self, kinds: frozenset[str] | None = None) -> None:
        self.kinds = KINDS if kinds is None else kinds
        self._compiled = [(k, re.compile(p), g) for k, p, g in _PATTERNS if k in self.kinds]

    def detect(self, text: str) -> list[Finding]:
        found = []
        for kind, pattern, group in self._compiled:
            for m in pattern.finditer(text):
                start, end = m.span(group)
                if end > start:
                    found.append(Finding(kind, start, end, 1.0))
        return found
