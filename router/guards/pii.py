"""Personal data in text, found by Microsoft Presidio's analyzer (`presidio-analyzer`) with its
pattern recognizers, and no model.

Presidio's analyzer wants an NLP engine, and its default one loads a spaCy model from a model hub
(`en_core_web_lg`), which cannot be had here and would put a 400 MB download and a named-entity
model on every request's path. The pattern recognizers need none of it: each is a regular
expression with a checksum where the kind has one (Luhn for cards, mod-97 for IBANs, the check
digits of national ids), and `phonenumbers` for phone numbers. What they do use, when it is there,
is the words around a match (`context`: "phone", "ssn", "card" raise a weak match's score), read
from the engine's lemmas. So the engine here is Presidio's own `NoOpNlpEngine` given a tokenizer:
words split by a regular expression, each word's lemma its lower case. That keeps the context
boost (for "numbers" the lemma would be "number"; here it is not) with no model at all. Names,
places and organisations (Presidio's NER kinds) are not found: they need a model.

Kinds found by default (`DEFAULT_KINDS`): email, phone, credit card, IBAN, IP address, and the
national ids whose recognizers carry a checksum or a narrow format (US SSN and ITIN, UK NHS and
NINO, Spain's NIF and NIE, Italy's fiscal code, India's PAN and Aadhaar, Singapore's NRIC/FIN,
Australia's TFN, Finland's personal identity code; Poland's PESEL is optional, since its pattern
fires inside longer numbers). More of Presidio's pattern
recognizers can be asked for by kind (`OPTIONAL_KINDS`). Beside Presidio's card pattern, which
takes digits in groups, one of ours takes 13 to 19 digits with any single space, dot or dash
between any two (`4 1 1 1 1 1 1 1 ...`) and keeps those that pass Luhn's check; and beside
Presidio's phone recognizer (Google's `phonenumbers`, which keeps only numbers valid in their
region's plan), one of ours takes the North American shape (`(292) 380-6033`, `511-600-8958`)
whatever the area code.

Presidio's email recognizer checks a match's domain with `tldextract`, which fetches the public
suffix list from the network the first time; here it is given its bundled snapshot and no URL, so
nothing is fetched, ever.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from router.guards.findings import Finding

DEFAULT_KINDS = frozenset(
    {
        "EMAIL_ADDRESS",
        "PHONE_NUMBER",
        "CREDIT_CARD",
        "IBAN_CODE",
        "IP_ADDRESS",
        "US_SSN",
        "US_ITIN",
        "UK_NHS",
        "UK_NINO",
        "ES_NIF",
        "ES_NIE",
        "IT_FISCAL_CODE",
        "IN_PAN",
        "IN_AADHAAR",
        "SG_NRIC_FIN",
        "AU_TFN",
        "FI_PERSONAL_IDENTITY_CODE",
    }
)
OPTIONAL_KINDS = frozenset(
    {
        "PL_PESEL",  # its pattern matches 11 digits inside longer numbers (cards, IBANs): measured
        "US_PASSPORT",
        "US_DRIVER_LICENSE",
        "US_BANK_NUMBER",
        "UK_PASSPORT",
        "UK_POSTCODE",
        "MAC_ADDRESS",
        "CRYPTO",
        "URL",
        "DATE_TIME",
        "AU_MEDICARE",
        "CA_SIN",
    }
)
KINDS = DEFAULT_KINDS | OPTIONAL_KINDS

# recognizer class name in presidio_analyzer.predefined_recognizers, per kind
_RECOGNIZERS = {
    "EMAIL_ADDRESS": "EmailRecognizer",
    "PHONE_NUMBER": "PhoneRecognizer",
    "CREDIT_CARD": "CreditCardRecognizer",
    "IBAN_CODE": "IbanRecognizer",
    "IP_ADDRESS": "IpRecognizer",
    "US_SSN": "UsSsnRecognizer",
    "US_ITIN": "UsItinRecognizer",
    "UK_NHS": "NhsRecognizer",
    "UK_NINO": "UkNinoRecognizer",
    "ES_NIF": "EsNifRecognizer",
    "ES_NIE": "EsNieRecognizer",
    "IT_FISCAL_CODE": "ItFiscalCodeRecognizer",
    "IN_PAN": "InPanRecognizer",
    "IN_AADHAAR": "InAadhaarRecognizer",
    "SG_NRIC_FIN": "SgFinRecognizer",
    "AU_TFN": "AuTfnRecognizer",
    "PL_PESEL": "PlPeselRecognizer",
    "FI_PERSONAL_IDENTITY_CODE": "FiPersonalIdentityCodeRecognizer",
    "US_PASSPORT": "UsPassportRecognizer",
    "US_DRIVER_LICENSE": "UsLicenseRecognizer",
    "US_BANK_NUMBER": "UsBankRecognizer",
    "UK_PASSPORT": "UkPassportRecognizer",
    "UK_POSTCODE": "UkPostcodeRecognizer",
    "MAC_ADDRESS": "MacAddressRecognizer",
    "CRYPTO": "CryptoRecognizer",
    "URL": "UrlRecognizer",
    "DATE_TIME": "DateRecognizer",
    "AU_MEDICARE": "AuMedicareRecognizer",
    "CA_SIN": "CaSinRecognizer",
}

_WORD = re.compile(r"\w+|[^\w\s]")
_SPACED_CARD = re.compile(r"(?<![\d])\d(?:[ .\-]?\d){12,18}(?![\d])")
# a North American number's shape, whatever its area code: `phonenumbers` drops numbers whose area
# code is not assigned (511-600-8958), which are still somebody's data to a policy
_NANP_SHAPE = re.compile(r"(?<![\w+-])(?:\+?1[ .-]?)?(?:\(\d{3}\)\s?|\d{3}[ .-])\d{3}[ .-]\d{4}(?![\w-])")
_build_lock = threading.Lock()


def luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _engine() -> Any:
    """Presidio's no-op NLP engine, given words and lower-case lemmas (module docstring)."""
    from presidio_analyzer.nlp_engine import NlpArtifacts, NoOpNlpEngine
    from spacy.tokens import Doc

    class WordsEngine(NoOpNlpEngine):
        def process_text(self, text: str, language: str) -> NlpArtifacts:
            matches = list(_WORD.finditer(text))
            words = [m.group() for m in matches] or [""]
            spaces = [m.end() < len(text) and text[m.end()].isspace() for m in matches] or [False]
            return NlpArtifacts(
                entities=[],
                tokens=Doc(self._vocab, words=words, spaces=spaces),
                tokens_indices=[m.start() for m in matches] or [0],
                lemmas=[w.lower() for w in words],
                nlp_engine=self,
                language=language,
                scores=[],
            )

    engine = WordsEngine(models=[{"lang_code": "en", "model_name": "none"}])
    engine.load()
    return engine


