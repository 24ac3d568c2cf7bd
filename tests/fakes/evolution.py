"""A loopback Evolution API v2 (Baileys) for provider tests, plus builders of the webhooks it sends.

Evolution publishes no captured payloads to keep as fixtures, so every response and webhook body
below is built from the shapes in the Evolution API source, each with the source path it comes
from ([R] = https://github.com/EvolutionAPI/evolution-api at commit
3454bec79f514995df9a5ea36a3554ab35cf1c82, release 2.3.6) or the issue of that repository
([I#n] = https://github.com/EvolutionAPI/evolution-api/issues/n). Nothing here is derived from
our provider's own output, and nothing is read from outside the repository (see
tests/fixtures/providers/README.md).
"""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import jwt

from tests.fakes.server import Recorded, Reply

INSTANCE_ID = "0b9c5a3e-4f7d-4d0e-9a3c-2f1e6b7c8d90"
QR_BASE64 = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
QR_CODE = "2@y8b3Q0h1mK,Zx9d0vTn5w8Jq,Vd3bP1sE4=,5d1fB9cQ2="


def error(status: int, message: Any) -> Reply:
    """Evolution's error envelope ([R] `src/main.ts`: `{status, error, response: {message}}`)."""
    names = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
             500: "Internal Server Error"}
    return Reply(status, {"status": status, "error": names.get(status, "Error"), "response": {"message": message}})


def create_jid(number: str) -> str:
    """[R] `src/utils/createJid.ts`, the BR rule: a 13-digit 55 number keeps its 9th digit when the
    DDD is below 31 or the first subscriber digit below 7; otherwise the 9 is dropped."""
    digits = re.sub(r"[\s+()]", "", number)
    match = re.fullmatch(r"(\d{2})(\d{2})\d(\d{8})", digits)
    if match and match.group(1) == "55":
        if int(match.group(3)[0]) >= 7 and int(match.group(2)) >= 31:
            digits = match.group(1) + match.group(2) + match.group(3)
    return digits + "@s.whatsapp.net"


