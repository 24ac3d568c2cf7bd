"""Small builders for test data; each writes through the engine's own domain functions."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any, Iterable
from zoneinfo import ZoneInfo

from sqlalchemy import insert, select

from engine.core import clock
from engine.people.appointments import create_appointment
from engine.tenants.channels import create_channel
from engine.people.contacts import create_contact
from engine.store.models import (
    channels,
    inbox_items,
    message_events,
    messages,
    reminder_rule_kinds,
    reminder_rules,
    sandbox_messages,
)
from engine.tenants.orgs import create_org
from engine.reminders.populate import DEFAULT_HORIZON, populate, refresh_appointment
from engine.store.runtime import Runtime
from gateway import registry


class World:
    """A tenant with channels, rules, contacts and appointments, built step by step."""

    def __init__(self, rt: Runtime, slug: str = "clinica", **org_kwargs: Any) -> None:
        self.rt = rt
        org_kwargs.setdefault("state", "SP")
        with rt.db.begin() as conn:
            self.org_id = create_org(conn, slug=slug, name=f"Clínica {slug.title()}", **org_kwargs)
        self.channels: dict[str, int] = {}

    def channel(self, kind: str = "whatsapp", provider: str = "sandbox", **settings: Any) -> int:
        with self.rt.db.begin() as conn:
            cid = create_channel(conn, self.rt.keyring, org_id=self.org_id, kind=kind, provider=provider,
                                 name=f"{provider} {kind}", settings=settings, is_default=True)
        self.channels[kind] = cid
        return cid

    def rule(self, offset_minutes: int = 1440, kinds: Iterable[str] = ("whatsapp",), *,
             trigger: str = "before_start", purpose: str = "session_reminder",
             template_key: str | None = None, respect_window: bool = True, active: bool = True) -> int:
        now = clock.now()
        with self.rt.db.begin() as conn:
            rule_id = conn.execute(insert(reminder_rules).values(
                org_id=self.org_id, name=f"{trigger} {offset_minutes}", purpose=purpose,
                template_key=template_key or purpose, trigger=trigger, offset_minutes=offset_minutes,
                respect_window=respect_window, active=active, created_at=now, updated_at=now,
            ).returning(reminder_rules.c.id)).scalar_one()
            for position, kind in enumerate(kinds):
                conn.execute(insert(reminder_rule_kinds).values(
                    org_id=self.org_id, rule_id=rule_id, kind=kind, position=position))
        return int(rule_id)

    def contact(self, name: str = "Ana Clara", phone: str | None = "+5516999887766",
                email: str | None = "ana@example.com", consent: Iterable[str] = ("whatsapp", "email", "sms")) -> int:
        with self.rt.db.begin() as conn:
            return create_contact(conn, org_id=self.org_id, name=name, phone=phone, email=email, consent=consent)

    def appointment(self, contact_id: int, starts_at: datetime, *, refresh: bool = True, **kwargs: Any) -> int:
        kwargs.setdefault("professional", "Dra. Beatriz Costa")
        with self.rt.db.begin() as conn:
            appointment_id = create_appointment(conn, org_id=self.org_id, contact_id=contact_id,
                                                starts_at=starts_at, **kwargs)
            if refresh:
                refresh_appointment(conn, self.org_id, appointment_id)
        return appointment_id

    def populate(self) -> Any:
        return populate(self.rt.db, horizon=DEFAULT_HORIZON, org_id=self.org_id)

    def messages(self, **filters: Any) -> list[Any]:
        query = select(messages).where(messages.c.org_id == self.org_id).order_by(messages.c.id)
        for key, value in filters.items():
            query = query.where(messages.c[key] == value)
        with self.rt.db.connect() as conn:
            return list(conn.execute(query))

    def message(self, message_id: int) -> Any:
        """One of the org's messages, fresh from the database."""
        with self.rt.db.connect() as conn:
            return conn.execute(select(messages).where(messages.c.org_id == self.org_id,
                                                       messages.c.id == message_id)).one()

    def events(self, message_id: int) -> list[str]:
        """The event names of one message, in the order they were written."""
        with self.rt.db.connect() as conn:
            return list(conn.execute(
                select(message_events.c.event).where(message_events.c.org_id == self.org_id,
                                                     message_events.c.message_id == message_id)
                .order_by(message_events.c.id)
            ).scalars())

    def sandbox(self) -> list[Any]:
        """What the sandbox provider recorded as sent for this org."""
        with self.rt.db.connect() as conn:
            return list(conn.execute(select(sandbox_messages).where(sandbox_messages.c.org_id == self.org_id)
                                     .order_by(sandbox_messages.c.id)))

    def inbox(self) -> list[Any]:
        """The org's operator inbox items."""
        with self.rt.db.connect() as conn:
            return list(conn.execute(select(inbox_items).where(inbox_items.c.org_id == self.org_id)
                                     .order_by(inbox_items.c.id)))


def sandbox_headers(rt: Runtime, channel_id: int) -> dict[str, str]:
    """The header a sandbox channel's webhook requires: the secret it got at creation."""
    from providers.sandbox.provider import SECRET_HEADER

    with rt.db.connect() as conn:
        channel = conn.execute(select(channels).where(channels.c.id == channel_id)).one()
    return {SECRET_HEADER: str(rt.providers.get(channel).config["webhook_secret"])}


def local(year: int, month: int, day: int, hour: int = 0, minute: int = 0,
          tz: str = "America/Sao_Paulo") -> datetime:
    """An aware wall-clock instant in `tz` (São Paulo unless told)."""
    return datetime(year, month, day, hour, minute, tzinfo=ZoneInfo(tz))


def at(clock_: Any, **delta: float) -> datetime:
    """clock.now() + timedelta(**delta)."""
    return clock_.now() + timedelta(**delta)


@contextlib.contextmanager
def provider_as(name: str, provider: type) -> Iterator[type]:
    """Let `provider` (a test's variant of a real one) answer to a real provider's name, then
    put the registry back as it was."""
    saved_path, saved_loaded = registry._PATHS.get(name), registry._loaded.get(name)
    registry.register(name, provider)
    try:
        yield provider
    finally:
        with registry._lock:
            registry._loaded.pop(name, None)
            if saved_loaded is not None:
                registry._loaded[name] = saved_loaded
            if saved_path is not None:
                registry._PATHS[name] = saved_path