def _offline_email() -> Any:
    """Presidio's email recognizer, its domains checked against tldextract's bundled suffix list."""
    import tldextract
    from presidio_analyzer.predefined_recognizers import EmailRecognizer

    extract = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None, fallback_to_snapshot=True)

    class OfflineEmail(EmailRecognizer):
        def validate_result(self, pattern_text: str) -> bool:
            return bool(extract(pattern_text).fqdn)

    return OfflineEmail()


class PiiDetector:
    """Presidio's pattern recognizers for `kinds`, scores of at least `min_score` kept."""

    def __init__(self, kinds: frozenset[str] | None = None, min_score: float = 0.4) -> None:
        from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
        from presidio_analyzer import predefined_recognizers as predefined

        self.kinds = DEFAULT_KINDS if kinds is None else kinds
        unknown = self.kinds - KINDS
        if unknown:
            raise ValueError(f"unknown personal data kinds {sorted(unknown)}; known: {', '.join(sorted(KINDS))}")
        self.min_score = min_score
        with _build_lock:  # spaCy's vocabulary and Presidio's registry are built once at a time
            recognizers = []
            for kind in sorted(self.kinds):
                if kind == "EMAIL_ADDRESS":
                    recognizers.append(_offline_email())
                else:
                    cls = getattr(predefined, _RECOGNIZERS[kind])
                    recognizers.append(cls(supported_language="en"))
            registry = RecognizerRegistry(recognizers=recognizers, supported_languages=["en"])
            self._analyzer = AnalyzerEngine(
                nlp_engine=_engine(), registry=registry, supported_languages=["en"], log_decision_process=False
            )
        self._entities = sorted(self.kinds)

    def detect(self, text: str) -> list[Finding]:
        if not text.strip():
            return []
        results = self._analyzer.analyze(text, language="en", entities=self._entities, score_threshold=self.min_score)
        found = [Finding(r.entity_type, r.start, r.end, float(r.score)) for r in results]
        if "CREDIT_CARD" in self.kinds:
            for m in _SPACED_CARD.finditer(text):
                digits = re.sub(r"\D", "", m.group())
                if luhn(digits) and not any(f.start <= m.start() and m.end() <= f.end for f in found):
                    found.append(Finding("CREDIT_CARD", m.start(), m.end(), 0.9))
        if "PHONE_NUMBER" in self.kinds:
            for m in _NANP_SHAPE.finditer(text):
                if not any(f.start < m.end() and m.start() < f.end for f in found):
                    found.append(Finding("PHONE_NUMBER", m.start(), m.end(), 0.5))
            # one in eleven 10-digit numbers passes the NHS check: written the NANP way (dashes,
            # brackets) and also read as a phone number, it is a phone number
            phones = {(f.start, f.end) for f in found if f.kind == "PHONE_NUMBER"}
            found = [
                f
                for f in found
                if not (f.kind == "UK_NHS" and (f.start, f.end) in phones and set(text[f.start : f.end]) & set("-()"))
            ]
        return found