@dataclass
class EvolutionFake:
    """`FakeServer(EvolutionFake(...))`: answers like an Evolution v2 server with one instance.

    `script` holds replies served first, in order, whatever the route (for error cases a real
    server produces only under conditions a fake cannot reach, e.g. a closed Baileys socket).
    """

    api_key: str = "global-api-key"
    instance: str = "clinica"
    instance_token: str = "B6D711FC-DE4D-4FD5-9365-44120E713976"
    state: str = "open"
    not_on_whatsapp: set[str] = field(default_factory=set)
    script: list[Reply] = field(default_factory=list)
    sent: list[str] = field(default_factory=list)
    webhook: dict[str, Any] | None = None
    #: The number the current session was started with (`/instance/connect?number=` from `close`).
    pairing_number: str | None = None
    #: Voice notes the instance holds, by message key id (`/chat/getBase64FromMediaMessage`).
    media: dict[str, bytes] = field(default_factory=dict)

    def __call__(self, req: Recorded) -> Reply:
        if self.script:
            return self.script.pop(0)
        parts = [unquote(p) for p in req.path.split("/") if p]
        if len(parts) == 2 and parts == ["instance", "create"] and req.method == "POST":
            return self._create(req)
        if len(parts) != 3:
            return error(404, [f"Cannot {req.method} {req.path}"])
        group, action, name = parts
        route = f"{req.method} /{group}/{action}"
        handlers = {
            "POST /message/sendText": self._send_text,
            "GET /instance/connect": self._connect,
            "GET /instance/connectionState": self._connection_state,
            "POST /webhook/set": self._webhook_set,
            "POST /chat/getBase64FromMediaMessage": self._media,
        }
        if route not in handlers:
            return error(404, [f"Cannot {req.method} {req.path}"])
        # Guards in order ([R] `src/api/routes/index.router.ts`): instance exists, then apikey.
        if name != self.instance:
            return error(404, [f'The "{name}" instance does not exist'])
        if req.header("apikey") not in (self.api_key, self.instance_token):
            return error(401, "Unauthorized")
        return handlers[route](req)

    # POST /chat/getBase64FromMediaMessage/{instance} {"message": {"key": {"id"}}} → 201
    # {mediaType, fileName, caption, size, mimetype, base64} ([R] chat.controller.ts, baileys service).
    def _media(self, req: Recorded) -> Reply:
        try:
            key_id = json.loads(req.body)["message"]["key"]["id"]
        except (ValueError, KeyError, TypeError):
            return error(400, ["Message not found"])
        content = self.media.get(key_id)
        if content is None:
            return error(400, ["Message not found"])
        return Reply(201, {"mediaType": "audioMessage", "fileName": f"{key_id}.oga", "caption": None,
                           "size": {"fileLength": str(len(content))}, "mimetype": "audio/ogg; codecs=opus",
                           "base64": base64.b64encode(content).decode("ascii")})

    # POST /message/sendText/{instance} → 201 prepareMessage(...) ([R] sendMessage.router.ts,
    # whatsapp.baileys.service.ts `prepareMessage`).
    def _send_text(self, req: Recorded) -> Reply:
        try:
            body = json.loads(req.body)
        except ValueError:
            return error(400, ["Unexpected token in JSON"])
        for prop in ("number", "text"):
            if not isinstance(body, dict) or prop not in body:
                return error(400, [[f'instance requires property "{prop}"']])  # [I#2570]
        if not str(body["text"]).strip():
            return error(400, ["Text is required"])
        jid = create_jid(body["number"])
        if body["number"] in self.not_on_whatsapp:
            # sendMessageWithTyping: `throw new BadRequestException(isWA)` ([I#2111], [I#2308]).
            return error(400, [{"jid": jid, "exists": False, "number": body["number"]}])
        message_id = "3EB0" + uuid.uuid4().hex[:16].upper()
        self.sent.append(message_id)
        return Reply(201, {
            "key": {"remoteJid": jid, "fromMe": True, "id": message_id},
            "pushName": "Você",
            "status": "PENDING",
            "message": {"conversation": body["text"]},
            "contextInfo": None,
            "messageType": "conversation",
            "messageTimestamp": int(time.time()),
            "instanceId": INSTANCE_ID,
            "source": "unknown",
        })

    # GET /instance/connect/{instance}: open → the connectionState object; close → starts the
    # Baileys session (`instance.connectToWhatsapp(number)`, state becomes connecting) and returns
    # `instance.qrCode`; connecting → `instance.qrCode` as it is, the number ignored. The pairing code
    # exists only when the session was started with a number ([R] instance.controller.ts
    # `connectToWhatsapp`; whatsapp.baileys.service.ts `connectionUpdate` → `requestPairingCode`,
    # getter `qrCode`).
    def _connect(self, req: Recorded) -> Reply:
        if self.state == "open":
            return Reply(200, {"instance": {"instanceName": self.instance, "state": "open"}})
        if self.state == "close":
            self.pairing_number = (req.query.get("number") or [None])[0]
            self.state = "connecting"
        return Reply(200, {"pairingCode": "WZYEH1YY" if self.pairing_number else None, "code": QR_CODE,
                           "base64": QR_BASE64, "count": 1})

    # GET /instance/connectionState/{instance} ([R] instance.controller.ts `connectionState`).
    def _connection_state(self, req: Recorded) -> Reply:
        return Reply(200, {"instance": {"instanceName": self.instance, "state": self.state}})

    # POST /webhook/set/{instance}: body wrapped in "webhook" ([I#1657]); stored as given
    # ([R] src/api/integrations/event/webhook/webhook.controller.ts `set`).
    def _webhook_set(self, req: Recorded) -> Reply:
        body = json.loads(req.body)
        if not isinstance(body, dict) or "webhook" not in body:
            return error(400, [['instance requires property "webhook"']])
        self.webhook = body["webhook"]
        return Reply(201, {"id": "cm0webhook", "url": self.webhook.get("url"), "headers": self.webhook.get("headers"),
                           "enabled": self.webhook.get("enabled"), "events": self.webhook.get("events"),
                           "webhookByEvents": self.webhook.get("byEvents"),
                           "webhookBase64": self.webhook.get("base64"), "instanceId": INSTANCE_ID})

    # POST /instance/create: global key only; a used name → 403 ([R] instance.guard.ts,
    # instance.controller.ts `createInstance`).
    def _create(self, req: Recorded) -> Reply:
        if req.header("apikey") != self.api_key:
            return error(401, "Unauthorized")
        body = json.loads(req.body)
        name = body.get("instanceName")
        if name == self.instance:
            return error(403, [f'This name "{name}" is already in use.'])
        webhook = body.get("webhook") or {}
        return Reply(201, {
            "instance": {"instanceName": name, "instanceId": INSTANCE_ID, "integration": body.get("integration"),
                         "webhookWaBusiness": None, "accessTokenWaBusiness": "", "status": "connecting"},
            "hash": self.instance_token,
            "webhook": {"webhookUrl": webhook.get("url"), "webhookHeaders": webhook.get("headers"),
                        "webhookByEvents": webhook.get("byEvents"), "webhookBase64": webhook.get("base64")},
            "websocket": {"enabled": False}, "rabbitmq": {"enabled": False}, "nats": {"enabled": False},
            "sqs": {"enabled": False},
            "settings": {"rejectCall": False, "msgCall": "", "groupsIgnore": body.get("groupsIgnore", False),
                         "alwaysOnline": False, "readMessages": False, "readStatus": False,
                         "syncFullHistory": False, "wavoipToken": ""},
            "qrcode": {"pairingCode": None, "code": QR_CODE, "base64": QR_BASE64, "count": 1},
        })


