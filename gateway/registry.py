"""Provider name → class, imported lazily so the gateway never imports a provider up front."""

from __future__ import annotations

import importlib
import threading

from gateway.contract import Provider

_PATHS: dict[str, str] = {
    "sandbox": "providers.sandbox.provider:SandboxProvider",
    "evolution": "providers.evolution.provider:EvolutionProvider",
    "meta": "providers.meta.provider:MetaProvider",
    "smtp": "providers.email.smtp:SmtpProvider",
    "resend": "providers.email.resend:ResendProvider",
    "twilio": "providers.sms.twilio:TwilioProvider",
    "zenvia": "providers.sms.zenvia:ZenviaProvider",
}
_loaded: dict[str, type[Provider]] = {}
_lock = threading.Lock()


class UnknownProvider(LookupError):
    """No provider is registered under that name, or its module is not installed."""


def names() -> list[str]:
    """Every registered provider name."""
    return sorted(_PATHS)


def register(name: str, target: str | type[Provider]) -> None:
    """Register a provider class, or a 'module:Class' path to import when first used."""
    with _lock:
        _loaded.pop(name, None)
        if isinstance(target, str):
            _PATHS[name] = target
        else:
            _PATHS[name] = f"{target.__module__}:{target.__qualname__}"
            _loaded[name] = target


def load(name: str) -> type[Provider]:
    """The provider class registered under `name`."""
    with _lock:
        if name in _loaded:
            return _loaded[name]
        path = _PATHS.get(name)
        if path is None:
            raise UnknownProvider(f"unknown provider {name!r}")
        module_name, _, attr = path.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError):
            raise UnknownProvider(f"provider {name!r} is not available") from None
        _loaded[name] = cls
        return cls
