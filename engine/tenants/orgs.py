"""Tenants and their people: orgs and users (the sending window an org's settings imply is
`engine.reminders.windows.policy_for`)."""

from __future__ import annotations

import functools
import re
import secrets
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from werkzeug.security import check_password_hash, generate_password_hash

from engine.core import clock
from engine.core.errors import DomainError
from engine.store.models import orgs, users
from engine.reminders.windows import window_policy
from engine.words.keywords import parse_keywords
from engine.words.understanding import Context

ROLES = ("owner", "manager", "agent")
_SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{1,62}$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


class EmailTaken(DomainError):
    """Another user (of any org: e-mails are unique across the table) already has that e-mail."""


def create_org(
    conn: Connection,
    *,
    slug: str,
    name: str,
    timezone: str = "America/Sao_Paulo",
    state: str | None = None,
    locale: str = "pt_BR",
    quiet_start: str = "08:00",
    quiet_end: str = "20:00",
    skip_sundays: bool = True,
    skip_holidays: bool = True,
) -> int:
    """Create an org after validating every setting; returns its id."""
    if not _SLUG.match(slug or ""):
        raise DomainError("slug must be 2-63 lowercase letters, digits or dashes")
    if not (name or "").strip():
        raise DomainError("name must not be empty")
    state = state.upper() if state else None
    window_policy(timezone=timezone, quiet_start=quiet_start, quiet_end=quiet_end, skip_sundays=skip_sundays,
                  skip_holidays=skip_holidays, state=state)
    if conn.execute(select(orgs.c.id).where(orgs.c.slug == slug)).first():
        raise DomainError(f"an org with slug {slug!r} already exists")
    now = clock.now()
    return int(conn.execute(
        insert(orgs).values(
            slug=slug, name=name.strip(), timezone=timezone, state=state, locale=locale,
            quiet_start=quiet_start, quiet_end=quiet_end, skip_sundays=skip_sundays,
            skip_holidays=skip_holidays, created_at=now, updated_at=now,
        ).returning(orgs.c.id)
    ).scalar_one())


def org_by_slug(conn: Connection, slug: str) -> Any:
    """The org row with that slug; DomainError if there is none."""
    row = conn.execute(select(orgs).where(orgs.c.slug == slug)).first()
    if row is None:
        raise DomainError(f"no org with slug {slug!r}")
    return row


def hash_password(password: str) -> str:
    """The stored form of a console password (werkzeug's salted hash). The one place passwords are
    hashed, so the CLI and the console cannot drift apart."""
    return generate_password_hash(password)


@functools.cache
def _dummy_hash() -> str:
    """A hash of a random password, made by `hash_password` (same method and cost as a real one)."""
    return hash_password(secrets.token_urlsafe(16))


def warm_dummy_hash() -> None:
    """Make the dummy hash now (at app start), so the first unknown e-mail costs what every other does."""
    _dummy_hash()


def verify_password(stored_hash: str | None, password: str) -> bool:
    """Whether `password` matches `stored_hash`. With no hash (an unknown or inactive account) a
    dummy hash of the same method and cost is checked instead and the answer is False: both paths
    do the same work, so the time of an answer does not tell which e-mails have an account."""
    if not stored_hash:
        check_password_hash(_dummy_hash(), password)
        return False
    return check_password_hash(stored_hash, password)


def end_sessions(conn: Connection, user_id: int) -> None:
    """Sign the user out everywhere: every console session issued before now stops loading
    (the session carries `session_generation`, admin/auth.py checks it on each request)."""
    conn.execute(update(users).where(users.c.id == user_id)
                 .values(session_generation=users.c.session_generation + 1))


def create_user(conn: Connection, *, org_id: int, email: str, role: str, password: str) -> int:
    """Create a user with a hashed password; returns its id."""
    email = (email or "").strip().lower()
    if not _EMAIL.match(email):
        raise DomainError("not a valid e-mail address")
    if role not in ROLES:
        raise DomainError(f"role must be one of {', '.join(ROLES)}")
    if len(password or "") < 8:
        raise DomainError("password must have at least 8 characters")
    try:
        with conn.begin_nested():
            return int(conn.execute(
                insert(users).values(
                    org_id=org_id, email=email, role=role, active=True,
                    password_hash=hash_password(password), created_at=clock.now(),
                ).returning(users.c.id)
            ).scalar_one())
    except IntegrityError:
        raise EmailTaken("a user with that e-mail already exists") from None


#: The orgs table's keyword columns, per intent of the reply reader they extend.
_KEYWORD_COLUMNS = (("opt_out", "optout_keywords"), ("confirm", "confirm_keywords"), ("cancel", "cancel_keywords"))


def reply_reading(org: Any) -> tuple[str, dict[str, tuple[str, ...]]]:
    """How a patient's reply is read in this org (`engine.words.understanding.Context`): its
    timezone (the reader's default when unset or unknown) and its own keywords per intent, which
    extend the built-in ones. One place for the API and the CLI."""
    zone = org.timezone or Context.timezone
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        zone = Context.timezone
    keywords = {intent: parse_keywords(getattr(org, column)) for intent, column in _KEYWORD_COLUMNS}
    return zone, {intent: words for intent, words in keywords.items() if words}
