"""Phone number normalisation for Lembra (Brazil first, WhatsApp first).

Everything stored or compared inside Lembra is E.164 (``+5516999887766``).
Clinics type numbers in every imaginable format, and WhatsApp gateways hand
us JIDs (``5516999887766@s.whatsapp.net``), sometimes without the Brazilian
mobile 9th digit, so all of that is funnelled through :func:`normalize_phone`.

Exception messages never contain the number itself: phone numbers are
personal data and exceptions end up in logs.
"""

from __future__ import annotations

import re

import phonenumbers

__all__ = [
    "InvalidPhone",
    "br_whatsapp_variants",
    "e164_to_jid",
    "jid_to_e164",
    "normalize_phone",
    "recipient_phone",
]

_BR_COUNTRY_CODE = 55

# Every message starts with the same phrase so callers can match on it.
_INVALID = "not a valid phone number"
_NOT_A_JID = _INVALID + ": not a WhatsApp user JID"

# Only user JIDs are phone numbers; groups (g.us), broadcasts, newsletters and
# privacy "lid" identifiers are not, so they must not be mistaken for one.
# c.us is the same thing as s.whatsapp.net in whatsapp-web.js based gateways.
_WHATSAPP_USER_SERVERS = frozenset({"s.whatsapp.net", "c.us"})
_JID_SERVER = "s.whatsapp.net"

# JID user part: digits, optionally followed by an agent (_N) and/or a device
# (:N) suffix that multi-device gateways append.
_JID_USER_RE = re.compile(r"^(\d{6,15})(?:_\d+)?(?::\d+)?$")

# "0xx16 ..." is a long-standing Brazilian way of writing "dial your carrier
# code here"; it is the only place where letters are tolerated.
_BR_CARRIER_PLACEHOLDER_RE = re.compile(r"^\s*0\s*xx\s*", re.IGNORECASE)

# A bare run of digits starting with 55 and 12-13 digits long cannot be a
# national Brazilian number (those have 10-11 digits), so it is the country
# code without the '+'. 11-digit runs starting with 55 are area code 55 (RS).
_BARE_INTERNATIONAL_BR_LENGTHS = (12, 13)

# The shape normalize_phone writes: '+', then 7 to 15 digits, the first not 0.
_E164_RE = re.compile(r"\+[1-9]\d{6,14}", re.ASCII)


class InvalidPhone(ValueError):
    """Raised when a string cannot be turned into a valid phone number."""


def _jid_user(jid: str) -> str:
    """Return the digits of a WhatsApp user JID, or raise InvalidPhone."""
    user, sep, server = jid.strip().partition("@")
    if not sep or server.strip().lower() not in _WHATSAPP_USER_SERVERS:
        raise InvalidPhone(_NOT_A_JID)
    match = _JID_USER_RE.match(user.strip())
    if match is None:
        raise InvalidPhone(_NOT_A_JID)
    return match.group(1)


def _add_br_ninth_digit(number: phonenumbers.PhoneNumber) -> phonenumbers.PhoneNumber:
    """Insert the mobile 9th digit into an old-format Brazilian mobile number.

    Since 2016 every Brazilian mobile has 9 subscriber digits starting with 9,
    but contact lists and older WhatsApp accounts still carry the 8-digit
    form. Landlines (subscriber starting 2-5) keep 8 digits.
    """
    if number.country_code != _BR_COUNTRY_CODE:
        return number
    national = str(number.national_number)
    if len(national) == 10 and national[2] in "6789":
        fixed = phonenumbers.PhoneNumber()
        fixed.merge_from(number)
        fixed.national_number = int(national[:2] + "9" + national[2:])
        return fixed
    return number


def _parse_valid(text: str, region: str | None) -> phonenumbers.PhoneNumber:
    """Parse, fix the BR 9th digit and validate; raise InvalidPhone on failure."""
    try:
        number = phonenumbers.parse(text, region)
    except phonenumbers.NumberParseException:
        raise InvalidPhone(_INVALID) from None
    number = _add_br_ninth_digit(number)
    if not phonenumbers.is_valid_number(number):
        raise InvalidPhone(_INVALID)
    return number


def _format_e164(number: phonenumbers.PhoneNumber) -> str:
    return phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)


