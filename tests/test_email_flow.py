"""Email end to end through a real SMTP server (aiosmtpd): a reminder leaves the outbox as a
multipart message with RFC 8058 headers, and the one-click unsubscribe POST opts the patient
out of email (and only email)."""

from __future__ import annotations

import re
from datetime import timedelta
from urllib.parse import urlsplit

from sqlalchemy import select

from admin.app import create_app
from engine.messaging import dispatch
from engine.tenants.channels import create_channel
from engine.store.models import preferences
from tests.factories import World
from tests.fakes.smtp import FakeSmtpServer, make_certificate


def test_reminder_by_email_and_one_click_unsubscribe(rt, clock, tmp_path):
    cert = make_certificate(tmp_path)
    world = World(rt)
    world.channel("whatsapp")
    with FakeSmtpServer(security="starttls", certificate=cert, users={"clinica": "senha-smtp"}) as smtp:
        with rt.db.begin() as conn:
            create_channel(conn, rt.keyring, org_id=world.org_id, kind="email", provider="smtp", name="E-mail",
                           credentials={"host": "localhost", "port": str(smtp.port), "security": "starttls",
                                        "username": "clinica", "password": "senha-smtp",
                                        "from_email": "agenda@clinica.com.br", "ca_file": cert.pem})
        world.rule(1440, kinds=("email",))
        world.rule(120, kinds=("email", "whatsapp"))
        contact = world.contact(name="Ana Clara Souza", email="ana@example.com")
        world.appointment(contact, clock.now() + timedelta(hours=30))
        clock.advance(timedelta(hours=6, minutes=1))
        [first] = dispatch.claim_due(rt, limit=10)
        assert dispatch.send_one(rt, first) == "sent"

        [mail] = smtp.received
        assert mail.tls and mail.authenticated_as == "clinica"
        assert mail.rcpt_tos == ["ana@example.com"]
        msg = mail.message
        assert msg["From"].addresses[0].addr_spec == "agenda@clinica.com.br"
        assert msg["Subject"].startswith("Lembrete: sua sessão")
        assert msg["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
        unsubscribe = re.fullmatch(r"<(https?://[^>]+)>", msg["List-Unsubscribe"]).group(1)
        text = msg.get_body(preferencelist=("plain",)).get_content()
        html = msg.get_body(preferencelist=("html",)).get_content()
        assert "Dra. Beatriz Costa" in text and "Dra. Beatriz Costa" in html
        assert msg.get_content_type() == "multipart/alternative"

    client = create_app(rt).test_client()
    path = urlsplit(unsubscribe).path
    assert client.get("/optout/forged-token").status_code == 404
    page = client.get(path)
    assert page.status_code == 200 and "Parar de receber e-mails" in page.text
    one_click = client.post(path, data={"List-Unsubscribe": "One-Click"})
    assert one_click.status_code == 200 and "Pronto" in one_click.text
    with rt.db.connect() as conn:
        prefs = {row.kind: row for row in conn.execute(select(preferences).where(preferences.c.contact_id == contact))}
    assert prefs["email"].opted_out_at is not None and prefs["email"].source == "list-unsubscribe"
    assert prefs["whatsapp"].opted_out_at is None, "unsubscribing from e-mail leaves WhatsApp alone"
    [pending_2h] = world.messages(rule_id=2)
    assert (pending_2h.status, pending_2h.skip_reason) == ("cancelled", "opted_out")
    world.populate()
    assert [m.channel_kind for m in world.messages(status="pending")] == ["whatsapp"], \
        "the 2 h reminder now goes by the next kind the patient still accepts"
