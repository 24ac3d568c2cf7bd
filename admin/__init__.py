"""The web side: Flask app factory, console pages, webhooks, health, and the `lembra` CLI."""
