"""Fixtures of the REST API tests: the app, and API clients bound to one org's key."""

from __future__ import annotations

from typing import Any

import pytest

from admin.app import create_app
from engine.tenants.apikeys import create_key
from tests.factories import World


class Api:
    """A test client that sends one org's bearer key with every request."""

    def __init__(self, client: Any, world: World, key: str, key_id: int) -> None:
        self.client, self.world, self.key, self.key_id = client, world, key, key_id

    def _headers(self, headers: dict[str, str] | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}", **(headers or {})}

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.client.get(f"/api/v1{path}", headers=self._headers(kwargs.pop("headers", None)), **kwargs)

    def post(self, path: str, json: Any = None, **kwargs: Any) -> Any:
        return self.client.post(f"/api/v1{path}", json=json, headers=self._headers(kwargs.pop("headers", None)),
                                **kwargs)

    def patch(self, path: str, json: Any = None, **kwargs: Any) -> Any:
        return self.client.patch(f"/api/v1{path}", json=json, headers=self._headers(kwargs.pop("headers", None)),
                                 **kwargs)

    def delete(self, path: str, **kwargs: Any) -> Any:
        return self.client.delete(f"/api/v1{path}", headers=self._headers(kwargs.pop("headers", None)), **kwargs)


@pytest.fixture
def app(rt):
    app = create_app(rt)
    app.config["TESTING"] = True
    return app


@pytest.fixture
def client(app):
    return app.test_client()


def api_for(rt: Any, client: Any, world: World, name: str = "agenda") -> Api:
    with rt.db.begin() as conn:
        new = create_key(conn, org_id=world.org_id, name=name)
    return Api(client, world, new.key, new.id)


@pytest.fixture
def clinic(rt) -> World:
    world = World(rt, slug="clinica-a")
    world.channel("whatsapp")
    world.channel("email")
    world.rule(offset_minutes=1440, kinds=("whatsapp", "email"))
    return world


@pytest.fixture
def api(rt, client, clinic) -> Api:
    return api_for(rt, client, clinic)


@pytest.fixture
def other(rt, client) -> Api:
    """A second tenant with its own key, contact, appointment and message."""
    world = World(rt, slug="clinica-b")
    world.channel("whatsapp")
    world.rule(offset_minutes=1440, kinds=("whatsapp",))
    return api_for(rt, client, world, name="outra agenda")
