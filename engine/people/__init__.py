"""The clinic's patients and their appointments: contacts and their consent, appointments, CSV imports."""
