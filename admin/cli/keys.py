"""`lembra keys …`: the keys that encrypt stored credentials."""

from __future__ import annotations

import click

from admin.cli.common import fail, load_runtime


@click.group(help="Credential keys.")
def keys() -> None:
    """Key commands."""


@keys.command("rotate", help="Re-encrypt every stored credential with the newest key in LEMBRA_SECRET_KEYS; "
                            "older keys can be removed afterwards.")
@click.option("--batch", default=200, show_default=True, type=int)
def keys_rotate(batch: int) -> None:
    from engine.store.key_rotation import rotate
    from gateway.crypto import CryptoError

    rt = load_runtime()
    try:
        result = rotate(rt.db, rt.keyring, batch=batch)
    except CryptoError as exc:
        fail(f"{exc}: keep the old key in LEMBRA_SECRET_KEYS until rotation has finished")
    for table, count in result.rotated.items():
        click.echo(f"{table}: {count} re-encrypted with key version {rt.keyring.current_version}")


@keys.command("generate", help="Print a new key entry for LEMBRA_SECRET_KEYS.")
@click.option("--version", "version", default=1, show_default=True, type=int)
def keys_generate(version: int) -> None:
    from gateway.crypto import Keyring

    click.echo(Keyring.generate_spec(version))
