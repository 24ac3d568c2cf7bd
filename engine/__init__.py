"""Lembra's domain: the data model, the reminder and follow-up pipelines and their actors."""
