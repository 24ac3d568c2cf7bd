"""The flows' side of the hooks `people` fires (engine.core.hooks): an appointment's change starts
or ends follow-ups (`triggers.on_appointment_event`), an opt-out from every channel ends the
contact's runs (`replies.on_opt_out`). Importing this module connects them; every process that
runs Lembra (the console, the CLI, the workers) imports it as it starts."""

from engine.flows import replies, triggers

__all__ = ["replies", "triggers"]