# ---------------------------------------------------------------------- webhooks Evolution sends


def mint_token(secret: str, *, iat: int | None = None, ttl: int = 600, **overrides: Any) -> str:
    """The Bearer token Evolution sends when the webhook has `headers.jwt_key`
    ([R] webhook.controller.ts `generateJwtToken`: `{iat, exp: iat + 600, app: 'evolution',
    action: 'webhook'}`, HS256)."""
    now = int(time.time()) if iat is None else iat
    claims: dict[str, Any] = {"iat": now, "exp": now + ttl, "app": "evolution", "action": "webhook"}
    claims.update(overrides)
    claims = {k: v for k, v in claims.items() if v is not None}
    return jwt.encode(claims, secret, algorithm="HS256")


def envelope(event: str, data: Any, *, instance: str = "clinica") -> dict[str, Any]:
    """[R] webhook.controller.ts `emit`: `{event, instance, data, destination, date_time, sender,
    server_url, apikey}`; `date_time` is local time mislabelled `Z` (channel.service.ts)."""
    return {
        "event": event,
        "instance": instance,
        "data": data,
        "destination": "https://lembra.example/webhooks/evolution/7",
        "date_time": "2026-12-01T09:00:00.000Z",
        "sender": "551633334444@s.whatsapp.net",
        "server_url": "http://localhost:8080",
        "apikey": None,
    }


def upsert(message: dict[str, Any], *, remote_jid: str = "5516999887766@s.whatsapp.net",
           message_id: str = "3A5F1C2B9D8E7F60A1B2", from_me: bool = False, timestamp: int = 1796126400,
           key_extra: dict[str, Any] | None = None, context_info: Any = None,
           message_type: str = "conversation") -> dict[str, Any]:
    """`messages.upsert` data = prepareMessage(received) + instanceId/source ([R]
    whatsapp.baileys.service.ts `messages.upsert` handler, `prepareMessage`). v2 flattens
    extendedTextMessage into `conversation` and lifts the content's contextInfo to the top."""
    return {
        "key": {"remoteJid": remote_jid, "fromMe": from_me, "id": message_id, **(key_extra or {})},
        "pushName": "Maria",
        "status": "DELIVERY_ACK",
        "message": message,
        "contextInfo": context_info,
        "messageType": message_type,
        "messageTimestamp": timestamp,
        "instanceId": INSTANCE_ID,
        "source": "android",
    }


def update(status: Any, *, key_id: str = "3EB0A1B2C3D4E5F60718", from_me: bool = True) -> dict[str, Any]:
    """`messages.update` data (v2): `{keyId, remoteJid, fromMe, participant, status, pollUpdates,
    instanceId, messageId}` — `keyId` is the WhatsApp id, `messageId` Evolution's DB row
    ([R] whatsapp.baileys.service.ts `messages.update` handler, src/utils/renderStatus.ts)."""
    return {
        "keyId": key_id,
        "remoteJid": "5516999887766@s.whatsapp.net",
        "fromMe": from_me,
        "participant": None,
        "status": status,
        "pollUpdates": None,
        "instanceId": INSTANCE_ID,
        "messageId": "cm4k2x0a50001qz8r7b6c5d4e",
    }


def connection(state: str, status_reason: int | None = None) -> dict[str, Any]:
    """`connection.update` data variants ([R] whatsapp.baileys.service.ts `connectionUpdate`)."""
    data: dict[str, Any] = {"instance": "clinica", "state": state, "statusReason": status_reason}
    if state == "open":
        data.update(wuid="551633334444@s.whatsapp.net", profileName="Clínica", profilePictureUrl=None)
    return data
