"""The console's languages: Portuguese (Brazil) is the source language, English a catalog.

Strings are written in Portuguese and wrapped in `_()` (at request time) or `_l()` (lazy, for
class attributes such as labels and choices); templates use `{{ _('…') }}`. The English catalog
is `admin/translations/en/LC_MESSAGES/messages.po`, compiled in memory on first use, so there
is no build step and no binary file to keep in step. A string missing from the catalog shows
in Portuguese, never as a broken page; `tests/admin/test_i18n.py` fails when one is missing.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from babel.messages.mofile import write_mo
from babel.numbers import format_decimal, format_percent
from babel.messages.pofile import read_po
from babel.support import NullTranslations, Translations
from flask import Flask, has_request_context, request
from flask_babel import Babel, Domain, get_locale
from flask_login import current_user

from engine.words.texts import Text

#: The console's languages, the first the default.
LOCALES: dict[str, str] = {"pt_BR": "Português (BR)", "en": "English"}
DEFAULT_LOCALE = "pt_BR"
CATALOGS = Path(__file__).parent / "translations"


@functools.cache
def catalog(locale: str) -> NullTranslations:
    """The compiled catalog of one locale (the source language has none)."""
    path = CATALOGS / locale / "LC_MESSAGES" / "messages.po"
    if locale == DEFAULT_LOCALE or not path.exists():
        return NullTranslations()
    with path.open("rb") as fh:
        po = read_po(fh, locale=locale)
    buf = io.BytesIO()
    write_mo(buf, po, use_fuzzy=False)
    buf.seek(0)
    return Translations(buf)


class PoDomain(Domain):  # type: ignore[misc]
    """Flask-Babel domain that reads our .po catalogs directly."""

    def get_translations(self) -> NullTranslations:
        return catalog(str(get_locale() or DEFAULT_LOCALE))


domain = PoDomain()
_ = domain.gettext
_l = domain.lazy_gettext
ngettext = domain.ngettext


#: Says an instant as the reader reads one (the org's zone, the reader's format). The engine writes
#: the instants of its sentences ("O paciente escolheu o horário %(starts_at)s.") as ISO-8601 text,
#: zone and all; admin.views.base, which knows the signed-in org, sets this.
format_instant: Callable[[datetime], str] | None = None


def _param(name: str, value: object) -> object:
    """One parameter of a sentence, ready to read: a nested sentence translated, an instant
    (a parameter named `…_at` holding ISO-8601 text with its zone) in the org's time."""
    if isinstance(value, Text):
        return translate(value)
    if name.endswith("_at") and isinstance(value, str) and format_instant is not None and has_request_context():
        try:
            instant = datetime.fromisoformat(value)
        except ValueError:
            return value
        if instant.tzinfo is not None:
            return format_instant(instant)
    return value


def translate(value: object) -> str:
    """A sentence from the engine (`engine.words.texts.Text`) in the reader's language; anything else as is."""
    if isinstance(value, Text):
        params = {k: _param(k, v) for k, v in value.params.items()}
        if value.plural is not None and value.count is not None:
            return ngettext(value.msgid, value.plural, value.count, **params)
        return _(value.msgid, **params)
    return str(value)


def translate_to(text: Text, locale: str) -> str:
    """`text` in `locale`, outside any request (the REST API answers both languages at once).

    Nested Texts (a `detail` inside an issue's sentence) are translated first; a msgid the
    catalog does not hold yet stays in Portuguese, as the console shows it."""
    params = {k: translate_to(v, locale) if isinstance(v, Text) else v for k, v in text.params.items()}
    books = catalog(normalize(locale) or DEFAULT_LOCALE)
    if text.plural is not None and text.count is not None:
        translated = books.ngettext(text.msgid, text.plural, text.count)
    else:
        translated = books.gettext(text.msgid)
    if not params:
        return translated
    try:
        return translated % params
    except (KeyError, ValueError, TypeError):  # a translation whose placeholders drifted from the msgid
        return str(text)


def normalize(value: str | None) -> str | None:
    """A supported locale for a stored or requested value ('pt', 'pt-BR', 'en_US' …)."""
    if not value:
        return None
    value = value.replace("-", "_")
    if value in LOCALES:
        return value
    base = value.split("_")[0].lower()
    return {"pt": "pt_BR", "en": "en"}.get(base)


def select_locale() -> str:
    """The signed-in user's language (their own choice, else their org's); before sign-in the
    browser's preference between the two, Portuguese when it has none."""
    if current_user and current_user.is_authenticated:
        return normalize(getattr(current_user, "locale", None)) or DEFAULT_LOCALE
    if has_request_context():
        best = request.accept_languages.best_match(["pt-BR", "pt", "en"])
        return normalize(best) or DEFAULT_LOCALE
    return DEFAULT_LOCALE


def init_i18n(app: Flask) -> None:
    """Flask-Babel on the app (Flask-Admin's and WTForms' own strings follow the same locale) and
    our catalog's `_` in every template."""
    Babel(app, default_locale=DEFAULT_LOCALE, locale_selector=select_locale)
    app.jinja_env.install_gettext_callables(  # type: ignore[attr-defined]
        gettext=lambda s, **kw: _(s, **kw), ngettext=lambda s, p, n, **kw: ngettext(s, p, n, **kw), newstyle=True)
    app.jinja_env.globals["lembra_locales"] = LOCALES
    app.jinja_env.globals["lembra_locale"] = current_locale
    app.jinja_env.filters["translate"] = translate
    app.jinja_env.filters["lembra_percent"] = format_percent_local
    app.jinja_env.filters["lembra_number"] = format_number_local


def current_locale() -> str:
    return str(get_locale() or DEFAULT_LOCALE)




def format_percent_local(value: float) -> str:
    """A share in the reader's notation ("12,5 %" in Portuguese, "12.5%" in English)."""
    return format_percent(value, format="#,##0.#%", locale=current_locale())


def format_number_local(value: float) -> str:
    """A count or amount with the reader's separators ("1.234" in Portuguese, "1,234" in English)."""
    return format_decimal(value, locale=current_locale())
