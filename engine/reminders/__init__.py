"""Reminders: rules, the sending window (quiet hours, Sundays, holidays), populating the queue from appointments and re-placing reminders when things change."""
