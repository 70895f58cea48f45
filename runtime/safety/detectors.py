"""PII recognizers chosen by name: a regex plus an optional checksum, no NLP model.

Hand-written rather than ``presidio-analyzer``: presidio's package imports spaCy (and its
``AnalyzerEngine`` wants a language model) even when only pattern recognizers are used, which
is hundreds of MB and tens of ms of start-up for what six regexes and two checksums do. The
patterns follow presidio's pattern recognizers; the checksums (Luhn, IBAN mod 97, SSN area
rules, IPv4 octets) drop the candidates a bare regex would over-match.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class Detector:
    """A recognizer: its regex starts with a character class (so the regex engine skips fast
    to candidate positions); word boundaries are checked by the matcher, not the pattern."""

    name: str
    pattern: str  # a regex with no capturing groups
    max_len: int  # the longest text it can match (the stream window needs it)
    min_digits: int = 0  # a text with fewer digits cannot hold one: skip the scan
    needs: str = ""  # a character a text must contain to hold one ("@" for e-mail)
    valid: Callable[[str], bool] | None = None  # a checksum over the matched text


def _digits(text: str) -> str:
    return "".join(ch for ch in text if ch.isdigit())


def luhn_ok(text: str) -> bool:
    """The Luhn checksum of the digits in ``text`` (credit card numbers)."""
    digits = _digits(text)
    if not 13 <= len(digits) <= 19:
        return False
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def iban_ok(text: str) -> bool:
    """ISO 13616 mod-97 check of an IBAN (spaces allowed)."""
    compact = text.replace(" ", "").upper()
    if not 15 <= len(compact) <= 34:
        return False
    rotated = compact[4:] + compact[:4]
    try:
        number = int("".join(str(int(ch, 36)) for ch in rotated))
    except ValueError:
        return False
    return number % 97 == 1


def ssn_ok(text: str) -> bool:
    """US SSN area/group/serial rules (no 000, 666, 9xx area; no 00 group; no 0000 serial)."""
    digits = _digits(text)
    area, group, serial = digits[:3], digits[3:5], digits[5:]
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


def ipv4_ok(text: str) -> bool:
    """Four octets, each 0..255."""
    return all(int(part) <= 255 for part in text.split("."))


DETECTORS: tuple[Detector, ...] = (
    Detector(
        "email",
        r"[A-Za-z0-9._%+-]{1,64}@(?:[A-Za-z0-9-]{1,63}\.){1,8}[A-Za-z]{2,24}",
        120,  # the stream window: longer addresses are caught whole only within one chunk
        needs="@",
    ),
    Detector(
        "phone",
        r"[+(0-9](?:[0-9]{0,3}[ .-]?)?(?:\(?[0-9]{2,4}\)?[ .-]?)?[0-9]{3,4}[ .-]?[0-9]{3,4}",
        24,
        min_digits=8,
    ),
    Detector("credit_card", r"[0-9](?:[ -]?[0-9]){12,18}", 23, min_digits=13, valid=luhn_ok),
    Detector(
        "iban",
        r"[A-Z][A-Z][0-9]{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?",
        42,
        min_digits=2,
        valid=iban_ok,
    ),
    Detector("us_ssn", r"[0-9][0-9]{2}[- ][0-9]{2}[- ][0-9]{4}", 11, min_digits=9, valid=ssn_ok),
    Detector("ipv4", r"[0-9][0-9]{0,2}(?:\.[0-9]{1,3}){3}", 15, min_digits=4, valid=ipv4_ok),
)


def detectors_by_name() -> Mapping[str, Detector]:
    """The read-only ``name -> Detector`` table."""
    return MappingProxyType({d.name: d for d in DETECTORS})


def detector_names() -> tuple[str, ...]:
    return tuple(d.name for d in DETECTORS)


def compiled(detector: Detector) -> re.Pattern[str]:
    """The detector's regex alone (tests and validation)."""
    return re.compile(detector.pattern)
