"""The `lembra` command line. Every setting comes from the environment (see `lembra --help`).

One module per command group (serve.py holds the long-running `up`, `web`, `worker` and
`scheduler`); what they share is in common.py, which none of them needs this module for: this
module only builds `main` and adds their commands to it."""

from __future__ import annotations

import click

import engine.flows.receivers  # noqa: F401  (appointment changes and opt-outs reach the flows)

from admin.cli import (
    agenda,
    apikeys,
    channels,
    db,
    demo,
    fields,
    flows,
    keys,
    messages,
    orgs,
    privacy,
    sandbox,
    serve,
    templates,
    understand,
    users,
    webhooks,
)
from engine.core.config import ENV_VARS


def _env_help() -> str:
    lines = ["\b", "Environment variables:"]
    for name, (default, meaning) in ENV_VARS.items():
        shown = f" (default {default})" if default else ""
        lines.append(f"  {name}: {meaning}{shown}")
    return "\n".join(lines)


@click.group(help="Lembra: reminders and follow-ups for clinics.\n\n" + _env_help())
@click.version_option(package_name="lembra")
def main() -> None:
    """The `lembra` command."""


for _command in (serve.up, serve.web, serve.worker, serve.scheduler, db.db, demo.demo, orgs.orgs, users.users,
                 messages.messages, channels.channels, keys.keys, apikeys.apikeys, flows.flows, flows.enrollments,
                 privacy.contacts_group, privacy.retention_group, templates.templates_group,
                 understand.understand, fields.fields_group, webhooks.webhooks, agenda.agenda,
                 sandbox.sandbox):
    main.add_command(_command)

