"""Meta WhatsApp Cloud API provider (official): `providers.meta.provider.MetaProvider`."""
