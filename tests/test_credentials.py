"""Credentials at rest (SPEC §5): AES-GCM bound to table, org, row and key version; rotation
re-encrypts every row so old keys can go; no secret in CLI output, logs or reprs."""

from __future__ import annotations

import base64
import subprocess

import pytest
from sqlalchemy import select, update

from engine.tenants.channels import create_channel
from engine.core.config import Settings
from engine.store.key_rotation import rotate
from engine.store.models import channels
from engine.store.runtime import Runtime
from gateway.crypto import CryptoError, Keyring
from tests.conftest import TEST_KEY
from tests.factories import World
from tests.processes import LEMBRA, lembra_env

SECRET = "EAAG-very-secret-token-123"
NEW_KEY = "2:" + base64.b64encode(b"another-32-byte-key-for-rotation"[:32]).decode()


def _meta_like_channel(rt, world: World) -> int:
    with rt.db.begin() as conn:
        return create_channel(conn, rt.keyring, org_id=world.org_id, kind="whatsapp", provider="sandbox",
                              name="conta", credentials={"access_token": SECRET, "webhook_secret": "w"})


def _row(rt, channel_id: int):
    with rt.db.connect() as conn:
        return conn.execute(select(channels).where(channels.c.id == channel_id)).one()


def test_ciphertext_is_bound_to_its_row_and_tenant(rt):
    clinic_a, clinic_b = World(rt, slug="clinica-a"), World(rt, slug="clinica-b")
    a_id, b_id = _meta_like_channel(rt, clinic_a), _meta_like_channel(rt, clinic_b)
    a = _row(rt, a_id)
    assert SECRET.encode() not in bytes(a.credentials)
    assert rt.keyring.open(a.credentials, key_version=a.key_version, table="channels",
                           org_id=a.org_id, row_id=a.id)["access_token"] == SECRET
    with pytest.raises(CryptoError):  # copied to another row of the same org
        rt.keyring.open(a.credentials, key_version=a.key_version, table="channels", org_id=a.org_id, row_id=b_id)
    with pytest.raises(CryptoError):  # copied to another tenant
        rt.keyring.open(a.credentials, key_version=a.key_version, table="channels",
                        org_id=clinic_b.org_id, row_id=a.id)
    with pytest.raises(CryptoError):  # claimed to be under another key version
        rt.keyring.open(a.credentials, key_version=2, table="channels", org_id=a.org_id, row_id=a.id)
    # The database copy itself: move A's ciphertext onto B's row; B's provider cannot use it.
    with rt.db.begin() as conn:
        conn.execute(update(channels).where(channels.c.id == b_id).values(credentials=a.credentials))
    with pytest.raises(CryptoError):
        rt.providers.get(_row(rt, b_id))


def test_rotation_reencrypts_every_row_and_old_key_can_be_dropped(rt, settings):
    world = World(rt)
    ids = [_meta_like_channel(rt, world) for _ in range(5)]
    both = Runtime.build(Settings(**{**settings.__dict__, "secret_keys": f"{NEW_KEY},{TEST_KEY}"}))
    first = rotate(both.db, both.keyring, batch=2)
    assert first.rotated["channels"] == 5
    assert rotate(both.db, both.keyring).total == 0, "a second run has nothing to do"
    only_new = Keyring.parse(NEW_KEY)
    for channel_id in ids:
        row = _row(rt, channel_id)
        assert row.key_version == 2
        assert only_new.open(row.credentials, key_version=2, table="channels", org_id=row.org_id,
                             row_id=row.id)["access_token"] == SECRET
    with pytest.raises(CryptoError):  # the old key alone no longer opens anything
        rt.keyring.open(_row(rt, ids[0]).credentials, key_version=2, table="channels",
                        org_id=world.org_id, row_id=ids[0])
    both.close()


def test_secrets_never_reach_cli_output_logs_or_reprs(rt, database_url):
    World(rt)
    env = lembra_env(database_url, LEMBRA_LOG_LEVEL="DEBUG")
    added = subprocess.run(
        [LEMBRA, "channels", "add", "--org", "clinica", "--kind", "whatsapp", "--provider", "sandbox",
         "--name", "Recepção"], input=f"access_token={SECRET}\nwebhook_secret=hush-hush\n",
        env=env, capture_output=True, text=True, timeout=60)
    assert added.returncode == 0, added.stderr
    channel_id = int(added.stdout.strip().splitlines()[-1])
    listed = subprocess.run([LEMBRA, "channels", "list", "--org", "clinica"], env=env, capture_output=True,
                            text=True, timeout=60)
    assert listed.returncode == 0 and "access_token" in listed.stdout
    rotated = subprocess.run([LEMBRA, "keys", "rotate"], env={**env, "LEMBRA_SECRET_KEYS": f"{NEW_KEY},{TEST_KEY}"},
                             capture_output=True, text=True, timeout=60)
    assert rotated.returncode == 0, rotated.stderr
    assert "channels: 1 re-encrypted with key version 2" in rotated.stdout
    tested = subprocess.run([LEMBRA, "channels", "test", str(channel_id), "--to", "(16) 99988-7766"],
                            env={**env, "LEMBRA_SECRET_KEYS": NEW_KEY}, capture_output=True, text=True, timeout=60)
    assert tested.returncode == 0, tested.stderr
    assert tested.stdout.strip().startswith("sbx-")
    everything = "".join(p.stdout + p.stderr for p in (added, listed, rotated, tested))
    for secret in (SECRET, "hush-hush", base64.b64encode(b"another-32-byte-key-for-rotation"[:32]).decode()):
        assert secret not in everything
    assert SECRET not in repr(rt.keyring)
    assert "channel" in repr(Keyring.parse(NEW_KEY)) or "Keyring" in repr(Keyring.parse(NEW_KEY))


def test_channels_add_refuses_missing_keys_and_bad_input(rt, database_url):
    World(rt)
    env = lembra_env(database_url)
    missing = subprocess.run([LEMBRA, "channels", "add", "--org", "clinica", "--kind", "whatsapp", "--provider",
                              "meta", "--name", "Meta", "--set", "phone_number_id=123"], env=env,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2
    assert "missing credential keys for meta" in missing.stderr or "not available" in missing.stderr
    wrong_kind = subprocess.run([LEMBRA, "channels", "add", "--org", "clinica", "--kind", "email", "--provider",
                                 "sandbox", "--name", "x", "--set", "a=b", "--set", "novalue"], env=env,
                                capture_output=True, text=True, timeout=60)
    assert wrong_kind.returncode == 2
    with rt.db.connect() as conn:
        assert conn.execute(select(channels)).all() == []


def test_provider_repr_and_channel_repr_hold_no_secret(rt):
    world = World(rt)
    channel_id = _meta_like_channel(rt, world)
    provider = rt.providers.get(_row(rt, channel_id))
    assert provider.config["access_token"] == SECRET
    assert SECRET not in repr(provider)
    from engine.store.models import Channel

    assert SECRET not in repr(Channel(id=1, org_id=1, kind="whatsapp", provider="meta", name="x"))
