"""Tests for gateway.phones (E.164 normalisation, BR 9th digit, WhatsApp JIDs)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.phones import (
    InvalidPhone,
    br_whatsapp_variants,
    e164_to_jid,
    jid_to_e164,
    normalize_phone,
    recipient_phone,
)

E164_RE = re.compile(r"^\+[1-9]\d{7,14}$", re.ASCII)
MOBILE = "+5516999887766"
LANDLINE = "+551633221100"


@pytest.mark.parametrize(
    "raw",
    [
        "(16) 99988-7766",
        "016 99988-7766",
        "+55 16 99988-7766",
        "+55 (16) 99988-7766",
        "5516999887766",
        "55 16 99988-7766",
        "16999887766",
        "  +5516999887766  ",
        "0xx16 99988-7766",
        "015 16 99988-7766",  # with a long-distance carrier code
        "5516999887766@s.whatsapp.net",
        "5516999887766@c.us",
        "5516999887766:12@s.whatsapp.net",
    ],
)
def test_normalize_brazilian_mobile_formats(raw: str) -> None:
    assert normalize_phone(raw) == MOBILE


@pytest.mark.parametrize(
    "raw",
    [
        "(16) 9988-7766",
        "16 99887766",
        "+55 16 9988-7766",
        "551699887766",
        "551699887766@s.whatsapp.net",
    ],
)
def test_old_format_mobile_gets_ninth_digit(raw: str) -> None:
    assert normalize_phone(raw) == MOBILE


@pytest.mark.parametrize("first", "6789")
def test_ninth_digit_for_every_mobile_prefix(first: str) -> None:
    assert normalize_phone(f"(11) {first}123-4567") == f"+55119{first}1234567"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("(16) 3322-1100", LANDLINE),
        ("+55 11 2345-6789", "+551123456789"),
        ("(21) 4002-8922", "+552140028922"),
        ("(51) 5123-4567", "+555151234567"),
    ],
)
def test_landlines_stay_ten_digits(raw: str, expected: str) -> None:
    assert normalize_phone(raw) == expected


def test_area_code_55_is_not_mistaken_for_country_code() -> None:
    # 11 digits starting with 55 is a national number in area code 55 (RS).
    assert normalize_phone("55 99988-7766") == "+5555999887766"


def test_foreign_numbers() -> None:
    assert normalize_phone("+1 650-253-0000") == "+16502530000"
    assert normalize_phone("+351 912 345 678") == "+351912345678"
    assert normalize_phone("(650) 253-0000", default_region="US") == "+16502530000"


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "   ",
        "abc",
        "Maria",
        "16 9998x-7766",
        "0800-FLORES",
        "12",
        "(16) 1988-7766",  # subscriber numbers never start with 1
        "+55 99 99999 99999 999",
        "120363025246125888@g.us",
        "5516999887766@lid",
        "maria@example.com",
        "@s.whatsapp.net",
    ],
)
def test_invalid_inputs_raise(raw: str) -> None:
    with pytest.raises(InvalidPhone, match="not a valid phone number"):
        normalize_phone(raw)


def test_invalid_phone_is_a_value_error() -> None:
    assert issubclass(InvalidPhone, ValueError)


def test_non_string_raises_invalid_phone() -> None:
    with pytest.raises(InvalidPhone):
        normalize_phone(None)  # type: ignore[arg-type]


def test_exception_message_has_no_digits_of_the_input() -> None:
    with pytest.raises(InvalidPhone) as excinfo:
        normalize_phone("(16) 1988-7766")
    assert "1988" not in str(excinfo.value)
    assert "7766" not in str(excinfo.value)


def test_br_whatsapp_variants_mobile() -> None:
    assert br_whatsapp_variants(MOBILE) == ["5516999887766", "551699887766"]


def test_br_whatsapp_variants_accepts_legacy_form() -> None:
    assert br_whatsapp_variants("+551699887766") == ["5516999887766", "551699887766"]


def test_br_whatsapp_variants_landline_and_foreign() -> None:
    assert br_whatsapp_variants(LANDLINE) == ["551633221100"]
    assert br_whatsapp_variants("+16502530000") == ["16502530000"]


def test_br_whatsapp_variants_invalid() -> None:
    with pytest.raises(InvalidPhone):
        br_whatsapp_variants("not a phone")


def test_jid_to_e164() -> None:
    assert jid_to_e164("5516999887766@s.whatsapp.net") == MOBILE
    assert jid_to_e164("551699887766@s.whatsapp.net") == MOBILE
    assert jid_to_e164("5516999887766:3@s.whatsapp.net") == MOBILE
    assert jid_to_e164("16502530000@s.whatsapp.net") == "+16502530000"


@pytest.mark.parametrize(
    "jid",
    ["5516999887766", "120363025246125888@g.us", "abc@s.whatsapp.net", "", "@"],
)
def test_jid_to_e164_rejects_non_user_jids(jid: str) -> None:
    with pytest.raises(InvalidPhone):
        jid_to_e164(jid)


def test_e164_to_jid() -> None:
    assert e164_to_jid(MOBILE) == "5516999887766@s.whatsapp.net"
    assert e164_to_jid("+551699887766") == "5516999887766@s.whatsapp.net"
    assert e164_to_jid(LANDLINE) == "551633221100@s.whatsapp.net"


def test_jid_round_trip() -> None:
    assert jid_to_e164(e164_to_jid(MOBILE)) == MOBILE


def test_every_variant_normalises_back() -> None:
    for variant in br_whatsapp_variants(MOBILE):
        assert jid_to_e164(variant + "@s.whatsapp.net") == MOBILE


_phoneish = st.text(alphabet="0123456789 +-()./@x", max_size=25)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=40), _phoneish))
def test_normalize_returns_e164_or_raises(raw: str) -> None:
    try:
        result = normalize_phone(raw)
    except InvalidPhone:
        return
    assert E164_RE.match(result)
    assert normalize_phone(result) == result


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["11", "16", "21", "51", "55", "85"]),
    st.sampled_from("6789"),
    st.text(alphabet="0123456789", min_size=7, max_size=7),
)
def test_old_and_new_mobile_forms_agree(area: str, first: str, rest: str) -> None:
    old = normalize_phone(f"({area}) {first}{rest}")
    new = normalize_phone(f"({area}) 9{first}{rest}")
    assert old == new == f"+55{area}9{first}{rest}"
    assert normalize_phone(new) == new
    assert jid_to_e164(e164_to_jid(new)) == new


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=40), _phoneish))
def test_a_recipient_is_what_normalize_phone_makes_of_it(raw: str) -> None:
    """A provider's `to` goes through recipient_phone: whatever normalize_phone accepts comes out
    as normalize_phone writes it, and what it refuses is refused, unless it is already shaped as
    E.164 (a stored number, validated when it was written)."""
    try:
        expected = normalize_phone(raw)
    except InvalidPhone:
        if not re.fullmatch(r"\+[1-9]\d{6,14}", raw, re.ASCII):  # E.164's shape, as recipient_phone reads it
            with pytest.raises(InvalidPhone):
                recipient_phone(raw)
        return
    assert recipient_phone(raw) == expected
    assert recipient_phone(expected) == expected


def test_a_recipient_typed_by_hand_is_normalised_and_garbage_is_refused() -> None:
    assert recipient_phone("(16) 9988-7766") == MOBILE
    assert recipient_phone(" +5516999887766") == MOBILE
    for bad in ("not a phone", "", "+55 16", "+\u0665\u0665169998877", "+0516999887766"):
        with pytest.raises(InvalidPhone):
            recipient_phone(bad)
