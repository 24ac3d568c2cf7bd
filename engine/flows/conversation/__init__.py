"""Conversations a flow holds with a patient: the fields it may ask for, reading them out of
replies, and (built on them) the `ask` node."""