def normalize_phone(raw: str, default_region: str = "BR") -> str:
    """Normalise a phone number written by a human or a gateway to E.164.

    Accepts national formats (``"(16) 99988-7766"``, ``"016 99988-7766"``),
    international ones (``"+55 16 99988-7766"``), bare digits with the
    Brazilian country code (``"5516999887766"``) and WhatsApp user JIDs
    (``"5516999887766@s.whatsapp.net"``). Old 8-digit Brazilian mobiles get
    their 9th digit added, so the result is the same whichever form came in.

    :param raw: the number as typed or received.
    :param default_region: ISO 3166 region used when the number carries no
        country code.
    :returns: the number in E.164, e.g. ``"+5516999887766"``.
    :raises InvalidPhone: if the input is empty, contains letters, or is not a
        valid number according to ``phonenumbers``.
    """
    if not isinstance(raw, str):
        raise InvalidPhone(_INVALID + ": not a string")
    text = raw.strip()
    if not text:
        raise InvalidPhone(_INVALID + ": empty")

    if "@" in text:
        # JIDs always carry the country code, whatever the default region.
        return _format_e164(_parse_valid("+" + _jid_user(text), None))

    text = _BR_CARRIER_PLACEHOLDER_RE.sub("0", text)
    # phonenumbers happily parses vanity numbers ("0800-FLORES"); for patient
    # contacts letters mean garbage (a name in the phone column, say).
    if any(ch.isalpha() for ch in text):
        raise InvalidPhone(_INVALID)

    digits = phonenumbers.normalize_digits_only(text)
    if (
        not text.startswith(("+", "\uff0b"))
        and digits.startswith("55")
        and len(digits) in _BARE_INTERNATIONAL_BR_LENGTHS
    ):
        text = "+" + digits

    return _format_e164(_parse_valid(text, default_region))


def recipient_phone(to: str) -> str:
    """The E.164 number a provider sends to, from an outbound message's `to`.

    Lembra writes every stored number through :func:`normalize_phone` (and so validates it on
    the way in), so a `to` already in E.164 goes as it is: parsing it again against the
    numbering plan cost about 36 µs a message, a tenth of a send's own CPU. Anything else is
    normalised (and validated) here.

    :raises InvalidPhone: if `to` is not E.164 and cannot be normalised.
    """
    if isinstance(to, str) and _E164_RE.fullmatch(to):
        return to
    return normalize_phone(to)


def br_whatsapp_variants(e164: str) -> list[str]:
    """Return the WhatsApp user digit strings a number may be registered under.

    WhatsApp accounts created before the Brazilian 9th-digit migration are
    still addressed without it, so for a Brazilian mobile both forms are
    returned, the current (with 9) form first: ``["5516999887766",
    "551699887766"]``. Any other number yields just its digits.

    :param e164: a phone number, normally already E.164 (it is normalised
        again, so legacy forms are accepted too).
    :raises InvalidPhone: if the number is not valid.
    """
    number = _parse_valid(normalize_phone(e164), None)
    national = str(number.national_number)
    with_nine = f"{number.country_code}{national}"
    # After normalisation every BR mobile has 11 national digits with a 9
    # right after the area code; 10-digit BR numbers are landlines.
    if (
        number.country_code == _BR_COUNTRY_CODE
        and len(national) == 11
        and national[2] == "9"
    ):
        return [with_nine, f"{_BR_COUNTRY_CODE}{national[:2]}{national[3:]}"]
    return [with_nine]


def jid_to_e164(jid: str) -> str:
    """Convert a WhatsApp user JID to E.164, adding the BR 9th digit if missing.

    Agent/device suffixes (``"5516999887766:12@s.whatsapp.net"``) are ignored.

    :raises InvalidPhone: if this is not a user JID (e.g. a group) or the
        number is not valid.
    """
    if not isinstance(jid, str):
        raise InvalidPhone(_NOT_A_JID)
    return _format_e164(_parse_valid("+" + _jid_user(jid), None))


def e164_to_jid(e164: str) -> str:
    """Convert a phone number to a WhatsApp user JID (current, with-9 form).

    :raises InvalidPhone: if the number is not valid.
    """
    return normalize_phone(e164).lstrip("+") + "@" + _JID_SERVER
